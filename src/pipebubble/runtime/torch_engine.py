"""torch's own pipeline runtime as an engine: our order, torch's ``_PipelineScheduleRuntime``.

torchtitan trains through ``torch.distributed.pipelining``: each rank wraps its stages in
``PipelineStage`` and a schedule object walks a per-rank list of ``_Action`` s (``0F3``,
``1I2``, ``(0F7;7B3)OVERLAP_F_B``), adding the sends and receives itself
(``_add_send_recv``). Any pipebubble order is such a list: the compute-only CSV of
:mod:`pipebubble.interop.torch_csv` is its text, cell for cell. So

- :func:`torch_actions` turns a :class:`~pipebubble.ir.schedule.Schedule` into torch's
  compute-only actions, and :func:`torch_schedule` builds the torch schedule object that runs
  them on a user's own ``PipelineStage`` s (a registered schedule, ``auto``'s order, a
  planned one: torch's runtime never knows where the order came from);
- :class:`TorchWorker` is ``run --engine torch``: the rank's stages run through torch's
  runtime instead of our interpreter, and pipebubble still measures it. Every compute action
  is timed by wrapping the stage's ``forward_one_chunk`` / ``backward_one_chunk`` /
  ``backward_weight_one_chunk`` (and, on the last stage, the runtime's loss computation,
  which our F includes), so a receive's wait is *not* counted as compute, as in our
  runtime; the events form the same measured Timeline, report and gradient check.

What torch cannot run: several chains of stages (DualPipe's two model copies: torch knows one
chain, stage p would wait for stage p-1), refused with one line; and recomputation.

Memory in the Timeline: F counts the bytes autograd saves (parameters left out, as
:mod:`pipebubble.runtime.memory` does); B frees them; torch's I keeps the whole graph for its
W (``stage_backward_input`` retains it), so here I frees nothing and W frees all of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..errors import ParamError, UserError, param
from ..interop.torch_csv import cell_text
from ..ir.schedule import Overlap, Schedule, step_actions
from ..timeline import Event
from ..usercode import USER_FAILURES, UserCodeError, is_ours, layer_in
from .dist.worker import RankRun
from .memory import param_storages
from .train import stage_layers

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_ENGINE = param("engine")
_RECOMPUTE = param("recompute")


def check_engine(schedule: Schedule, recompute: bool = False) -> None:
    """Refuse, before any process starts, what torch's runtime cannot run."""
    if schedule.chains > 1:
        raise ParamError(f"{_ENGINE} torch: {schedule.name} runs {schedule.chains} chains of "
                         "stages (two model copies), which torch's runtime does not know (it "
                         "makes each stage wait for the one before); use dualpipev, or "
                         f"{_ENGINE} pipebubble")
    if recompute:
        raise ParamError(f"{_ENGINE} torch does not recompute activations; drop {_RECOMPUTE} or "
                         f"use {_ENGINE} pipebubble")


def torch_actions(schedule: Schedule) -> dict[int, list]:
    """Per rank, torch's compute-only ``_Action`` list for ``schedule`` (the CSV cells)."""
    from torch.distributed.pipelining.schedules import _Action

    check_engine(schedule)
    return {r: [_Action.from_str(cell_text(step)) for step in order]
            for r, order in enumerate(schedule.orders)}


def torch_schedule(stages: Sequence, schedule: Schedule, loss_fn: Callable | None = None,
                   *, scale_grads: bool = True):
    """A torch schedule object that runs ``schedule``'s order on this rank's ``stages``.

    ``stages``: this rank's ``torch.distributed.pipelining.PipelineStage`` objects (stage
    indices as in ``schedule``: with V placement rank r holds r and 2p-1-r). The object is a
    ``_PipelineScheduleRuntime``: call ``.step(x)`` on the first stage's rank,
    ``.step(target=y, losses=[])`` on the last one's, ``.step()`` elsewhere, then your
    optimizer. ``scale_grads`` (torch's meaning): divide gradients by the microbatch count,
    so that with a mean ``loss_fn`` they are the batch mean's.

    >>> # on each rank of a 2-rank group (see the README, "torch's engine"):
    >>> # sched = torch_schedule([PipelineStage(my_stage, rank, 2, device)],
    >>> #                        get_schedule("zb-h1", 2, 8), loss_fn)
    """
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    actions = torch_actions(schedule)
    stages = list(stages)
    if not stages:
        raise UserError("torch_schedule needs this rank's PipelineStage objects")
    rank = stages[0].group_rank
    held = sorted(s for s, r in enumerate(schedule.stage_to_rank) if r == rank)
    have = sorted(st.stage_index for st in stages)
    if have != held:
        raise UserError(f"rank {rank} holds stages {held} in {schedule.name}, but the "
                        f"PipelineStage objects given are stages {have}")
    if stages[0].num_stages != schedule.num_stages:
        raise UserError(f"{schedule.name} has {schedule.num_stages} stages, the "
                        f"PipelineStage objects {stages[0].num_stages}")
    runtime = _PipelineScheduleRuntime(stages, schedule.num_microbatches, loss_fn=loss_fn,
                                       scale_grads=scale_grads)
    runtime.pipeline_order = actions
    runtime._prepare_schedule_with_comms(actions)  # validates, places, adds sends/receives
    return runtime


