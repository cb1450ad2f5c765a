"""Per-layer costs at a chosen microbatch size and recomputation mode, from one or more profiles.

A profile is taken at one microbatch size ``b0`` (``batch`` in its metadata). The planner
needs the layers at other sizes: time and activation bytes grow linearly with the number of
sequences in a microbatch, parameters do not. With one profile every per-microbatch value is
scaled by ``b / b0``; with several (``--profile`` repeated, taken at different ``--batch``)
each value is interpolated linearly between the two profiles whose sizes bracket ``b``, and
extrapolated from the two nearest outside their range (clamped at 0). Measured profiles are
not exactly linear (small batches under-use a GPU); several of them capture that.

Recomputation modes (``none``, ``selective``, ``full``; Korthikanti et al. 2022): F keeps
``activation_bytes_<mode>`` instead of ``activation_bytes``, and the backward first re-runs
``recompute_time_<mode>`` seconds of forward (added to I). While one layer's backward runs,
its full activations exist again: ``transient`` is the largest such extra of any layer.

Fields a measured profile lacks get stated defaults: W = half the backward, what W keeps
(``M_W``) = all of ``activation_bytes`` (conservative: I frees nothing), nothing sent between
stages (``output_bytes`` 0: P2P then costs only the latency); recomputation needs an analytic
profile (or a profile with the ``activation_bytes_full`` fields).

>>> from pipebubble.plan.analytic import analytic_profile
>>> prof = analytic_profile(layers=2, hidden=64, ffn=256, heads=4, vocab=100, seq=16, batch=2,
...                         tflops=1, mfu=1)
>>> table = ProfileSet([prof])
>>> float(table.at(4, "none").f[1] / table.at(2, "none").f[1])   # twice the sequences
2.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UserError, param
from .analytic import RECOMPUTE_MODES, profile_batch
from .profile import Profile

_SCALED = ("forward", "backward", "weight_backward", "activation_bytes",
           "weight_activation_bytes", "output_bytes", "activation_bytes_full",
           "recompute_time_full", "activation_bytes_selective", "recompute_time_selective",
           "activation_bytes_op", "recompute_time_op")


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer numpy arrays for one microbatch size and recomputation mode.

    ``f``, ``i``, ``w``: seconds of F, I (recomputation included) and W per microbatch;
    ``act``: bytes F keeps until the backward; ``act_w``: of those, what W still needs;
    ``out``: bytes sent to the next stage; ``params``: parameter count; ``transient``: bytes
    re-materialised while the layer's backward runs (recomputation only); ``tied``: the
    local parameters of a tied embedding's copy, which the stage holding the head keeps
    when its rank holds no embedding (Megatron-LM at pp > 1: the copy's weights,
    gradients and optimizer state, and an all-reduce of its gradient with the first
    stage; :func:`~pipebubble.plan.cut_price.embedding_copies` says where); 0 when the
    embedding is not tied (nor needed by an MTP module on the head's stage). ``hidden``:
    per layer, the seconds of work a fused backward (B) runs behind its weight gradients
    and an I without its W does not (the backward's TP collectives,
    :mod:`~pipebubble.plan.tensor`); None (measured profiles): none known. ``expert``:
    per layer, the local parameters of its routed experts (part of ``params``; their
    states are sharded over the expert-data-parallel group, :mod:`~pipebubble.plan.expert`),
    ``a2a_f`` / ``a2a_b``: the seconds of expert parallelism's all-to-all inside ``f`` and
    inside ``i``; None for dense layers.
    ``comm_sms``: the share of the SMs the all-to-all's kernels take from compute while
    they overlap it (:class:`~pipebubble.costs.CostModel`; 0 for dense layers).
    """

    f: np.ndarray
    i: np.ndarray
    w: np.ndarray
    act: np.ndarray
    act_w: np.ndarray
    out: np.ndarray
    params: np.ndarray
    transient: np.ndarray
    tied: float = 0.0
    hidden: np.ndarray | None = None
    expert: np.ndarray | None = None
    a2a_f: np.ndarray | None = None
    a2a_b: np.ndarray | None = None
    comm_sms: float = 0.0

    @property
    def work(self) -> np.ndarray:
        """F + I + W per layer: what the min-max cut balances."""
        return self.f + self.i + self.w


