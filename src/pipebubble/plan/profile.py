"""Measure each layer of a model: time, parameters, activation memory, FLOPs.

A :class:`Profile` is what the partitioner needs to cut a model into stages. It is measured
on a sample batch the size of one microbatch:

- ``forward`` / ``backward``: median seconds over ``repeats`` timed passes, after ``warmup``
  untimed ones. On a GPU: wall time between synchronisations. On a CPU with one torch
  thread: the process's CPU time (``timer="auto"``), which other processes sharing the
  cores do not inflate; ``timer="wall"`` forces wall time. Each layer runs on the detached
  output of the previous one, so the backward of layer i is timed alone, fed the real
  gradient that layer i+1 produced (the first layer, like stage 0 in the runtime, computes
  no gradient for the model's input). With a ``loss_fn`` the loss belongs to the last
  layer (as in the runtime, where the last stage computes it).
- ``params``: number of parameter elements.
- ``activation_bytes``: bytes the autograd graph keeps for the backward (the tensors saved
  by the layer's operations, counted once each, parameters excluded), seen through
  ``torch.autograd.graph.saved_tensors_hooks``. What a stage holds per in-flight microbatch.
- ``flops``: forward plus backward FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode``
  (matrix multiplications, convolutions, attention; element-wise work counts zero, which is
  why an embedding lookup shows 0).
- ``role`` (kept with the layer, when known): ``embedding``, ``layer`` or ``head``, what the
  Megatron layout's ``E`` and ``L`` are read from (:mod:`pipebubble.plan.layouts`).

On a CPU the measurement runs with one torch thread (``threads=1``, restored afterwards),
as ``pipebubble profile`` does: CPU time of one thread is what other processes sharing the
cores do not inflate. Identical layers whose times differ by more than
:data:`NOISE_RATIO` x are reported (:func:`noisy_layers`; a ``warnings.warn`` from Python).
:func:`profile_model` profiles a :class:`~pipebubble.ModelSpec` (or a ``--model`` SPEC).

The file format is a JSON object with ``layers`` (a list of objects with ``name``,
``forward``, ``backward``, ``params``, ``activation_bytes``, ``flops``; an optional ``type``)
and any other top-level keys (device, dtype, batch shape) kept as metadata, so a profile
taken on a GPU machine can be partitioned anywhere, or written by another tool.

>>> p = Profile.from_dict({"device": "cpu", "layers": [
...     {"name": "0", "forward": 1e-3, "backward": 2e-3, "params": 10, "activation_bytes": 64,
...      "flops": 100}]})
>>> p.layers[0].time, p.metadata
(0.003, {'device': 'cpu'})
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads only when layers are measured, not to read a profile file
    import torch
    from torch import nn

from .profile_reader import FIELDS, ProfileError, check_document  # the one checked reader

FORMAT = "pipebubble-profile"


from ..limits import MAX_LAYERS, MIN_TIME  # noqa: E402  (layers in a file; least time)


@dataclass(frozen=True)
class LayerProfile:
    name: str
    forward: float
    backward: float
    params: int
    activation_bytes: float
    flops: float
    type: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def time(self) -> float:
        """Forward plus backward: the layer's work per microbatch."""
        return self.forward + self.backward

    def as_dict(self) -> dict:
        out: dict[str, Any] = {k: getattr(self, k) for k in FIELDS}
        if self.type is not None:
            out["type"] = self.type
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Profile:
    layers: list[LayerProfile]
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ProfileError("profile has no layers ('layers' is empty); it needs at least one")

    def __len__(self) -> int:
        return len(self.layers)

    def column(self, name: str) -> list[float]:
        """One value per layer: a field (``forward``, ``flops``, ...) or ``time``."""
        return [float(getattr(layer, name)) for layer in self.layers]

    def as_dict(self) -> dict:
        return {**self.metadata, "layers": [layer.as_dict() for layer in self.layers]}

    def save(self, path: str | Path) -> None:
        from ..files import json_text, write_text

        check_document(self.as_dict(), f"--out {str(path)!r}")  # never write what can't be read
        write_text(path, json_text(self.as_dict(), "--out", indent=1) + "\n", "--out")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        from .profile_reader import load_document

        data, where = load_document(path)
        return cls.from_dict(data, where)  # every field checked, errors name the file

    @classmethod
    def from_dict(cls, data: object, where: str = "profile") -> Profile:
        """Check every layer and field; errors name the layer, the field and the value."""
        check_document(data, where)  # every field, optional ones too (plan/profile_reader)
        if not isinstance(data, dict) or "layers" not in data:
            raise ProfileError("a profile must be a JSON object with a 'layers' list, got "
                               f"{type(data).__name__}" + (" without 'layers'"
                                                           if isinstance(data, dict) else ""))
        raw = data["layers"]
        if not isinstance(raw, list):
            raise ProfileError(f"'layers' must be a list, got {type(raw).__name__}")
        if not raw:
            raise ProfileError("profile has no layers ('layers' is empty); it needs at least one")
        if len(raw) > MAX_LAYERS:
            raise ProfileError(f"profile has {len(raw):,} layers, over the limit of "
                               f"{MAX_LAYERS:,}")
        layers, seen = [], set()
        for i, item in enumerate(raw):
            layers.append(_layer_from_dict(i, item))
            if layers[-1].name in seen:
                raise ProfileError(f"layer {i}: name {layers[-1].name!r} appears twice; "
                                   "layer names must be unique")
            seen.add(layers[-1].name)
        return cls(layers, {k: v for k, v in data.items() if k != "layers"})


