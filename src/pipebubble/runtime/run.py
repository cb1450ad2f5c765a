"""One run, one owner: :class:`RunConfig` in, :class:`Run` does set-up, step, train, report.

Every way of running a schedule on a model starts here: ``run --local`` trains with
:meth:`Run.train`; each distributed worker (our launcher, torchrun) builds the same
:class:`Run` from the same config and hands its set-up to its engine
(:meth:`Run.worker`: our interpreter, or torch's runtime); the self-check builds its
workers through the same cut rule. The command line only turns flags into a
:class:`RunConfig` and prints what comes back.

>>> from pipebubble import get_schedule
>>> run = Run(RunConfig(get_schedule("1f1b", 2, 2), model_args={"layers": 3, "width": 4},
...                     check=True, dtype="float64", repeat=1, warmup=0))
>>> run.setup.boundaries, run.setup.cut_by        # 3 equal blocks: the lighter stage first
([1], 'FLOPs')
>>> trained = run.train()
>>> trained.grad_diff < 1e-6 and run.verdict(trained).passed   # the unsplit model agrees
True

(Calibrating the simulator from the measured timeline, the "measured vs predicted" part of
a report, is the planner's: :mod:`pipebubble.plan.calibrate`, one layer up.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .setup import RunConfig, RunSetup, set_up
from .trainplan import (
    TrainPlan,
    batch_of,
    grad_and_loss_diff,
    load_into,
    make_reference,
    named_parameters_of,
    optimizer_for,
    param_diff,
    plan_training,
    reference_named,
    save_from,
    train_summary,
)

__all__ = ["RanksTrained", "Run", "RunConfig", "RunSetup", "Trained", "set_up"]


@dataclass
class Trained:
    """What :meth:`Run.train` measured and computed.

    ``best``: per variant (plain, then with recomputation) the fastest measured pipeline
    pass over all steps (a :class:`~pipebubble.runtime.local.LocalResult`); ``step_times``:
    per variant every measured pass; ``losses``: each step's loss; with the check, the unsplit
    model's losses, the last step's largest gradient and loss differences, the largest
    parameter difference after the last update, and the scales they are relative to."""

    best: list
    step_times: list[list[float]]
    losses: list[float]
    summary: dict
    grad_diff: float | None = None
    loss_diff: float | None = None
    reference_losses: list[float] | None = None
    param_diff: float | None = None
    grad_scale: float | None = None
    param_scale: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class RanksTrained:
    """What :meth:`Run.train_ranks` gathered on rank 0 (empty elsewhere): the fastest
    measured pass's per-rank results, every pass's span, each step's loss, the last step's
    results (gradients and updated parameters for the check), the unsplit model's last
    (loss, gradients per stage) and its losses."""

    results: list | None = None
    spans: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    final: list | None = None
    last_reference: tuple | None = None
    reference_losses: list[float] | None = None
    summary: dict = field(default_factory=dict)


class Run:
    """A run of ``cfg``: :attr:`setup` (model, cut, stages, batch, reference) and
    :attr:`plan` (steps, optimizer, checkpoint), both checked before any work.

    ``reference``: keep the unsplit model for the check (default ``cfg.check``; a
    distributed run keeps it on rank 0 only)."""

    def __init__(self, cfg: RunConfig, reference: bool | None = None):
        self.cfg = cfg
        with self.dtype():
            self.setup: RunSetup = set_up(cfg, cfg.check if reference is None else reference)
        self.plan: TrainPlan = plan_training(cfg, self.setup)

    @contextmanager
    def dtype(self) -> Iterator[None]:
        """torch's default dtype is ``cfg.dtype`` inside (the model, its batches, the
        reference), as it was outside after."""
        before = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, self.cfg.dtype))
        try:
            yield
        finally:
            torch.set_default_dtype(before)

    # ---- set-up --------------------------------------------------------------------------
    def batch(self, step: int, dp: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s global batch (``dp`` x the pipeline batch), the same in every
        process: the run's one seeding (:func:`~pipebubble.runtime.train.step_batch`)."""
        return batch_of(self.setup, step, dp)

    def worker(self, dist_cfg, cluster, x: torch.Tensor, y: torch.Tensor):
        """This process's rank of a distributed run on ``cluster``, for ``cfg.engine``: our
        stage interpreter (:class:`~pipebubble.runtime.dist.worker.Worker`) or torch's
        runtime (:class:`~pipebubble.runtime.torch_engine.TorchWorker`), both over this
        set-up and the global batch ``x``, ``y``."""
        s = self.setup
        built = (s.schedule, s.spec, s.stages, x, y)
        if self.cfg.engine == "torch":
            from .torch_engine import TorchWorker

            return TorchWorker(dist_cfg, cluster, built, ties=s.ties)
        from .dist.worker import Worker

        return Worker(dist_cfg, cluster, built, recompute=self.cfg.recompute, ties=s.ties)

    def reference_stages(self) -> list:
        """The unsplit reference model cut as the pipeline is (its stages share the
        reference's weights)."""
        from .stages import split_stages

        s = self.setup
        if s.reference is None:
            raise ValueError("Run(reference=True) keeps the unsplit model")  # a caller's bug
        return split_stages(list(s.reference), self.cfg.num_stages, s.boundaries)

    def reference_gradients(self, x: torch.Tensor, y: torch.Tensor
                            ) -> tuple[float, dict[int, list[torch.Tensor]]]:
        """The unsplit model on the whole batch ``x``, ``y``: its loss and each stage's
        gradients (what every pipeline rank's gradients are checked against)."""
        from .dist.worker import unsplit_gradients

        return unsplit_gradients(self.reference_stages(), self.setup.spec.loss_fn, x, y)

    # ---- one step ------------------------------------------------------------------------
    def step(self, recompute: Sequence[bool] = (False,), warmup: int = 0, repeat: int = 1,
             step_times: list[list[float]] | None = None) -> list:
        """One pipeline step in this process (the local executor) on the current batch, per
        entry of ``recompute``: the fastest of ``repeat`` measured passes.

        The variants take turns (warm-up passes first), so that a busy spell on a shared
        machine slows them alike. Gradients are zeroed before each pass, so afterwards they
        are those of one pass of the last variant (every pass computes the same gradients:
        the weights do not change; a tied weight's copies hold their sum). ``step_times``,
        if given, receives every measured pass's step time of each variant."""
        from .local import run_local
        from .tied import sum_tied_gradients

        s = self.setup
        best: list = [None] * len(recompute)
        if step_times is not None:
            step_times[:] = [[] for _ in recompute]
        for i in range(warmup + repeat):
            for k, rec in enumerate(recompute):
                for st in s.stages:
                    st.zero_grad(set_to_none=True)
                result = run_local(s.schedule, s.stages, s.inputs, s.targets, s.spec.loss_fn,
                                   recompute=rec, device=s.device)
                if s.ties:  # tied weights: each copy gets the sum over the copies
                    sum_tied_gradients(dict(enumerate(s.stages)), s.ties)
                if i >= warmup and step_times is not None:
                    step_times[k].append(result.timeline.step_time)
                if i >= warmup and (best[k] is None
                                    or result.timeline.step_time < best[k].timeline.step_time):
                    best[k] = result
        return best

    # ---- training ------------------------------------------------------------------------
    def train(self, variants: Sequence[bool] = (False,)) -> Trained:
        """The local training loop: for each step its batch, ``cfg.repeat`` measured
        pipeline passes (``cfg.warmup`` unmeasured ones before the first), the optimizer
        step; with a reference, the unsplit model trained alongside on the same batches.
        The checkpoint, when asked, is written after the last step (a failure is
        ``plan.save_error``: the figures still stand)."""
        with self.dtype():
            return self._train(variants)

    def _train(self, variants: Sequence[bool]) -> Trained:
        from .check import max_abs
        from .failures import reference_code, training_step

        s, plan, cfg = self.setup, self.plan, self.cfg
        named = named_parameters_of(s, dict(enumerate(s.stages)))
        opt = optimizer_for(plan, named)
        if plan.resume:
            load_into(plan, named, opt)
        ref = make_reference(s, plan)
        best: list = [None] * len(variants)
        times: list[list[float]] = [[] for _ in variants]
        losses: list[float] = []
        out = Trained(best, times, losses, {})
        for k in plan.steps_range:
            with training_step(s, k):  # the model's failure: its layer, stage, rank, step
                s.inputs, s.targets = self.batch(k)
                per: list[list[float]] = []
                got = self.step(variants, cfg.warmup if k == plan.start else 0, cfg.repeat,
                                per)
            for v, res in enumerate(got):
                times[v] += per[v]
                if best[v] is None or res.timeline.step_time < best[v].timeline.step_time:
                    best[v] = res
            losses.append(got[-1].loss)
            if ref is not None:  # the gradients of this step, on both sides, before updating
                with reference_code(s, k):
                    ref_loss = ref.gradients(s.inputs, s.targets)
                out.grad_diff, out.loss_diff = grad_and_loss_diff(
                    named, reference_named(s), got[-1].loss, ref_loss)
                out.grad_scale = max_abs(p.grad for p in s.reference.parameters())
                ref.step()
            opt.step()
        if plan.save:
            save_from(plan, s, named, opt, losses)
        out.summary = train_summary(plan)
        if ref is not None:
            out.reference_losses = list(ref.losses)
            out.param_diff = param_diff(named, reference_named(s))
            out.param_scale = max_abs(s.reference.parameters())
        return out

    def train_ranks(self, worker, dp: int = 1, coordinator: bool = True) -> RanksTrained:
        """The training loop of one process of a distributed run: ``worker`` (from
        :meth:`worker`) runs each step's passes (``cfg.warmup`` unmeasured ones before the
        first, ``cfg.repeat`` measured) and the optimizer step after the last; rank 0
        (``coordinator``) keeps the fastest gathered pass, every pass's span and each step's
        loss, and with a reference trains the unsplit model on the same global batches.
        The checkpoint, when asked, is written by every rank (collective) after the last
        step."""
        import torch.distributed as dist

        from .dist.report import step_span
        from .failures import reference_code, training_step

        s, plan, cfg = self.setup, self.plan, self.cfg
        named = named_parameters_of(s, worker.modules)
        opt = optimizer_for(plan, named)
        rows = getattr(worker, "row_shards", {})  # --ep: HF fused experts' own rows
        if plan.resume:
            load_into(plan, named, opt, rows)
        ref = make_reference(s, plan)  # rank 0 with the check
        out = RanksTrained()
        best, i = float("inf"), 0
        for k in plan.steps_range:
            if k != plan.start:
                with training_step(s, k):  # make_batch of step k
                    worker.set_batch(*self.batch(k, dp))
            passes = (cfg.warmup if k == plan.start else 0) + cfg.repeat
            for j in range(passes):
                last = j == passes - 1
                with training_step(s, k):  # the model's failure: layer, stage, rank, step
                    got = worker.step(i, gather=j >= passes - cfg.repeat,
                                      update=opt.step if last else None,
                                      params=last and k == plan.steps_range[-1])
                i += 1
                if got is not None:  # rank 0: keep the fastest measured step, and every span
                    t = step_span(got)
                    out.spans.append(t)
                    if t < best:
                        out.results, best = got, t
                    if last:
                        out.losses.append(sum(v for r in got if r is not None
                                              for v in r.losses.values()))
                        out.final = got
            if ref is not None:  # the unsplit model, same batch, same optimizer
                worker.watchdog.at(f"rank 0: reference step {k}", False)
                xg, yg = self.batch(k, dp)
                with reference_code(s, k):
                    out.last_reference = self.reference_gradients(xg, yg)
                ref.losses.append(out.last_reference[0])
                ref.step()
        if plan.save:
            worker.watchdog.at(f"saving the checkpoint to {plan.save}", True)
            save_from(plan, s, named, opt, out.losses, coordinator=coordinator,
                      barrier=dist.barrier, rows=rows, gather=getattr(worker, "gather_rows",
                                                                      None))
        out.summary = train_summary(plan)
        if ref is not None:
            out.reference_losses = list(ref.losses)
        return out

    # ---- report --------------------------------------------------------------------------
    def verdict(self, trained: Trained | None = None, *, losses: Sequence[float] = (),
                reference_losses: Sequence[float] | None = None,
                loss_diff: float | None = None, grad_diff: float | None = None,
                grad_scale: float | None = None, param_diff: float | None = None,
                param_scale: float | None = None):
        """The check's verdict (:func:`pipebubble.runtime.check.verdict`: relative
        differences against a tolerance by dtype, or ``cfg.check_tol``), from ``trained``
        or from the figures a distributed run gathered."""
        if trained is not None:
            losses, reference_losses = trained.losses, trained.reference_losses
            loss_diff, grad_diff, grad_scale = (trained.loss_diff, trained.grad_diff,
                                                trained.grad_scale)
            param_diff, param_scale = trained.param_diff, trained.param_scale
        return check_verdict(self.cfg.dtype, self.cfg.check_tol, losses, reference_losses,
                             loss_diff, grad_diff, grad_scale, param_diff, param_scale)


def check_verdict(dtype: str, tol: float | None, losses: Sequence[float],
                  reference_losses: Sequence[float] | None, loss_diff: float | None,
                  grad_diff: float | None, grad_scale: float | None,
                  param_diff: float | None, param_scale: float | None):
    """The check's verdict from its figures: the losses relative to the reference's (or
    the last loss difference), gradients and parameters relative to their scales, each
    against the dtype's tolerance or ``tol`` (:func:`pipebubble.runtime.check.verdict`)."""
    from .check import loss_relative, relative, verdict

    loss = (loss_relative(list(losses), list(reference_losses))
            if reference_losses and losses else loss_diff)
    return verdict({"gradients": relative(grad_diff, grad_scale), "loss": loss,
                    "parameters": relative(param_diff, param_scale)}, dtype, tol)
