"""Training: an optimizer step after every pipeline step, fresh data every step, a reference.

A pipeline step (:func:`~pipebubble.runtime.local.run_local`, or one distributed
``Worker.step``) leaves in every stage's ``.grad`` the gradient of the mean loss over the
step's batch, exactly the unsplit model's. Training is then what it is without a pipeline:

1. the batch of step ``k`` comes from the model spec's ``make_batch`` with a generator seeded
   by ``(seed, k)`` (:func:`step_generator`), so any process, any cut, any schedule and a
   resumed run all see the same batches;
2. the pipeline step computes the gradients (with ``--dp``, then summed over replicas; a
   tied weight's copies then summed over the stages that hold one: ``runtime.tied``);
3. each rank's optimizer steps *its own stages' parameters* (SGD and AdamW update every
   parameter from its own gradient and state only, so one optimizer per rank is the same as
   one optimizer over the whole model).

:class:`ReferenceTrainer` trains the unsplit model the same way on the same batches: its
losses and parameters are what the pipeline must reproduce (``run --check``).

>>> opt_defaults("adamw")
0.001
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ParamError, param

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_LR = param("lr")
_OPTIMIZER = param("optimizer")
_STEPS = param("steps")

OPTIMIZERS = ("sgd", "adamw")
_DEFAULT_LR = {"sgd": 0.01, "adamw": 1e-3}


def opt_defaults(name: str) -> float:
    """The default learning rate of ``--optimizer NAME`` (SGD 0.01, AdamW 0.001)."""
    return _DEFAULT_LR[name]


def check_training(steps: int, optimizer: str, lr: float | None) -> float:
    """Validate ``--steps``/``--optimizer``/``--lr``; return the learning rate to use."""
    if not isinstance(steps, int) or steps < 1:
        raise ParamError(f"{_STEPS} must be an integer >= 1, got {steps!r}")
    if optimizer not in OPTIMIZERS:
        raise ParamError(f"{_OPTIMIZER} must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if lr is None:
        return _DEFAULT_LR[optimizer]
    if not lr >= 0 or lr != lr or lr == float("inf"):
        raise ParamError(f"{_LR} must be a finite number >= 0, got {lr!r}")
    return float(lr)


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """``sgd``: plain SGD; ``adamw``: AdamW with torch's defaults (betas 0.9/0.999, eps 1e-8,
    weight decay 0.01). ``foreach=False``: the per-parameter loop, whose arithmetic does not
    depend on how the parameters are grouped (one optimizer per rank or one for all)."""
    seen: set[int] = set()  # a weight used under two names (tied, on one stage) steps once
    params = [p for p in params if p.requires_grad and not (id(p) in seen or seen.add(id(p)))]
    # a rank whose stages have no trainable parameter (a frozen embedding) steps nothing
    groups = [{"params": params}]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, foreach=False)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, foreach=False)
    raise ParamError(f"{_OPTIMIZER} must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step ``step``'s batch. Step 0 uses ``seed + 1`` (the batch a one-step
    ``run`` has always used); later steps a mix of both numbers (SplitMix64), so that
    ``(seed, step)`` pairs do not share batches."""
    if step == 0:
        return torch.Generator().manual_seed(seed + 1)
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 1) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return torch.Generator().manual_seed((z ^ (z >> 31)) & (2**63 - 1))


def step_batch(make_batch, size: int, seed: int, step: int,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` samples for step ``step`` (see :func:`step_generator`), on ``device``.
    A ``make_batch`` with an ``at_step(step, size)`` method (``run --data``'s
    :class:`~pipebubble.runtime.data.TokenStream`) is asked for that step's data instead."""
    at_step = getattr(make_batch, "at_step", None)
    x, y = (at_step(step, size) if at_step is not None
            else make_batch(size, step_generator(seed, step)))
    return (x, y) if device is None else (x.to(device), y.to(device))


# ---- names: the keys of a checkpoint ------------------------------------------------------
def layer_names(spec, num_layers: int) -> list[str]:
    """The model's own name for each layer: the spec's ``names`` when it has them
    (e.g. ``model.layers.3`` for a HuggingFace model), else ``layers.0``, ``layers.1``, ..."""
    names = getattr(spec, "names", None)
    if names and len(names) == num_layers:
        return [str(n) for n in names]
    return [f"layers.{i}" for i in range(num_layers)]


def stage_layers(stage: nn.Module) -> list[nn.Module]:
    """The layers of one stage (a :class:`~pipebubble.runtime.pipeline.PipelineStage`)."""
    inner = getattr(stage, "layers", None)
    return list(inner) if isinstance(inner, nn.Sequential) else [stage]


def named_stage_parameters(stage: nn.Module, first_layer: int, names: Sequence[str]
                           ) -> list[tuple[str, nn.Parameter]]:
    """``(model-wide name, parameter)`` for each parameter of a stage whose first layer is
    ``first_layer``: ``layers.3.linear.weight`` whichever stage holds layer 3."""
    out = []
    for i, layer in enumerate(stage_layers(stage)):
        for pname, p in layer.named_parameters():
            out.append((f"{names[first_layer + i]}.{pname}", p))
    return out


def model_parameter_shapes(layers: Sequence[nn.Module], names: Sequence[str]
                           ) -> dict[str, tuple[int, ...]]:
    """Every parameter of the whole model, by its model-wide name: its shape."""
    return {f"{names[i]}.{pname}": tuple(p.shape)
            for i, layer in enumerate(layers) for pname, p in layer.named_parameters()}


# ---- the reference -----------------------------------------------------------------------
@dataclass
class ReferenceTrainer:
    """The unsplit model trained like the pipeline: same optimizer, same batches."""

    model: nn.Module
    loss_fn: object
    optimizer: str
    lr: float
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.opt = make_optimizer(self.optimizer, self.model.parameters(), self.lr)

    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Forward and backward on the whole batch (the gradients stay in ``.grad``)."""
        self.model.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        value = float(loss.detach())
        self.losses.append(value)
        return value

    def step(self) -> None:
        self.opt.step()


def max_param_diff(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Largest |a - b| over matching parameter pairs."""
    worst = 0.0
    for a, b in pairs:
        if a.numel():
            worst = max(worst, float((a.detach().cpu() - b.detach().cpu()).abs().max()))
    return worst
