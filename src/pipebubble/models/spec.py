"""ModelSpec: what every model gives the runtime, the profiler and the partitioner.

A flat layer list (cut into stages anywhere between layers), a batch maker and the loss.
Optionally each layer's *name* (the model's own module name, e.g. ``model.layers.3``: what
partition's torchtitan block and a checkpoint's keys say) and *role*: ``embedding`` (the
token lookup on the first stage), ``layer`` or ``head`` (the output projection the loss
reads). Roles, not class names, decide the Megatron layout's ``E`` and ``L``.

A weight used by several layers (a head tied to the embedding) is written as the model has
it: one ``nn.Parameter`` reached from both layers (``head.weight = emb.weight``). The runtime
finds it, gives each stage that uses it a copy and sums the copies' gradients before every
optimizer step (:mod:`pipebubble.runtime.tied`), so it trains as one weight. Distinct
parameters meant to be one weight can be declared in ``ties``: groups of model-wide names
(``[("layers.0.weight", "layers.2.weight")]``: the names a checkpoint uses, the layer's
name, or ``layers.I`` without ``names``, then the parameter's path in the layer).

>>> import torch
>>> from torch import nn
>>> spec = ModelSpec("toy", [nn.Linear(2, 2), nn.Linear(2, 2)],
...                  lambda n, g: (torch.randn(n, 2, generator=g), torch.randn(n, 2, generator=g)),
...                  nn.functional.mse_loss)
>>> spec.layer_names(), spec.layer_roles()
(['0', '1'], ['layer', 'layer'])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

ROLES = ("embedding", "layer", "head")


@dataclass
class ModelSpec:
    """``layers`` run in sequence; ``make_batch(n, generator)`` gives ``n`` (input, target)
    samples; ``loss_fn(output, target)`` is the mean loss over a batch. ``names`` and
    ``roles`` (one per layer, optional) are described in the module docstring;
    ``description`` is one line for reports (what the batch and the loss are)."""

    name: str
    layers: list[nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    names: list[str] | None = None
    roles: list[str] | None = None
    description: str = ""
    metadata: dict = field(default_factory=dict)
    ties: list[tuple[str, ...]] = field(default_factory=list)  # declared tied weights

    def layer_names(self) -> list[str]:
        """One unique name per layer: ``names``, else the layer indices."""
        return list(self.names) if self.names is not None else [str(i) for i in
                                                               range(len(self.layers))]

    def layer_roles(self) -> list[str]:
        """One role per layer: ``roles``, else each layer's ``role`` attribute, else layer."""
        if self.roles is not None:
            return list(self.roles)
        return [str(getattr(m, "role", "layer")) for m in self.layers]


# ---- the contract, checked -----------------------------------------------------------------
def check_spec(spec: ModelSpec) -> None:
    """What can be checked without running anything: a non-empty list of ``nn.Module``
    layers, ``names``/``roles`` of the right length (names unique, roles from :data:`ROLES`),
    callable ``make_batch`` and ``loss_fn``. One :class:`~pipebubble.errors.UserError`
    line per breach, naming the field and what is valid.

    >>> check_spec(ModelSpec("toy", [nn.Linear(2, 2), "relu"], None, None))
    Traceback (most recent call last):
    ...
    pipebubble.errors.UserError: model 'toy': layer 1 is a str, not an nn.Module; every layer \
must be an nn.Module (wrap a function in one)
    """
    from ..errors import UserError

    if not isinstance(spec, ModelSpec):
        raise UserError(f"expected a pipebubble.ModelSpec, got a {type(spec).__name__}")
    if not isinstance(spec.name, str) or not spec.name.strip():
        got = repr(spec.name) if isinstance(spec.name, str) else f"a {type(spec.name).__name__}"
        raise UserError(f"a ModelSpec's name must be a non-empty string (the model's name in "
                        f"reports), got {got}")
    where = f"model {spec.name!r}"
    for field_name, kind in (("description", str), ("metadata", dict)):
        if not isinstance(getattr(spec, field_name), kind):
            raise UserError(f"{where}: {field_name} must be a {kind.__name__}, got a "
                            f"{type(getattr(spec, field_name)).__name__}")
    if not isinstance(spec.layers, list | tuple) or not spec.layers:
        got = (f"an empty {type(spec.layers).__name__}" if isinstance(spec.layers, list | tuple)
               else f"a {type(spec.layers).__name__}")
        raise UserError(f"{where}: layers must be a non-empty list of nn.Module, got {got}")
    for i, layer in enumerate(spec.layers):
        if not isinstance(layer, nn.Module):
            raise UserError(f"{where}: layer {i} is a {type(layer).__name__}, not an nn.Module; "
                            "every layer must be an nn.Module (wrap a function in one)")
    n = len(spec.layers)
    if spec.names is not None:
        names = list(spec.names)
        if len(names) != n or not all(isinstance(x, str) and x for x in names) \
                or len(set(names)) != n:
            raise UserError(f"{where}: names must be {n} unique non-empty strings (one per "
                            f"layer), got {len(names)}")
    roles = spec.layer_roles()
    if len(roles) != n or any(r not in ROLES for r in roles):
        bad = next((r for r in roles if r not in ROLES), None)
        raise UserError(f"{where}: roles must be {n} of {', '.join(ROLES)}"
                        + (f", got {bad!r}" if bad is not None else f", got {len(roles)}"))
    for field_name in ("make_batch", "loss_fn"):
        if not callable(getattr(spec, field_name)):
            raise UserError(f"{where}: {field_name} must be a function, got a "
                            f"{type(getattr(spec, field_name)).__name__}")