class _SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Count the bytes autograd saves inside ``with`` (each tensor once, weights left out);
    unlike :class:`~pipebubble.runtime.memory.SavedTensors` it keeps no reference."""

    def __init__(self, exclude: set[int]):
        self.nbytes, self._seen, self._exclude = 0, set(), exclude
        super().__init__(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in self._exclude:
            key = (t.data_ptr(), t.nbytes)
            if key not in self._seen:
                self._seen.add(key)
                self.nbytes += t.nbytes
        return t


class TorchWorker(RankRun):
    """``run --engine torch`` on one rank: the run's set-up shared with our engine
    (:class:`~pipebubble.runtime.dist.worker.RankRun`: model, batch, groups, all-reduce,
    report), with torch's runtime running the pipeline pass (no wire program, no transport
    of ours: torch posts its own sends and receives)."""

    def __init__(self, cfg, cluster, built: tuple, measure: bool = True, ties: Sequence = ()):
        """``measure=False`` leaves torch's stages unwrapped (no events: for benchmarks of
        what the timing itself costs). ``ties``: as :class:`Worker`'s (tied weights' copies
        are summed after torch's pass, before the optimizer step, as with our engine)."""
        from torch.distributed.pipelining import PipelineStage

        super().__init__(cfg, cluster, built, ties=ties)
        check_engine(self.schedule)
        group = None
        if cfg.dp > 1:  # one pipeline group per replica; every process creates every group
            for d in range(cfg.dp):
                grp = dist.new_group([d * cfg.ranks + r for r in range(cfg.ranks)])
                if d == self.replica:
                    group = grp
        S = self.schedule.num_stages
        self.stages = [PipelineStage(mod, s, S, self.device, group=group)
                       for s, mod in sorted(self.modules.items())]
        if measure:
            for st in self.stages:
                self._time_stage(st)
        self.runtime = torch_schedule(self.stages, self.schedule, self._loss,
                                      scale_grads=False)
        if measure:
            self._time_loss()
        self._overlapped = {(a.stage, a.kind, a.microbatch)
                            for step in self.schedule.orders[self.rank]
                            if isinstance(step, Overlap) for a in step_actions(step)}
        self._exclude = param_storages(p for m in self.modules.values() for p in m.parameters())
        self._first = 0 in self.modules
        self._last = S - 1 in self.modules
        self._events: list[Event] = []
        self._held: dict[tuple[int, int], int] = {}
        self._origin = 0.0

    def set_batch(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().set_batch(x, y)
        self.global_n = x.shape[0]

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The microbatch's loss weighted by its share of the global batch (so the summed
        gradients are the batch mean's even when microbatches differ in size, as ours)."""
        return self.spec.loss_fn(output, target) * (target.shape[0] / self.global_n)

    # ---- timing: one Event per compute action -------------------------------------------
    def _record(self, s: int, kind: str, m: int, t0: float, t1: float, add: float,
                free: float) -> None:
        o = self._origin
        self._events.append(Event(self.rank, s, kind, m, t0 - o, t1 - o, add, free,
                                  (s, kind, m) in self._overlapped))
        self.watchdog.advance()

    def _time_stage(self, st) -> None:
        s = st.stage_index
        fwd, bwd, wgt = st.forward_one_chunk, st.backward_one_chunk, st.backward_weight_one_chunk

        def forward_one_chunk(mb, *args, **kwargs):
            self.watchdog.at(f"{s}F{mb} (compute, torch's runtime)", False)
            saved = _SavedBytes(self._exclude)
            t0 = time.perf_counter()
            with saved, self._user(s, "the forward", mb):
                out = fwd(mb, *args, **kwargs)
            self._held[s, mb] = saved.nbytes
            self._record(s, "F", mb, t0, time.perf_counter(), float(saved.nbytes), 0.0)
            return out

        def backward_one_chunk(mb, *args, full_backward=True, **kwargs):
            kind = "B" if full_backward else "I"
            self.watchdog.at(f"{s}{kind}{mb} (compute, torch's runtime)", False)
            t0 = time.perf_counter()
            with self._user(s, "the backward" if full_backward else
                            "the input-gradient backward (I)", mb):
                out = bwd(mb, *args, full_backward=full_backward, **kwargs)
            free = -float(self._held.pop((s, mb), 0)) if full_backward else 0.0
            self._record(s, kind, mb, t0, time.perf_counter(), 0.0, free)
            return out

        def backward_weight_one_chunk(mb, *args, **kwargs):
            self.watchdog.at(f"{s}W{mb} (compute, torch's runtime)", False)
            t0 = time.perf_counter()
            with self._user(s, "the weight-gradient backward (W)", mb):
                out = wgt(mb, *args, **kwargs)
            self._record(s, "W", mb, t0, time.perf_counter(), 0.0,
                         -float(self._held.pop((s, mb), 0)))
            return out

        st.forward_one_chunk = forward_one_chunk
        st.backward_one_chunk = backward_one_chunk
        st.backward_weight_one_chunk = backward_weight_one_chunk

    def _time_loss(self) -> None:
        """The last stage's F includes its loss (as in our interpreter): extend its event."""
        compute = self.runtime._maybe_compute_loss

        def _maybe_compute_loss(stage, output, target_mbs, mb_index, *args, **kwargs):
            out = compute(stage, output, target_mbs, mb_index, *args, **kwargs)
            if stage.is_last and self._events and self._events[-1].kind == "F":
                e = self._events[-1]
                self._events[-1] = e._replace(end=time.perf_counter() - self._origin)
            return out

        self.runtime._maybe_compute_loss = _maybe_compute_loss

    @contextmanager
    def _user(self, s: int, phase: str, mb: int) -> Iterator[None]:
        """A failure of the model's code inside torch's stage call, as our interpreter names
        it (torch wraps it in ``RuntimeError("[Stage s] failed to run forward ...")``: the
        cause is the model's exception, the layer is found on its traceback)."""
        try:
            yield
        except UserCodeError as exc:
            raise exc.at(stage=s, rank=self.rank) from exc.__cause__
        except UserError:
            raise
        except USER_FAILURES as exc:
            root = exc
            while root.__cause__ is not None:
                root = root.__cause__
            if isinstance(root, UserCodeError):
                raise root.at(stage=s, rank=self.rank) from None
            if is_ours(root):
                raise
            layers = stage_layers(self.modules[s])
            i = layer_in(root, layers)
            what = (f"layer {i} of stage {s} ({type(layers[i]).__name__})" if i is not None
                    else f"the layers of stage {s}")
            err = UserCodeError(root, what, during=f"{phase} of microbatch {mb}", stage=s,
                                rank=self.rank)
            err.layer = i
            raise err from root

    # ---- one step ------------------------------------------------------------------------
    def step(self, index: int, gather: bool = True, update=None, params: bool = False):
        """One pipeline pass through torch's runtime, then the shared gradient completion,
        update and gathering (``RankRun._finish_step``; see ``Worker.step``)."""
        for mod in self.modules.values():
            mod.zero_grad(set_to_none=True)
        wd = self.watchdog
        if gather:
            wd.at(f"step {index} start barrier", True)
            dist.barrier()
        self._events, self._held = [], {}
        self._origin = origin = time.perf_counter()
        kwargs: dict = {}
        args: tuple = ()
        if self._first:
            args = (torch.cat(self.xs),)
        losses: list = []
        if self._last:
            kwargs = {"target": torch.cat(self.ys), "losses": losses}
        wd.at(f"step {index}: torch's runtime (sends and receives)", True)
        quiet = logging.getLogger("torch.distributed.pipelining.schedules")
        level, quiet.level = quiet.level, logging.CRITICAL  # its failure table: ours is 1 line
        try:
            self.runtime.step(*args, **kwargs)
        except UserCodeError as exc:  # the loss (its stage is the last)
            raise exc.at(stage=self.schedule.num_stages - 1, rank=self.rank) from exc.__cause__
        finally:
            quiet.level = level
        by_mb = {m: float(v.detach()) for m, v in enumerate(losses)}
        return self._finish_step(index, gather, update, params, origin, list(self._events),
                                 by_mb, 0, _peak(self._events), {})


def _peak(events: list[Event]) -> int:
    """The most activation bytes held at once (F adds at its start, the frees at the end)."""
    held = peak = 0.0
    for e in sorted(events, key=lambda e: e.start):
        held += e.mem_start
        peak = max(peak, held)
        held += e.mem_end
    return int(peak)