def _layer_from_dict(i: int, item: object) -> LayerProfile:
    if not isinstance(item, dict):
        raise ProfileError(f"layer {i} must be an object with {', '.join(FIELDS)}, "
                           f"got {type(item).__name__}")
    label = f"layer {i}" + (f" ({item['name']!r})" if "name" in item else "")
    missing = [k for k in FIELDS if k not in item]
    if missing:
        raise ProfileError(f"{label} is missing {', '.join(repr(k) for k in missing)}; "
                           f"every layer needs {', '.join(FIELDS)}")
    if not isinstance(item["name"], str) or not item["name"]:
        raise ProfileError(f"{label}: name must be a non-empty string, got {item['name']!r}")
    values = {}
    for key, unit in (("forward", "seconds"), ("backward", "seconds"), ("params", "count"),
                      ("activation_bytes", "bytes"), ("flops", "count")):
        v = item[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ProfileError(f"{label}: {key} must be a finite number >= 0 ({unit}), got {v!r}")
        values[key] = v
    if float(values["params"]) != int(values["params"]):
        raise ProfileError(f"{label}: params must be a whole number, got {values['params']!r}")
    kind = item.get("type")
    if kind is not None and not isinstance(kind, str):
        raise ProfileError(f"{label}: type must be a string, got {kind!r}")
    extra = {k: v for k, v in item.items() if k not in FIELDS and k != "type"}
    return LayerProfile(item["name"], float(values["forward"]), float(values["backward"]),
                        int(values["params"]), float(values["activation_bytes"]),
                        float(values["flops"]), kind, extra)


# ---- measuring ------------------------------------------------------------------------------

def profile_layers(
    layers: Sequence[nn.Module] | nn.Sequential,
    sample: torch.Tensor,
    *,
    target: torch.Tensor | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    names: Sequence[str] | None = None,
    warmup: int = 2,
    repeats: int = 5,
    timer: str = "auto",
    metadata: dict | None = None,
    roles: Sequence[str] | None = None,
    threads: int | None = 1,
    warn: bool = True,
) -> Profile:
    """Profile each layer of ``layers`` (run in order) on ``sample``; see the module doc.

    Layers and sample must already be on the device to measure. Gradients the passes leave
    in the parameters are cleared (set to None) at the end. ``threads``: torch CPU threads
    while measuring on a CPU (1, restored after; None: leave torch's setting). ``warn``:
    ``warnings.warn`` each :func:`noisy_layers` line.
    """
    import torch

    pin = threads is not None and sample.device.type == "cpu" and \
        torch.get_num_threads() != threads
    before = torch.get_num_threads()
    if pin:
        torch.set_num_threads(threads)
    try:
        prof = _profile_layers(layers, sample, target, loss_fn, names, warmup, repeats, timer,
                               metadata, roles)
    finally:
        if pin:
            torch.set_num_threads(before)
    if warn:
        import warnings

        from ..libwarnings import PipebubbleWarning

        for line in noisy_layers(prof):
            warnings.warn(line, PipebubbleWarning, stacklevel=2)
    return prof


def _profile_layers(layers, sample, target, loss_fn, names, warmup, repeats, timer, metadata,
                    roles) -> Profile:
    import torch
    from torch import nn

    if isinstance(layers, nn.Sequential):
        names = names or [n for n, _ in layers.named_children()]
    mods = list(layers)
    if not mods:
        raise ProfileError("no layers to profile; give at least one module")
    names = list(names) if names is not None else [str(i) for i in range(len(mods))]
    if len(names) != len(mods):
        raise ProfileError(f"{len(names)} names for {len(mods)} layers")
    if roles is None:
        roles = [getattr(m, "role", None) for m in mods]
    if len(roles) != len(mods):
        raise ProfileError(f"{len(roles)} roles for {len(mods)} layers")
    for name, value in (("warmup", warmup), ("repeats", repeats)):
        if not isinstance(value, int) or value < (0 if name == "warmup" else 1):
            raise ProfileError(f"{name} must be an integer >= {0 if name == 'warmup' else 1}, "
                               f"got {value!r}")
    if loss_fn is not None and target is None:
        raise ProfileError("loss_fn needs a target batch")
    from ..runtime.clock import synchronizer  # the one CUDA synchroniser

    sync = synchronizer(sample.device)
    timer = resolve_timer(timer, sample.device)
    clock = time.process_time if timer == "cpu" else time.perf_counter

    flops, act_bytes = _count_pass(mods, sample, target, loss_fn)
    for _ in range(warmup):
        _timed_pass(mods, sample, target, loss_fn, sync, clock)
    fwd: list[list[float]] = [[] for _ in mods]
    bwd: list[list[float]] = [[] for _ in mods]

    def timed(passes: int) -> None:
        for _ in range(passes):
            f, b = _timed_pass(mods, sample, target, loss_fn, sync, clock)
            for i in range(len(mods)):
                fwd[i].append(f[i])
                bwd[i].append(b[i])

    timed(repeats)
    statistic, floor = _resolve(fwd, bwd, timed, clock)
    for mod in mods:
        for p in mod.parameters():
            p.grad = None
    out = [
        LayerProfile(names[i], max(statistic(fwd[i]), floor), max(statistic(bwd[i]), floor),
                     sum(p.numel() for p in mods[i].parameters()), float(act_bytes[i]),
                     float(flops[i]), type(mods[i]).__name__,
                     _extra(names[i], roles[i]))
        for i in range(len(mods))
    ]
    first_param = next((p for m in mods for p in m.parameters()), None)
    meta = {
        "format": FORMAT,
        "device": str(sample.device),
        "dtype": str(first_param.dtype if first_param is not None else sample.dtype),
        "batch_shape": list(sample.shape),
        "warmup": warmup,
        "repeats": repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "timer": timer,
        **({} if statistic is median else {"statistic": "mean", "passes": len(fwd[0])}),
        **({"time_floor": floor} if floor else {}),
        **(metadata or {}),
    }
    return Profile(out, meta)


UNRESOLVED_PASSES = 256
"""Most timed passes a profile adds when every median is 0 s (the clock did not advance)."""


def _resolve(fwd: list[list[float]], bwd: list[list[float]], timed: Callable[[int], None],
             clock: Callable[[], float]) -> tuple[Callable[[list[float]], float], float]:
    """(the statistic of each layer's times, the least time a layer is given).

    A layer faster than the clock's tick measures 0 in most passes (a CPU-time clock that
    advances in ticks on a loaded machine), and when every median is 0 the profile would
    say the model takes no time, which nothing can balance. Then more passes are timed
    (doubling, at most :data:`UNRESOLVED_PASSES`) and each layer's **mean** is kept: a
    reading is the tick with probability (time / tick), so the mean estimates the time
    without the median's rounding to 0. If the clock never advanced at all, every time is
    the clock's resolution (:func:`clock_resolution`), the most it can have been; the
    profile says so (``time_floor``) and the warning line names it (:func:`noisy_layers`)."""
    from statistics import fmean

    def total(stat) -> float:
        return sum(stat(t) for t in fwd) + sum(stat(t) for t in bwd)

    if total(median) > 0:
        return median, 0.0
    more = len(fwd[0])
    while total(fmean) == 0 and len(fwd[0]) < UNRESOLVED_PASSES:
        n = min(more, UNRESOLVED_PASSES - len(fwd[0]))
        timed(n)
        more *= 2
    if total(fmean) > 0:
        return _mean, 0.0
    return _mean, clock_resolution(clock)


def _mean(times: list[float]) -> float:
    """The mean, 0 or at least MIN_TIME (one tick over many passes may be less)."""
    from statistics import fmean

    m = fmean(times)
    return max(m, MIN_TIME) if m > 0 else 0.0


def clock_resolution(clock: Callable[[], float], reads: int = 100_000) -> float:
    """The first step of ``clock`` seen in up to ``reads`` reads (the clock's real tick),
    else the resolution the clock states (``time.get_clock_info``); at least MIN_TIME."""
    last = clock()
    for _ in range(reads):
        now = clock()
        if now != last:
            return max(now - last, MIN_TIME)
    name = getattr(clock, "__name__", "perf_counter")
    try:
        stated = time.get_clock_info(name).resolution
    except ValueError:  # not a clock of the time module
        stated = time.get_clock_info("perf_counter").resolution
    return max(stated, MIN_TIME)


def profile_model(
    model: Any,
    batch: int = 8,
    *,
    device: str = "cpu",
    seed: int = 0,
    model_args: dict | None = None,
    **options: Any,
) -> Profile:
    """Profile a :class:`~pipebubble.ModelSpec`, or the model a ``--model`` SPEC names
    (``"hf:config.json"``, ``"my_model.py:build"``), on one microbatch of ``batch`` samples
    from its ``make_batch``; ``options`` go to :func:`profile_layers`. Layer names and roles
    come from the spec.

    >>> from pipebubble.models import mlp
    >>> prof = profile_model(mlp(layers=2, width=4), batch=2, warmup=0, repeats=1)
    >>> [layer.name for layer in prof.layers], prof.metadata["model"]
    (['0', '1'], 'mlp')
    """
    import torch

    if isinstance(model, str):
        from ..models.loader import load_model

        model = load_model(model, model_args, seed=seed)
    from ..models.spec import ModelSpec

    if not isinstance(model, ModelSpec):
        raise ProfileError(f"profile_model takes a ModelSpec or a model SPEC string, got "
                           f"{type(model).__name__}")
    x, y = model.make_batch(batch, torch.Generator().manual_seed(seed))
    dev = torch.device(device)
    layers = [m.to(dev) for m in model.layers]
    meta = {"model": model.name, **options.pop("metadata", {})}
    return profile_layers(layers, x.to(dev), target=y.to(dev), loss_fn=model.loss_fn,
                          names=model.layer_names(), roles=model.layer_roles(), metadata=meta,
                          **options)


NOISE_RATIO = 3.0


def noisy_layers(prof: Profile) -> list[str]:
    """Warnings for identical layers (same type, parameters, activation bytes and FLOPs)
    whose forward or backward times differ by more than :data:`NOISE_RATIO` x: the same
    work measured that differently is noise (other processes, frequency scaling)."""
    out = []
    floor = prof.metadata.get("time_floor")
    if floor:
        out.append(f"every layer measured 0 s, below the clock's resolution: each forward and "
                   f"backward is given {floor:.3g} s, the most it can have taken; use a "
                   "larger --batch or a finer clock (a GPU's or --threads > 1: wall time)")
    groups: dict[tuple, list] = {}
    for layer in prof.layers:
        key = (layer.type, layer.params, layer.activation_bytes, layer.flops)
        groups.setdefault(key, []).append(layer)
    for (kind, *_), layers in groups.items():
        if len(layers) < 2:
            continue
        for name in ("forward", "backward"):
            times = [getattr(x, name) for x in layers]
            lo, hi = min(times), max(times)
            if lo > 0 and hi / lo > NOISE_RATIO:
                out.append(f"{len(layers)} identical {kind or 'layers'} differ {hi / lo:.1f}x "
                           f"in {name} time ({lo * 1e3:.3g} to {hi * 1e3:.3g} ms): the "
                           "measurement is noisy; use --threads 1, more --repeats, or a "
                           "quieter machine")
    return out


def _extra(name: str, role: str | None) -> dict:
    """A layer's role, and its modules when it is several (``model.norm+lm_head``)."""
    out: dict = {} if role is None else {"role": str(role)}
    if "+" in name:
        out["modules"] = name.split("+")
    return out


def resolve_timer(timer: str, device: torch.device | str = "cpu") -> str:
    """``auto`` -> ``cpu`` (process CPU time) on a CPU with one torch thread, else ``wall``."""
    if timer not in ("auto", "wall", "cpu"):
        raise ProfileError(f"unknown timer {timer!r}; valid are auto, wall, cpu")
    if timer == "auto":
        import torch

        one_thread = torch.get_num_threads() == 1
        return "cpu" if torch.device(device).type == "cpu" and one_thread else "wall"
    return timer


def _layer_input(x: torch.Tensor, first: bool, i: int = 0) -> torch.Tensor:
    """Detached; a leaf that wants a gradient except for the first layer (as in the runtime:
    nothing consumes the gradient of the model's input) and for token ids. ``i``: the layer
    it is the input of (a previous layer that returned no tensor is named)."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise ProfileError(f"layer {i - 1} returned a {type(x).__name__}, not a tensor; every "
                           "layer but the last must return the next layer's input tensor")
    return x.detach().requires_grad_(not first and (x.is_floating_point() or x.is_complex()))


def _forward(mods, i, x, target, loss_fn):
    y = mods[i](x)
    if loss_fn is not None and i == len(mods) - 1:
        y = loss_fn(y, target)
    return y


def _backward(y: torch.Tensor, grad: torch.Tensor | None) -> None:
    import torch

    if y.requires_grad:
        if grad is None and y.numel() != 1:
            grad = torch.ones_like(y)  # no loss: any output gradient times the same work
        torch.autograd.backward(y, grad_tensors=grad)


def _timed_pass(mods, sample, target, loss_fn, sync, clock) -> tuple[list[float], list[float]]:
    """One forward and one backward, layer by layer, each layer timed on its own."""
    xs, ys, f = [], [], []
    x = sample
    for i in range(len(mods)):
        xi = _layer_input(x, i == 0, i)
        sync()
        t0 = clock()
        y = _forward(mods, i, xi, target, loss_fn)
        sync()
        f.append(clock() - t0)
        xs.append(xi)
        ys.append(y)
        x = y
    b = [0.0] * len(mods)
    grad = None
    for i in reversed(range(len(mods))):
        sync()
        t0 = clock()
        _backward(ys[i], grad)
        sync()
        b[i] = clock() - t0
        grad = xs[i].grad
    return f, b


def _count_pass(mods, sample, target, loss_fn) -> tuple[list[int], list[int]]:
    """FLOPs (forward + backward) and saved-activation bytes per layer, in one untimed pass."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    params = {p.untyped_storage().data_ptr() for m in mods for p in m.parameters()}
    flops, saved = [], []
    xs, ys = [], []
    x = sample
    for i in range(len(mods)):
        xi = _layer_input(x, i == 0, i)
        seen: dict[tuple[int, int], int] = {}

        def pack(t: torch.Tensor, seen=seen) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in params:
                seen[(t.data_ptr(), t.nbytes)] = t.nbytes
            return t

        with FlopCounterMode(display=False) as counter, \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = _forward(mods, i, xi, target, loss_fn)
        flops.append(counter.get_total_flops())
        saved.append(sum(seen.values()))
        xs.append(xi)
        ys.append(y)
        x = y
    grad = None
    for i in reversed(range(len(mods))):
        with FlopCounterMode(display=False) as counter:
            _backward(ys[i], grad)
        flops[i] += counter.get_total_flops()
        grad = xs[i].grad
    return flops, saved
