"""What a run is, and its set-up: :class:`RunConfig` in, :class:`RunSetup` out.

A :class:`RunConfig` is a plain value: the schedule, the model and its cut, the batch and
its seed, training, checking, the engine and the device (the command line builds one from
its flags, ``commands/run.py``; a script builds one directly). :func:`set_up` turns it into
what every engine runs: the model built and cut into stages (one rule:
:func:`~pipebubble.runtime.cut.choose_cut`), tied weights found, step 0's batch (one
seeding: :func:`~pipebubble.runtime.train.step_batch`) and, for a check, the unsplit model.
Every process of a distributed run calls it with the same config and gets the same set-up.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ParamError, UserError, param
from ..ir.schedule import Schedule, validate
from ..models import ModelSpec, build_model

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_BATCH = param("batch")
_CHECK = param("check")
_CHECK_DROPOUT = param("check_dropout")
_ENGINE = param("engine")
_EP = param("ep")
_MICROBATCHES = param("microbatches")
_MODEL = param("model")


@dataclass
class RunConfig:
    """One run, in the library's words.

    ``schedule``: the order to run (a family's, ``auto``'s, a CSV's: built by the caller).
    ``model``: a built-in name (``mlp``, ``transformer``, ``moe``, ``sleep``) or a spec
    (``file.py:NAME``, ``package.module:NAME``, ``hf:PATH``); ``model_args``: a built-in's
    sizes (``layers``, ``width``, ``heads``, ``vocab``; the sleep model's seconds ``f``,
    ``b``, ``w``) or a user model's keyword arguments; ``seq``: the sequence length of a
    language model. ``boundaries``: the cut (the first
    layer of every stage after the first), or None for the balanced default. ``batch``:
    samples per step and replica (default 8 per microbatch). ``seed``: weights and batches.
    ``dp``: data-parallel replicas; ``engine``: ``pipebubble`` or ``torch``.
    """

    schedule: Schedule
    model: str = "mlp"
    model_args: dict = field(default_factory=dict)
    seq: int = 32
    input_shape: object = None  # an nn.Sequential model's input shape (user models)
    input_dtype: str | None = None
    boundaries: list[int] | None = None
    batch: int | None = None
    seed: int = 0
    data: str | None = None  # a token file: the batches, in order (runtime.data)
    data_dtype: str = "uint16"
    steps: int = 1
    optimizer: str = "adamw"
    lr: float | None = None  # None: the optimizer's default, or the resumed checkpoint's
    save: str | None = None  # a checkpoint folder written after the last step
    overwrite: bool = False
    resume: str | None = None  # a checkpoint folder to start from (any cut or schedule)
    dp: int = 1
    ep: int = 1  # expert parallelism: experts spread over ep of a stage's dp replicas
    engine: str = "pipebubble"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 1
    warmup: int = 1  # unmeasured passes before the first measured one
    repeat: int = 1  # measured passes of each step (the fastest is reported)
    recompute: bool = False
    check: bool = False  # train the unsplit model alongside and compare
    check_tol: float | None = None
    check_dropout: str = "keep"  # keep: refuse random layers under check; off: rates to 0

    @property
    def num_stages(self) -> int:
        """Stages of one model copy (DualPipe's second chain runs a copy)."""
        return self.schedule.num_stages // self.schedule.chains


@dataclass
class RunSetup:
    """What a run needs: the schedule, the model cut into stages, one batch."""

    schedule: Schedule
    spec: ModelSpec
    stages: list[nn.Module]
    boundaries: list[int]
    inputs: torch.Tensor
    targets: torch.Tensor
    device: torch.device
    reference: nn.Module | None = None  # the unsplit model, same weights (for --check)
    description: str = ""
    batch_size: int = 0  # samples per pipeline step (one replica)
    seed: int = 0  # weights and data seed (step k's batch: runtime.train.step_generator)
    ties: list = field(default_factory=list)  # tied weights' copies (runtime.tied.StageTie)
    cut_by: str = "given"  # what chose ``boundaries`` (runtime.cut.BY)

    @property
    def cut(self) -> str:
        """``cut --boundaries 4 (balanced by FLOPs)``: the cut and what chose it."""
        from .cut import Cut

        return Cut(list(self.boundaries), self.cut_by).describe()


def set_up(cfg: RunConfig, reference: bool = False) -> RunSetup:
    """``cfg`` -> the model built, cut into stages, step 0's batch (see the module
    docstring). ``reference``: keep the unsplit model, same weights, for the check.
    Raises UserError naming a bad value."""
    from ..models.loader import is_builtin, load_model
    from .cut import choose_cut
    from .train import step_batch

    schedule = cfg.schedule
    validate(schedule)
    S, M = cfg.num_stages, schedule.total_microbatches
    a = cfg.model_args
    user = not is_builtin(cfg.model)
    if user:  # checked once cut, below
        spec = load_model(cfg.model, a, seed=cfg.seed, seq=cfg.seq, input_shape=cfg.input_shape,
                          input_dtype=cfg.input_dtype, check=False)
        what = spec.description or spec.name
    else:
        spec, what = _builtin(cfg.model, a, S, cfg.seed, cfg.seq)
    if user:  # one forward of a tiny batch checks the model and counts its FLOPs
        cut = _checked_cut(spec, S, cfg.boundaries)
    else:
        cut = choose_cut(spec.layers, S, cfg.boundaries, spec.make_batch)
    what += _check_random_layers(cfg, spec)
    batch = cfg.batch or 8 * M
    if batch < M:
        raise ParamError(f"{_BATCH} {batch} is smaller than {_MICROBATCHES} {M}; use at least {M}")
    _check_ep(cfg, spec)
    if cfg.data:  # the batches are the file's tokens
        from .data import use_data

        spec = use_data(spec, cfg.data, batch, cfg.dp, cfg.model, cfg.data_dtype)
        what += f", data {cfg.data}"
    device = torch.device(cfg.device)
    ties, ref, stages = _cut_tied(spec, S, cut.boundaries, reference)
    ref = ref.to(device) if ref is not None else None
    stages = [s.to(device) for s in stages]
    x, y = step_batch(spec.make_batch, batch, cfg.seed, 0, device)  # the one seeding
    return RunSetup(schedule, spec, stages, cut.boundaries, x, y, device, ref,
                    f"{what}, batch {batch}", batch, cfg.seed, ties, cut.by)


def _checked_cut(spec: ModelSpec, S: int, boundaries: list[int] | None):
    """A user model's cut: its up-front check (:func:`~pipebubble.models.loader.check_layers`,
    one forward of 2 samples) counts each layer's FLOPs on the way, so the model's code runs
    no extra time; a layer that fails is named with the stages of the cut it would have."""
    from ..models.loader import check_layers
    from .cut import CountFlops, check_stage_count, choose_cut

    check_stage_count(len(spec.layers), S)
    counter = CountFlops(spec.layers)
    try:
        with counter:
            check_layers(spec)
    except UserError as exc:
        try:  # again, with the stages: the message says which two the layer lies between
            check_layers(spec, choose_cut(spec.layers, S, boundaries, flops=[1.0] *
                                          len(spec.layers)).boundaries)
        except UserError:
            raise
        raise exc from None
    return choose_cut(spec.layers, S, boundaries, flops=counter.flops)


def _builtin(model: str, a: dict, S: int, seed: int, seq: int) -> tuple[ModelSpec, str]:
    """A built-in model sized by ``a`` (defaults: 2 layers per stage, the transformer's
    embedding and head counted) and its one-line description."""
    if model == "sleep":
        layers = a.get("layers") or S
        f, b, w = a.get("f", 0.01), a.get("b", 0.02), a.get("w", 0.01)
        spec = build_model("sleep", layers=layers, width=a.get("width") or 8, f=f, b=b, w=w,
                           seed=seed)
        return spec, f"sleep ({layers} layers: F {f} s, B {b} s, W {w} s)"
    if model == "mlp":
        layers, width = a.get("layers") or 2 * S, a.get("width") or 256
        spec = build_model("mlp", layers=layers, width=width, seed=seed)
        return spec, f"mlp ({layers} blocks, width {width})"
    layers = a.get("layers") or max(1, 2 * S - 2)
    heads, vocab = a.get("heads", 4), a.get("vocab", 4096)
    if model == "moe":
        spec = build_model("moe", layers=layers, dim=a.get("width") or 32, heads=heads,
                           vocab=vocab, seq=seq, seed=seed)
        return spec, spec.description
    dim = a.get("width") or 64
    spec = build_model("transformer", layers=layers, dim=dim, heads=heads, vocab=vocab, seq=seq,
                       seed=seed)
    return spec, (f"transformer (embedding, {layers} blocks, head; dim {dim}, vocab {vocab}, "
                  f"seq {seq})")


def _check_random_layers(cfg: RunConfig, spec: ModelSpec) -> str:
    """The check: a layer drawing random numbers (dropout) is one line naming it, or with
    ``check_dropout="off"`` every dropout rate is set to 0 (the text says so)."""
    off = cfg.check_dropout == "off"
    if not cfg.check:
        if off:
            raise ParamError(f"{_CHECK_DROPOUT} applies to {_CHECK} only; drop it or add {_CHECK}")
        return ""
    from .check import dropout_off, random_layers, refuse_random
    from .train import layer_names

    n = dropout_off(spec.layers) if off else 0
    sample = spec.make_batch(2, torch.Generator().manual_seed(0))[0]  # 2: BatchNorm needs 2
    refuse_random(random_layers(spec.layers, layer_names(spec, len(spec.layers)), sample))
    return f", {n} dropout rate{'s' if n != 1 else ''} set to 0 (--check-dropout off)" if n \
        else ""


def _cut_tied(spec: ModelSpec, num_stages: int, cuts: list[int], reference: bool):
    """(tied weights after the cut, the unsplit reference or None, the stages).

    The reference is the model as the user has it, tied weights one parameter; the stages
    each get their own copy of a tied weight they use (:mod:`pipebubble.runtime.tied`; the
    run sums the copies' gradients before every optimizer step)."""
    from .stages import split_stages
    from .tied import find_ties, tie_modules, untie_stages
    from .train import layer_names

    names = layer_names(spec, len(spec.layers))
    ties = find_ties(spec.layers, names, getattr(spec, "ties", ()))  # copies start equal
    ref = None
    if reference:
        ref = copy.deepcopy(nn.Sequential(*spec.layers))
        tie_modules(list(ref), names, ties)
    stages = split_stages(spec.layers, num_stages, cuts)
    return untie_stages(stages, [0, *cuts], names, ties), ref, stages


def _check_ep(cfg: RunConfig, spec) -> None:
    """``ep`` (:mod:`pipebubble.runtime.ep`): our engine, a model with MoE layers, ``ep``
    dividing ``dp`` and the experts."""
    if cfg.ep == 1:
        return
    if cfg.engine == "torch":
        raise ParamError(f"{_EP} {cfg.ep} runs with {_ENGINE} pipebubble only (torch's "
                         f"PipelineStage has no expert all-to-all); drop {_ENGINE} torch")
    experts = (spec.metadata or {}).get("moe_experts")  # an HF mixture of experts (models/hf.py)
    if experts and experts["count"] % cfg.ep:  # named by the config's key
        key, count = experts["key"], experts["count"]
        raise ParamError(f"{_EP} {cfg.ep} must divide {key!r} {count} (the experts of every "
                         f"MoE layer of {_MODEL} {cfg.model}); valid: a divisor of {count}")
    from .ep import check_ep

    check_ep(cfg.ep, cfg.dp, list(spec.layers), cfg.model)
