"""``run --check`` as a gate: a verdict against a stated tolerance, and layers it cannot judge.

The check trains the unsplit model beside the pipeline on the same batches (the model as the
user has it: tied weights one parameter) and compares. Its verdict is **pass** when every
*relative* difference is within the tolerance:

- gradients: ``max |g_pipe - g_ref| / max |g_ref|`` over every parameter (the last step's);
- loss: ``max_k |l_k - r_k| / |r_k|`` over the steps;
- parameters after the last optimizer step: ``max |p_pipe - p_ref| / max |p_ref|``, judged
  in float64 only. In float32 it is shown, not judged: AdamW divides each gradient by its
  own running size, so a near-zero gradient that differs in its last bits (the pipeline sums
  in another order) moves its parameter by about ``lr`` in another direction: 2e-4 relative
  after 5 steps at lr 0.01 on the README's MLP, with gradients equal to 3e-6. The losses of
  the later steps (judged) show whether such differences matter to the training.

The default tolerance follows the dtype (:data:`DEFAULT_TOLERANCE`: float32 1e-5, float64
1e-10): a pipeline changes only the order in which gradients are summed, so it agrees with
the unsplit model to a few units of the dtype's rounding, far inside these bounds.

A layer that draws random numbers (dropout) makes the two runs differ by design: the pipeline
and the reference draw different masks. Such layers are detected before the run
(:func:`random_layers`: dropout modules and dropout rates by name, then any layer whose
forward consumes the random generator) and the check refuses to run with one line naming
the first; ``--check-dropout off`` sets every dropout to 0 for the run (:func:`dropout_off`)
so the check is exact. (The other way, replaying one random state per stage and microbatch
in the reference, is not done: a microbatch's mask would then depend on the cut.)

>>> verdict({"gradients": 3e-7, "loss": 0.0}, "float32").passed
True
>>> v = verdict({"gradients": 0.043, "loss": 1e-8}, "float32")
>>> v.passed, v.failed
(False, ['gradients'])
>>> v.line().split(": ", 2)[2]
'gradients 0.043 > 1e-05; loss 1e-08'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ParamError, UserError, param
from ..usercode import call_layer

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_CHECK_DROPOUT = param("check_dropout")
_CHECK_TOL = param("check_tol")

DEFAULT_TOLERANCE = {"float32": 1e-5, "float64": 1e-10}
# float attributes that hold a dropout rate used functionally (HF attention: attention_dropout)
RATE_NAMES = ("attention_dropout", "attn_dropout", "dropout", "dropout_p", "dropout_rate")


def check_tolerance(given: float | None, dtype: str) -> float:
    """``--check-tol``, or the dtype's default; a finite number > 0 else a UserError."""
    if given is None:
        return DEFAULT_TOLERANCE.get(dtype, 1e-5)
    if not (isinstance(given, int | float) and math.isfinite(given) and given > 0):
        raise ParamError(f"{_CHECK_TOL} must be a finite number > 0, got {given!r}")
    return float(given)


@dataclass
class Verdict:
    """The check's verdict: each measure's relative difference against ``tolerance``."""

    relative: dict[str, float]
    tolerance: float
    dtype: str
    default: bool = True
    failed: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)  # measures given but not judged

    @property
    def passed(self) -> bool:
        return not self.failed

    def line(self) -> str:
        how = (f"{self.dtype} default, --check-tol sets it" if self.default
               else "--check-tol")
        parts = [f"{k} {v:.3g}" + (f" > {self.tolerance:.3g}" if k in self.failed else "")
                 + (f" (not judged in {self.dtype})" if k in self.shown else "")
                 for k, v in self.relative.items()]
        return (f"check: {'PASS' if self.passed else 'FAIL'} against tolerance "
                f"{self.tolerance:.3g} (relative; {how}): {'; '.join(parts)}")

    def as_dict(self) -> dict:
        return {"passed": self.passed, "tolerance": self.tolerance, "dtype": self.dtype,
                "relative": dict(self.relative), "failed": list(self.failed),
                "not_judged": list(self.shown)}


