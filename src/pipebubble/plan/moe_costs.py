"""A profile's cost model for ``simulate`` and ``compare``, all-to-all included.

``simulate --profile FILE`` and ``compare --profile FILE`` take their times from a profile
(``pipebubble profile --out``, measured or analytic) instead of ``--f``/``--b``/``--w``:
each rank's share is ``1/p`` of the layers' sums (an even split of the model; ``partition``
finds the real cut, stage by stage), so the schedules compare at the model's own ratios of
forward, backward and weight gradient.

**The all-to-all.** With expert parallelism over ``ep`` ranks each MoE layer runs four
all-to-alls a microbatch (dispatch and combine in the forward, their gradients in the
backward: :mod:`pipebubble.plan.moe`), each moving the layer's ``all_to_all_bytes``, of
which ``(ep - 1) / ep`` leave the rank. At ``bandwidth`` bytes/s (and ``latency`` s each)
one takes ``bytes (ep - 1) / ep / bandwidth + latency``, so a layer's forward gains
``a2a_f = 2`` of them and its backward (its I: the gradients of the dispatched tokens)
``a2a_b = 2``; an analytic profile's times are compute only, so these are added to them. A
profile measured with its all-to-all inside may say so instead: per layer
``all_to_all_forward`` and ``all_to_all_backward`` (seconds, part of ``forward`` and of
``backward`` minus ``weight_backward``), used as they are. The cost model then carries
``a2a_f``/``a2a_b``, which the simulator exposes in every lone action and hides in
DualPipe's overlapped F&B pairs (:meth:`pipebubble.costs.StageCosts.pair_duration`).

W is the profile's ``weight_backward`` where a layer has it, else half its backward (the
matrix multiplies' two gradients, as ``--w`` defaults to half of ``--b``).

>>> from pipebubble.plan.profile import Profile
>>> p = Profile.from_dict({"layers": [{"name": "moe", "forward": 1.0, "backward": 2.0,
...     "weight_backward": 1.0, "params": 1, "activation_bytes": 1, "flops": 1,
...     "all_to_all_bytes": 1e9}]})
>>> profile_costs(p, ranks=1, ep=2, bandwidth=1e9)
{'f': 2.0, 'b': 3.0, 'w': 1.0, 'a2a_f': 1.0, 'a2a_b': 1.0}
"""

from __future__ import annotations

import math

from ..errors import UserError, param
from .profile import LayerProfile, Profile


def layer_all_to_all(layer: LayerProfile, ep: int, bandwidth: float | None,
                     latency: float = 0.0) -> tuple[float, float, bool]:
    """(all-to-all seconds inside the layer's forward, inside its backward, whether the
    profile's times already hold them) for one layer (module doc)."""
    given = [layer.extra.get(k) for k in ("all_to_all_forward", "all_to_all_backward")]
    if any(v is not None for v in given):
        fwd, bwd = (_seconds(v, k, layer) for v, k in zip(
            given, ("all_to_all_forward", "all_to_all_backward"), strict=True))
        w = _weight(layer)
        if fwd > layer.forward:
            raise UserError(f"layer {layer.name!r}: all_to_all_forward {fwd:g} s is more than "
                            f"its forward {layer.forward:g} s; the all-to-all is part of it")
        if bwd > layer.backward - w + 1e-12 * max(1.0, layer.backward):
            raise UserError(f"layer {layer.name!r}: all_to_all_backward {bwd:g} s is more than "
                            f"its backward less W, {layer.backward - w:g} s; the all-to-all "
                            "is part of I")
        return fwd, bwd, True
    size = layer.extra.get("all_to_all_bytes", 0.0)
    if ep == 1 or not size:
        return 0.0, 0.0, False
    size = _seconds(size, "all_to_all_bytes", layer)
    if bandwidth is None:
        raise UserError(f"{param('ep')} {ep}: layer {layer.name!r} has all-to-all bytes; give "
                        f"{param('ep_bandwidth')} (bytes/s each rank sends at, e.g. 50GB)")
    one = size * (ep - 1) / ep / bandwidth + latency
    return 2 * one, 2 * one, False


def profile_costs(profile: Profile, ranks: int, ep: int = 1, bandwidth: float | None = None,
                  latency: float = 0.0) -> dict[str, float]:
    """``f``, ``b``, ``w``, ``a2a_f``, ``a2a_b``: one rank's share (``1/ranks``) of the
    profile's layers, the all-to-all of ``ep``-way expert parallelism included (module doc).
    The keys are :class:`~pipebubble.costs.CostModel`'s."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise UserError(f"{param('ranks')} must be >= 1, got {ranks!r}")
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise UserError(f"{param('ep')} must be an integer >= 1, got {ep!r}")
    f = b = w = a2a_f = a2a_b = 0.0
    for layer in profile.layers:
        fwd, bwd, inside = layer_all_to_all(layer, ep, bandwidth, latency)
        extra_f, extra_b = (0.0, 0.0) if inside else (fwd, bwd)
        f += layer.forward + extra_f
        b += layer.backward + extra_b
        w += _weight(layer)
        a2a_f += fwd
        a2a_b += bwd
    return {"f": f / ranks, "b": b / ranks, "w": w / ranks, "a2a_f": a2a_f / ranks,
            "a2a_b": a2a_b / ranks}


def _weight(layer: LayerProfile) -> float:
    w = layer.extra.get("weight_backward")
    return layer.backward / 2 if w is None else float(w)


def _seconds(v: object, key: str, layer: LayerProfile) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise UserError(f"layer {layer.name!r}: {key} must be a finite number >= 0, got {v!r}")
    return float(v)