def check_batch(model: str, got: object, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``make_batch(n, generator)``'s result: an (input, target) pair (a tuple, or a list of
    two) of tensors with ``n`` samples each along dimension 0 (the dimension microbatches
    are cut along); returned as a tuple, or a UserError naming what it was."""
    from ..errors import UserError

    head = f"model {model!r}: make_batch({n}, generator)"
    if not isinstance(got, tuple | list) or len(got) != 2:
        what = (f"a {type(got).__name__} of {len(got)}" if isinstance(got, tuple | list)
                else f"a {type(got).__name__}")
        raise UserError(f"{head} returned {what}; it must return (inputs, targets), two "
                        "tensors")
    for part, value in zip(("inputs", "targets"), got, strict=True):
        if not isinstance(value, torch.Tensor):
            raise UserError(f"{head} returned {part} of type {type(value).__name__}; they must "
                            "be a torch.Tensor")
        if value.dim() == 0 or value.shape[0] != n:
            shape = tuple(value.shape)
            raise UserError(f"{head} returned {part} of shape {shape}; dimension 0 must be "
                            f"the {n} samples (microbatches are cut along it)")
    return got[0], got[1]


class _CheckedBatch:
    """``make_batch`` kept in its box: the user's failure is a UserCodeError, the result is
    checked (:func:`check_batch`), ``print()`` goes to stderr."""

    def __init__(self, model: str, fn: Callable):
        self.model, self.fn = model, fn

    def __getattr__(self, name: str):  # an nn.Sequential's ``inputs`` (loader.check_layers)
        if name != "inputs" or "fn" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __call__(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        from ..usercode import user_code

        with user_code(f"make_batch({n}, generator)", model=self.model):
            got = self.fn(n, generator)
        return check_batch(self.model, got, n)


class _CheckedLoss:
    """``loss_fn`` kept in its box: a failure is a UserCodeError naming it; a result that is
    not one number is a UserError."""

    def __init__(self, model: str, fn: Callable):
        self.model, self.fn = model, fn

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from ..errors import UserError
        from ..usercode import user_code

        with user_code("loss_fn", during="the loss", model=self.model):
            loss = self.fn(output, target)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                   else f"a {type(loss).__name__}")
            raise UserError(f"model {self.model!r}: loss_fn must return one number (a "
                            f"1-element tensor), got {got}")
        return loss


def guard_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` with its ``make_batch`` and ``loss_fn`` kept in their box (see
    :class:`_CheckedBatch`, :class:`_CheckedLoss`); the layers are the interpreter's to
    guard. Checks :func:`check_spec` first; guarding twice is guarding once."""
    from dataclasses import replace

    check_spec(spec)
    batch, loss = spec.make_batch, spec.loss_fn
    if not isinstance(batch, _CheckedBatch):
        batch = _CheckedBatch(spec.name, batch)
    if not isinstance(loss, _CheckedLoss):
        loss = _CheckedLoss(spec.name, loss)
    return replace(spec, make_batch=batch, loss_fn=loss)