def verdict(relative: dict[str, float | None], dtype: str, tolerance: float | None = None
            ) -> Verdict:
    """Pass iff every judged relative difference is <= the tolerance (NaN fails); the
    parameters are judged in float64 only (module docstring)."""
    tol = check_tolerance(tolerance, dtype)
    rel = {k: float(v) for k, v in relative.items() if v is not None}
    shown = ["parameters"] if dtype != "float64" and "parameters" in rel else []
    failed = [k for k, v in rel.items() if k not in shown and not v <= tol]
    return Verdict(rel, tol, dtype, tolerance is None, failed, shown)


def relative(diff: float | None, scale: float | None) -> float | None:
    """``diff / scale`` (``diff`` itself when the scale is 0: nothing to be relative to)."""
    if diff is None:
        return None
    return diff / scale if scale else diff


def loss_relative(losses: Sequence[float], reference: Sequence[float]) -> float:
    """Largest ``|l_k - r_k| / |r_k|`` over the steps."""
    return max((relative(abs(a - b), abs(b)) for a, b in zip(losses, reference, strict=False)),
               default=0.0)


def max_abs(tensors: Iterable[torch.Tensor | None]) -> float:
    """Largest ``|x|`` over the tensors (None and empty ones skipped)."""
    out = 0.0
    for t in tensors:
        if t is not None and t.numel():
            out = max(out, float(t.detach().abs().max()))
    return out


# ---- layers the check cannot judge exactly -------------------------------------------------
@dataclass(frozen=True)
class RandomLayer:
    """A layer whose forward draws random numbers; ``p`` when it is a known dropout."""

    layer: str
    where: str  # the module inside the layer ("attn.resid_dropout"), "" for the layer
    p: float | None = None

    def describe(self) -> str:
        inside = f" ({self.where})" if self.where else ""
        if self.p is not None:
            return f"dropout p={self.p:g} in layer {self.layer}{inside}"
        return f"layer {self.layer}{inside} draws random numbers in its forward"


def _rates(layer: nn.Module):
    """(module path, owner, attribute or None, rate) of every dropout in ``layer``."""
    for path, mod in layer.named_modules():
        if isinstance(mod, nn.modules.dropout._DropoutNd):
            yield path, mod, "p", float(mod.p)
            continue
        for name in RATE_NAMES:
            v = getattr(mod, name, None)
            if isinstance(v, float) and not isinstance(v, bool):
                yield ".".join(x for x in (path, name) if x), mod, name, v


def random_layers(layers: Sequence[nn.Module], names: Sequence[str],
                  sample: torch.Tensor | None = None) -> list[RandomLayer]:
    """Every dropout with ``p > 0`` (by module and rate), then, when ``sample`` (a tiny
    input batch) is given, every other layer whose forward consumes torch's random
    generator on it (run without gradients; the generator's state is restored after)."""
    found = [RandomLayer(names[i], path, rate) for i, layer in enumerate(layers)
             if layer.training for path, _, _, rate in _rates(layer) if rate > 0]
    if sample is None:
        return found
    flagged = {r.layer for r in found}
    h = sample
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for i, layer in enumerate(layers):
            before = torch.get_rng_state()
            h = call_layer(layer, h, i, names[i], "the check's scan for random layers")
            if names[i] not in flagged and not torch.equal(before, torch.get_rng_state()):
                found.append(RandomLayer(names[i], ""))
    return found


def dropout_off(layers: Sequence[nn.Module]) -> int:
    """Set every dropout rate in ``layers`` to 0 (in place); the number changed."""
    n = 0
    for layer in layers:
        for _, mod, attr, rate in list(_rates(layer)):
            if rate > 0:
                setattr(mod, attr, 0.0)
                n += 1
    return n


def refuse_random(found: Sequence[RandomLayer]) -> None:
    """One line naming the first layer the check cannot judge exactly (UserError)."""
    if not found:
        return
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    first = found[0]
    fix = (f"set it to 0 or pass {_CHECK_DROPOUT} off" if first.p is not None else
           f"make it deterministic for the check ({_CHECK_DROPOUT} off sets dropout rates to 0 "
           "only)")
    raise UserError(f"{first.describe()}{more}: the check cannot be exact; {fix}")