class ProfileSet:
    """One model profiled at one or more microbatch sizes; :meth:`at` gives LayerCosts."""

    def __init__(self, profiles: list[Profile]):
        if not profiles:
            raise UserError(f"{param('profiles')}: give at least one profile")
        first = profiles[0]
        names = [layer.name for layer in first.layers]
        by_batch: dict[int, Profile] = {}
        for prof in profiles:
            if [layer.name for layer in prof.layers] != names:
                raise UserError(f"the {param('profiles')} files describe different models (layer "
                                 f"names differ); give profiles of one model at different "
                                 f"{param('batch')}")
            b = profile_batch(prof)
            if b in by_batch:
                raise UserError(f"two {param('profiles')} files were taken at batch {b}; give one "
                                 "per microbatch size")
            by_batch[b] = prof
        self.batches = sorted(by_batch)
        self.profile = by_batch[self.batches[0]]
        self.names = names
        self.types = [layer.type for layer in first.layers]
        self.modules = [layer.extra.get("modules") or [layer.name] for layer in first.layers]
        self.params = np.array([layer.params for layer in first.layers], dtype=np.float64)
        self.has_recompute = all("activation_bytes_full" in layer.extra
                                 for p in by_batch.values() for layer in p.layers)
        # torchtitan's op-level SAC where the profile prices it (analytic dense blocks; an
        # MoE profile's layers have no activation_bytes_op)
        self.has_op = self.has_recompute and any(
            "activation_bytes_op" in layer.extra for layer in first.layers)
        self._fields = {b: _fields(by_batch[b]) for b in self.batches}
        self._cache: dict[tuple[int, str], LayerCosts] = {}
        model = self.profile.metadata.get("model")
        self.tied = (float(model["vocab"] * model["hidden"]) if isinstance(model, dict)
                     and model.get("tied_embeddings") else 0.0)  # analytic profiles only

    def __len__(self) -> int:
        return len(self.names)

    def metadata(self) -> dict:
        return self.profile.metadata

    def recompute_modes(self) -> tuple[str, ...]:
        """The modes this profile supports."""
        if not self.has_recompute:
            return ("none",)
        return RECOMPUTE_MODES if self.has_op else tuple(m for m in RECOMPUTE_MODES if m != "op")

    def at(self, size: int, recompute: str = "none") -> LayerCosts:
        """The layers at microbatch size ``size`` with recomputation ``recompute``."""
        key = (size, recompute)
        if key not in self._cache:
            if recompute not in RECOMPUTE_MODES:
                raise UserError(f"unknown recompute mode {recompute!r}; valid are "
                                 f"{', '.join(RECOMPUTE_MODES)}")
            if recompute == "op" and self.has_recompute and not self.has_op:
                raise UserError(f"{param('recompute')} op needs a profile with "
                                 f"activation_bytes_op per layer (an analytic profile of a "
                                 f"dense model has them; MoE layers are not priced for it); "
                                 f"valid are {', '.join(self.recompute_modes())}")
            if recompute != "none" and not self.has_recompute:
                raise UserError(f"{param('recompute')} {recompute} needs a profile with "
                                 f"activation_bytes_{recompute} per layer (an analytic "
                                 f"profile has them); use {param('recompute')} none")
            v = self._interpolate(size)
            act_none = v["activation_bytes"]
            if recompute == "none":
                act, extra = act_none, np.zeros_like(act_none)
            else:
                act = v[f"activation_bytes_{recompute}"]
                extra = v[f"recompute_time_{recompute}"]
            i = v["backward"] - v["weight_backward"] + extra
            self._cache[key] = LayerCosts(
                f=v["forward"], i=i, w=v["weight_backward"], act=act,
                act_w=np.minimum(v["weight_activation_bytes"], act), out=v["output_bytes"],
                params=self.params, transient=np.maximum(act_none - act, 0.0),
                tied=self.tied)
        return self._cache[key]

    def _interpolate(self, size: int) -> dict[str, np.ndarray]:
        bs = self.batches
        if len(bs) == 1:
            scale = size / bs[0]
            return {k: v * scale for k, v in self._fields[bs[0]].items()}
        j = int(np.searchsorted(bs, size))
        lo, hi = (0, 1) if j <= 0 else (len(bs) - 2, len(bs) - 1) if j >= len(bs) else (j - 1, j)
        b0, b1 = bs[lo], bs[hi]
        x = (size - b0) / (b1 - b0)
        f0, f1 = self._fields[b0], self._fields[b1]
        return {k: np.maximum(f0[k] + x * (f1[k] - f0[k]), 0.0) for k in f0}


def _fields(prof: Profile) -> dict[str, np.ndarray]:
    """Every per-microbatch field as an array, with the defaults of the module doc."""
    out: dict[str, list[float]] = {k: [] for k in _SCALED}
    for layer in prof.layers:
        e = layer.extra
        out["forward"].append(layer.forward)
        out["backward"].append(layer.backward)
        out["weight_backward"].append(min(float(e.get("weight_backward", layer.backward / 2)),
                                          layer.backward))
        out["activation_bytes"].append(layer.activation_bytes)
        out["weight_activation_bytes"].append(
            float(e.get("weight_activation_bytes", layer.activation_bytes)))
        out["output_bytes"].append(float(e.get("output_bytes", 0.0)))
        for mode in ("full", "selective", "op"):
            out[f"activation_bytes_{mode}"].append(
                float(e.get(f"activation_bytes_{mode}", layer.activation_bytes)))
            out[f"recompute_time_{mode}"].append(float(e.get(f"recompute_time_{mode}", 0.0)))
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
