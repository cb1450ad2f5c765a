"""A run's training plan: steps, optimizer, learning rate, checkpoint to save or resume,
checked once before any work and shared by every engine.

:func:`plan_training` validates a :class:`~pipebubble.runtime.setup.RunConfig`'s training
fields (and a checkpoint to resume, against the model) in the launcher, in a local run and
in every torchrun worker alike, before any process group exists, so bad input is one line
and exit 2 everywhere. The loops are :class:`~pipebubble.runtime.run.Run`'s (local) and the
distributed workers'; the pieces they call (optimizers, batches, names, the reference) are
:mod:`pipebubble.runtime.train` and :mod:`pipebubble.runtime.checkpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from . import checkpoint as ckpt
from .train import (
    ReferenceTrainer,
    check_training,
    layer_names,
    make_optimizer,
    max_param_diff,
    model_parameter_shapes,
    named_stage_parameters,
    step_batch,
)


@dataclass
class TrainPlan:
    """What the training loop runs: steps ``start .. start + steps - 1``."""

    steps: int
    optimizer: str
    lr: float
    start: int  # the first step's index (the checkpoint's steps_done when resuming)
    names: list[str]  # the model's own name of each layer
    shapes: dict[str, tuple[int, ...]]  # every parameter of the model, by name
    save: str | None = None
    resume: str | None = None
    prior_losses: list[float] = field(default_factory=list)  # the checkpoint's losses
    resume_meta: dict | None = None  # the checkpoint's pipebubble.json, checked
    notes: list[str] = field(default_factory=list)  # warnings to print once, before training
    save_error: ckpt.SaveError | None = None  # why the save failed (the results still stand)

    @property
    def steps_range(self) -> range:
        return range(self.start, self.start + self.steps)


def plan_training(cfg, setup) -> TrainPlan:
    """Check ``cfg``'s training fields (a :class:`~pipebubble.runtime.setup.RunConfig`)
    against the model of ``setup``; UserError on bad input.

    ``--save DIR`` is checked here, before the first step (:func:`ckpt.check_save_dir`);
    ``--resume DIR`` is read and checked whole (:func:`ckpt.read_meta`) and matched to the
    model. Resuming without ``--lr`` continues at the checkpoint's learning rate; an ``--lr``
    that differs from it is used, with a warning in ``plan.notes`` (the losses then differ
    from an uninterrupted run's)."""
    lr = check_training(cfg.steps, cfg.optimizer, cfg.lr)
    layers = list(setup.spec.layers)
    names = layer_names(setup.spec, len(layers))
    shapes = model_parameter_shapes(layers, names)
    plan = TrainPlan(cfg.steps, cfg.optimizer, lr, 0, names, shapes)
    if cfg.save is not None:
        ckpt.check_save_dir(cfg.save, overwrite=cfg.overwrite)
        plan.save = cfg.save
    if cfg.resume is not None:
        meta = ckpt.read_meta(cfg.resume)
        ckpt.check_compatible(cfg.resume, meta, shapes, cfg.optimizer, cfg.seed)
        plan.resume, plan.start, plan.resume_meta = cfg.resume, meta["steps_done"], meta
        plan.prior_losses = [float("nan") if v is None else float(v)
                             for v in meta.get("losses", [])]
        theirs = meta.get("lr")
        if theirs is not None and cfg.lr is None:
            plan.lr = float(theirs)
        elif theirs is not None and float(theirs) != plan.lr:
            plan.notes.append(f"--resume {cfg.resume}: the checkpoint was trained with --lr "
                              f"{theirs:g}; this run steps with --lr {plan.lr:g} (the "
                              "optimizer state is kept; the losses will differ from an "
                              "uninterrupted run's)")
    return plan


def first_layers(setup) -> list[int]:
    """Index of the first layer of each stage of one model copy."""
    return [0, *setup.boundaries]


def named_parameters_of(setup, modules: dict[int, nn.Module]) -> list[tuple[str, nn.Parameter]]:
    """(model-wide name, parameter) of every stage in ``modules`` (stage index -> module);
    stage s of a later chain (DualPipe's copy) holds model stage ``s mod`` stages-per-chain."""
    starts = first_layers(setup)
    per = len(starts)
    out = []
    for s, mod in sorted(modules.items()):
        out += named_stage_parameters(mod, starts[s % per], setup_names(setup))
    return out


def setup_names(setup) -> list[str]:
    return layer_names(setup.spec, len(setup.spec.layers))


def reference_named(setup) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the unsplit reference model (``setup.reference``)."""
    names = setup_names(setup)
    return [(f"{names[i]}.{pn}", p) for i, layer in enumerate(setup.reference)
            for pn, p in layer.named_parameters()]


def batch_of(setup, step: int, dp: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (``dp`` x the pipeline batch), the same in every process:
    the run's one seeding (:func:`~pipebubble.runtime.train.step_batch`)."""
    return step_batch(setup.spec.make_batch, dp * setup.batch_size, setup.seed, step,
                      setup.device)


def make_reference(setup, plan: TrainPlan) -> ReferenceTrainer | None:
    if setup.reference is None:
        return None
    ref = ReferenceTrainer(setup.reference, setup.spec.loss_fn, plan.optimizer, plan.lr)
    if plan.resume:
        load_into(plan, reference_named(setup), ref.opt)
    return ref


def load_into(plan: TrainPlan, named: list[tuple[str, nn.Parameter]],
              opt: torch.optim.Optimizer, rows: dict[int, tuple[int, int]] | None = None
              ) -> None:
    """Load the checkpoint's values of ``named`` (and their optimizer state) in place.
    Each process reads only its own keys (no collective): ``no_dist`` DCP loading.

    ``rows``: ``id`` -> (first row, rows of the whole tensor) of the parameters this process
    holds some rows of (``run --ep`` on a HuggingFace MoE: :func:`pipebubble.runtime.ep.
    row_shards`); the checkpoint holds them whole, so they are read whole and their own
    rows kept."""
    state = ckpt.rank_state(named, opt, plan.optimizer, for_load=True)
    parts = _row_keys(named, rows or {}, plan.optimizer, state)
    for key, _, (_, total) in parts:
        state[key] = state[key].new_zeros((total, *state[key].shape[1:]))
    ckpt.load(str(plan.resume), state, meta=plan.resume_meta, no_dist=True)
    for key, p, (start, _) in parts:
        own = state[key][start:start + p.shape[0]].clone()
        if key.startswith("model."):
            p.data.copy_(own)
        state[key] = own
    ckpt.install_optimizer_state(named, opt, plan.optimizer, state)


def _row_keys(named: list[tuple[str, nn.Parameter]], rows: dict[int, tuple[int, int]],
              optimizer: str, state: dict[str, torch.Tensor]
              ) -> list[tuple[str, nn.Parameter, tuple[int, int]]]:
    """(state key, parameter, (first row, rows in all)) of each entry of ``state`` holding
    a parameter's rows (its value, and its optimizer state but the step count)."""
    keys = [k for k in ckpt.OPTIMIZER_STATE[optimizer] if k != "step"]
    return [(key, p, rows[id(p)]) for name, p in named if id(p) in rows
            for key in (f"model.{name}", *(f"optim.{name}.{k}" for k in keys))
            if key in state]


def save_from(plan: TrainPlan, setup, named: list[tuple[str, nn.Parameter]],
              opt: torch.optim.Optimizer, losses: list[float], *, coordinator: bool = True,
              barrier=lambda: None, rows: dict[int, tuple[int, int]] | None = None,
              gather=None) -> None:
    """Write the checkpoint after the last step (collective over the default group).

    A save that fails does not end the run: ``plan.save_error`` says why (the previous
    checkpoint is unchanged), ``saved_to`` becomes null, and the run still reports the
    losses it computed, then exits 1. ``rows`` (as for :func:`load_into`) and ``gather(p,
    part)`` (the whole tensor from every holder's rows, collective): such parameters and
    their optimizer state are saved whole, so the checkpoint is the unsplit model's."""
    meta = ckpt.checkpoint_meta(
        model=setup.spec.name, description=setup.description, shapes=plan.shapes,
        steps_done=plan.start + plan.steps, seed=setup.seed, optimizer=plan.optimizer,
        lr=plan.lr, schedule=setup.schedule.name, boundaries=setup.boundaries,
        batch=setup.batch_size, losses=[*plan.prior_losses, *losses])
    hf_config = (setup.spec.metadata or {}).get("hf_config")
    if hf_config is not None:  # an hf: model: export-hf rebuilds it from this
        meta["hf_config"] = hf_config
    state = ckpt.rank_state(named, opt, plan.optimizer)
    for key, p, _ in _row_keys(named, rows or {}, plan.optimizer, state):
        state[key] = gather(p, state[key])  # the same keys in the same order on every holder
    try:
        ckpt.save(plan.save, state, meta, coordinator=coordinator, barrier=barrier)
    except ckpt.SaveError as exc:
        plan.save_error = exc


def param_diff(named: list[tuple[str, nn.Parameter]], ref: list[tuple[str, nn.Parameter]]
               ) -> float:
    """Largest |pipeline parameter - reference parameter|, matched by name."""
    theirs = dict(ref)
    return max_param_diff((p, theirs[n]) for n, p in named)


def optimizer_for(plan: TrainPlan, named: list[tuple[str, nn.Parameter]]
                  ) -> torch.optim.Optimizer:
    return make_optimizer(plan.optimizer, (p for _, p in named), plan.lr)


def train_summary(plan: TrainPlan) -> dict:
    """The ``train`` object of ``--json``."""
    return {"steps": plan.steps, "first_step": plan.start, "optimizer": plan.optimizer,
            "lr": plan.lr, "saved_to": None if plan.save_error else plan.save,
            "resumed_from": plan.resume,
            **({"save_error": str(plan.save_error)} if plan.save_error else {})}


def grad_and_loss_diff(named: list[tuple[str, nn.Parameter]],
                       ref: list[tuple[str, nn.Parameter]], loss: float, ref_loss: float
                       ) -> tuple[float, float]:
    """(largest |gradient difference|, |loss difference|) against the reference, by name."""
    theirs = dict(ref)

    def grad(p: nn.Parameter) -> torch.Tensor:
        return p.grad if p.grad is not None else torch.zeros_like(p)

    worst = max_param_diff((grad(p), grad(theirs[n])) for n, p in named)
    return worst, abs(loss - ref_loss)
