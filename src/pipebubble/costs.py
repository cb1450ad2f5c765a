"""CostModel: how long each action takes and how much memory it holds.

Times: ``f`` (forward), ``b`` (full backward) and ``w`` (the weight-gradient part of the
backward; ``I = B - W + i_extra``: ``i_extra``, 0 by default, is what a fused backward hides
behind its W and an I without its W cannot, such as the TP collectives of
:mod:`pipebubble.plan.tensor`). A scalar is the time of *one rank's share* of the model, so with
``v`` chunks per rank each chunk takes ``1/v`` of it; a list gives one value per stage, as is.

Memory (DESIGN.md, after Zero Bubble Table 1): F adds the stage's activation memory ``M_B``
for the microbatch; B frees it; I frees ``M_B - M_W`` and W frees ``M_W``. With
recomputation F keeps only the stage input (``input_memory``) and the backward first re-runs
the forward, so it costs ``F`` more and briefly re-materialises ``M_B``.

``memory_limit`` caps the activation memory any rank may hold (a scalar for every rank, or
one value per rank), in the units of ``Timeline.rank_stats()[r].peak_memory``. The
simulator never enforces it (a schedule's memory is what it is); :meth:`CostModel.over_limit`
says whether a simulated schedule stays within it, and the automatic scheduler
(``schedules/auto``) searches only orders that do. ``mem_b``/``mem_w`` are short names for
``activation_memory``/``weight_memory`` (the flags ``--mem-b``/``--mem-w``).

Example: ``CostModel(f=1, b=2).resolve(stages=8, chunks=2).f == [0.5] * 8``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

from .ir.schedule import ScheduleError

Value = float | Sequence[float]

FIT_TOLERANCE = 1e-9
"""The one tolerance of "a peak fits the limit", relative to the limit (absolute below 1):
sums of float deltas may land a hair above a limit they meet exactly."""


def fit_bound(limit: float) -> float:
    """The highest level that fits ``limit``: :func:`fits_limit` is ``peak <= fit_bound(limit)``
    (for a search's inner loop, a cap it compares many levels with, or a solver's bound).

    >>> import math
    >>> top = fit_bound(3.0)
    >>> top > 3.0, fits_limit(top, 3.0), fits_limit(math.nextafter(top, math.inf), 3.0)
    (True, True, False)
    """
    return limit + FIT_TOLERANCE * max(1.0, abs(limit))


def fits_limit(peak: float, limit: float) -> bool:
    """Whether ``peak`` fits ``limit`` (the one test every search and report uses).

    >>> fits_limit(3.0000000001, 3), fits_limit(3.01, 3)
    (True, False)
    """
    return peak <= limit + FIT_TOLERANCE * max(1.0, abs(limit))


@dataclass(frozen=True)
class CostModel:
    """Per-stage compute times, per-hop communication time, per-stage memory.

    ``overlap`` is the time of an overlapped forward+backward pair as a fraction of the sum
    of its parts (1.0: no gain from overlapping; DualPipe hopes for less).
    ``allreduce`` is the time of one stage's data-parallel gradient all-reduce (scalar per
    rank-share, or per stage), added at the end of the step on the stage's rank.
    ``a2a_f`` and ``a2a_b`` are the parts of F's and of the backward's time (B, or I when the
    backward is split; W has none) spent in expert parallelism's all-to-all (dispatch and
    combine). Run alone an action takes its whole time; an overlapped pair hides one half's
    all-to-all behind the other half's compute (:meth:`StageCosts.pair_duration`).
    ``comm_sms`` is the share of the GPU's SMs the all-to-all's kernels hold while they run
    beside compute (DeepSeek-V3: 20 of 132, arXiv 2412.19437 section 3.2.2): in an
    overlapped pair the compute runs on the rest while they do. 0: communication takes no
    SMs from compute.
    """

    f: Value = 1.0
    b: Value = 2.0
    w: Value = 1.0
    comm: float = 0.0
    activation_memory: Value = 1.0
    weight_memory: Value = 0.0
    input_memory: Value = 0.0
    recompute: bool | Sequence[bool] = False
    overlap: float = 1.0
    allreduce: Value = 0.0
    memory_limit: Value | None = None
    i_extra: Value = 0.0  # seconds an I takes beyond B - W (module doc)
    a2a_f: Value = 0.0  # all-to-all seconds inside one F (class doc)
    a2a_b: Value = 0.0  # all-to-all seconds inside one B or I (class doc)
    comm_sms: float = 0.0  # share of the SMs an overlapped all-to-all holds (class doc)

    @property
    def mem_b(self) -> Value:
        """M_B, the activation memory one forward adds (``activation_memory``)."""
        return self.activation_memory

    @property
    def mem_w(self) -> Value:
        """M_W, the part of M_B that W still needs after I (``weight_memory``)."""
        return self.weight_memory

    def rank_limits(self, ranks: int) -> list[float] | None:
        """``memory_limit`` as one value per rank (None: no limit); checks it.

        >>> CostModel(memory_limit=3).rank_limits(2)
        [3.0, 3.0]
        """
        if self.memory_limit is None:
            return None
        if isinstance(self.memory_limit, int | float):
            out = [float(self.memory_limit)] * ranks
        else:
            out = [float(x) for x in self.memory_limit]
            if len(out) != ranks:
                raise ScheduleError(
                    f"memory_limit has {len(out)} values; expected 1 or {ranks} (one per rank)"
                )
        for r, x in enumerate(out):
            if not x >= 0 or x == float("inf"):
                raise ScheduleError(f"memory_limit must be finite and >= 0, got {x} for rank {r}")
        return out

    def over_limit(self, peaks: Sequence[float]) -> list[int]:
        """The ranks whose peak activation memory (``peaks[r]``) goes over ``memory_limit``;
        an empty list when everything fits or there is no limit.

        >>> CostModel(memory_limit=[4, 2]).over_limit([4.0, 3.0])
        [1]
        """
        limits = self.rank_limits(len(peaks))
        if limits is None:
            return []
        return [r for r, (x, cap) in enumerate(zip(peaks, limits, strict=True))
                if not fits_limit(x, cap)]

    def resolve(self, stages: int, chunks: int = 1) -> StageCosts:
        """Expand scalars to one value per stage, check everything, return StageCosts."""
        if stages < 1:
            raise ScheduleError(f"stages must be >= 1, got {stages}")
        if chunks < 1:
            raise ScheduleError(f"chunks must be >= 1, got {chunks}")

        def per_stage(name: str, value: Value) -> list[float]:
            if isinstance(value, int | float):
                out = [float(value) / chunks] * stages
            else:
                out = [float(x) for x in value]
                if len(out) != stages:
                    raise ScheduleError(
                        f"{name} has {len(out)} values; expected 1 or {stages} (one per stage)"
                    )
            for i, x in enumerate(out):
                if not x >= 0:  # also rejects NaN
                    raise ScheduleError(f"{name} must be >= 0, got {x} for stage {i}")
            return out

        f = per_stage("f", self.f)
        b = per_stage("b", self.b)
        w = per_stage("w", self.w)
        _part_of(w, b, "w", "b (W is part of the backward)")
        a2a_f = per_stage("a2a_f", self.a2a_f)
        a2a_b = per_stage("a2a_b", self.a2a_b)
        _part_of(a2a_f, f, "a2a_f", "f (the all-to-all is part of the forward)")
        _part_of(a2a_b, [x - y for x, y in zip(b, w, strict=True)], "a2a_b",
                 "b - w (the backward's all-to-all is part of I, not of W)")
        if not self.comm >= 0:
            raise ScheduleError(f"comm must be >= 0, got {self.comm}")
        if not 0 < self.overlap <= 1:
            raise ScheduleError(f"overlap must be in (0, 1], got {self.overlap}")
        if not 0 <= self.comm_sms < 1:
            raise ScheduleError(f"comm_sms must be in [0, 1), got {self.comm_sms}")
        mem = per_stage("activation_memory", self.activation_memory)
        mem_w = per_stage("weight_memory", self.weight_memory)
        mem_in = per_stage("input_memory", self.input_memory)
        _part_of(mem_w, mem, "weight_memory", "activation_memory")
        if isinstance(self.recompute, bool):
            rec = [self.recompute] * stages
        else:
            rec = [bool(x) for x in self.recompute]
            if len(rec) != stages:
                raise ScheduleError(f"recompute has {len(rec)} values; expected 1 or {stages}")
        return StageCosts(
            f=f, b=b, w=w, comm=float(self.comm), activation_memory=mem, weight_memory=mem_w,
            input_memory=mem_in, recompute=rec, overlap=float(self.overlap),
            allreduce=per_stage("allreduce", self.allreduce),
            i_extra=per_stage("i_extra", self.i_extra),
            a2a_f=a2a_f if any(a2a_f) else None, a2a_b=a2a_b if any(a2a_b) else None,
            comm_sms=float(self.comm_sms),
        )


def _part_of(part: list[float], whole: list[float], name: str, of: str) -> None:
    for s, (x, y) in enumerate(zip(part, whole, strict=True)):
        if x > y + 1e-12:
            raise ScheduleError(f"{name} must be <= {of}, got {x} > {y} for stage {s}")


class Part(NamedTuple):
    """One action as the Timeline records it: its duration, and the all-to-all inside it
    hidden behind another action's compute (an overlapped pair's) or exposed."""

    duration: float
    hidden: float
    exposed: float


@dataclass(frozen=True)
class StageCosts:
    """CostModel expanded to one value per stage; what the simulator reads."""

    f: list[float]
    b: list[float]
    w: list[float]
    comm: float
    activation_memory: list[float]
    weight_memory: list[float]
    input_memory: list[float]
    recompute: list[bool]
    overlap: float
    allreduce: list[float]
    i_extra: list[float] | None = None  # None: 0 on every stage
    a2a_f: list[float] | None = None  # None: 0 on every stage
    a2a_b: list[float] | None = None
    comm_sms: float = 0.0

    def a2a(self, stage: int, kind: str) -> float:
        """The all-to-all seconds inside one action: F's ``a2a_f``, B's or I's ``a2a_b``
        (with recomputation also the re-run forward's ``a2a_f``: it dispatches again), W's 0.

        >>> CostModel(f=2, b=4, w=1, a2a_f=1, a2a_b=1, recompute=True).resolve(1).a2a(0, "B")
        2.0
        """
        if kind == "W":
            return 0.0
        fwd = self.a2a_f[stage] if self.a2a_f else 0.0
        if kind == "F":
            return fwd
        return (self.a2a_b[stage] if self.a2a_b else 0.0) + (fwd if self.recompute[stage]
                                                            else 0.0)

    def key(self) -> tuple:
        """The costs as one hashable value (each per-stage list as a tuple): equal keys,
        equal costs, for the caches of what depends on the costs alone."""
        return tuple(tuple(v) if isinstance(v, list) else v
                     for v in (getattr(self, f.name) for f in fields(self)))

    @property
    def has_a2a(self) -> bool:
        """Whether any stage has all-to-all time (what the Timeline then records)."""
        return self.a2a_f is not None or self.a2a_b is not None

    def pair_duration(self, fwd_stage: int, bwd_stage: int, bwd_kind: str = "B"
                      ) -> tuple[float, float]:
        """(time, hidden all-to-all) of an overlapped pair: F of ``fwd_stage`` with the
        backward (``bwd_kind`` B or I) of ``bwd_stage``, as DualPipe runs it.

        The pair's compute ``C`` (both halves less their all-to-all) and its all-to-all ``A``
        run on two streams, each half's communication behind the other's compute, so the pair
        takes ``overlap x max(C, A)``; ``min(C, A)`` of the all-to-all is hidden. Without
        all-to-all this is ``overlap x (F + B)``, the constant factor of :class:`CostModel`.
        With ``comm_sms`` ``s``, the compute runs on ``1 - s`` of the SMs while the
        all-to-all runs and on all of them after: ``overlap x max(C + s A, A)``.

        >>> sc = CostModel(f=2, b=4, w=0, a2a_f=1, a2a_b=1).resolve(1)
        >>> sc.pair_duration(0, 0), sc.duration(0, "F") + sc.duration(0, "B")
        ((4.0, 2.0), 6.0)
        >>> CostModel(f=2, b=4, w=0, a2a_f=1, a2a_b=1, comm_sms=0.25).resolve(1).pair_duration(0, 0)
        (4.5, 2.0)
        """
        total = self.duration(fwd_stage, "F") + self.duration(bwd_stage, bwd_kind)
        comm = self.a2a(fwd_stage, "F") + self.a2a(bwd_stage, bwd_kind)
        compute = total - comm
        return (self.overlap * max(compute + self.comm_sms * comm, comm),
                min(compute, comm))

    def pair_parts(self, fwd_stage: int, bwd_stage: int, bwd_kind: str = "B"
                   ) -> tuple[Part, Part]:
        """The two parts of an overlapped pair as the Timeline records them, back to back:
        each a :class:`Part` (duration, hidden and exposed all-to-all). The pair's time
        (:meth:`pair_duration`) is shared in proportion to the parts' own times (without
        all-to-all: each part ``overlap x`` its time); each part's all-to-all is hidden in
        the pair's proportion ``hidden / A``, the rest is exposed (the all-to-all that
        outlasts the pair's compute, ``max(0, A - C)``).

        >>> sc = CostModel(f=2, b=4, w=0, a2a_f=1, a2a_b=1).resolve(1)
        >>> sc.pair_parts(0, 0)
        (Part(duration=1.3333333333333333, hidden=1.0, exposed=0.0), \
Part(duration=2.6666666666666665, hidden=1.0, exposed=0.0))
        """
        fwd = self.duration(fwd_stage, "F")
        bwd = self.duration(bwd_stage, bwd_kind)
        if not self.has_a2a:
            return Part(fwd * self.overlap, 0.0, 0.0), Part(bwd * self.overlap, 0.0, 0.0)
        time, hidden = self.pair_duration(fwd_stage, bwd_stage, bwd_kind)
        total = fwd + bwd
        scale = time / total if total > 0 else 0.0
        a_f, a_b = self.a2a(fwd_stage, "F"), self.a2a(bwd_stage, bwd_kind)
        share = hidden / (a_f + a_b) if a_f + a_b > 0 else 0.0
        return (Part(fwd * scale, a_f * share, a_f - a_f * share),
                Part(bwd * scale, a_b * share, a_b - a_b * share))

    def lone_part(self, stage: int, kind: str) -> Part:
        """An action run alone: its whole time, its all-to-all all exposed."""
        return Part(self.duration(stage, kind), 0.0, self.a2a(stage, kind))

    def duration(self, stage: int, kind: str) -> float:
        """Time of one action; with recomputation the backward re-runs the forward first."""
        extra = self.f[stage] if self.recompute[stage] else 0.0
        if kind == "F":
            return self.f[stage]
        if kind == "B":
            return self.b[stage] + extra
        if kind == "I":
            more = self.i_extra[stage] if self.i_extra else 0.0
            return self.b[stage] - self.w[stage] + more + extra
        if kind == "W":
            return self.w[stage]
        raise ScheduleError(f"unknown kind {kind!r}; valid are F, I, W, B")

    def memory_deltas(self, stage: int, kind: str) -> tuple[float, float]:
        """(added at the action's start, added at its end) to the rank's activation memory."""
        m_b, m_w = self.activation_memory[stage], self.weight_memory[stage]
        if self.recompute[stage]:
            kept = self.input_memory[stage]
            if kind == "F":
                return kept, 0.0
            if kind == "B":
                return m_b - kept, -m_b
            if kind == "I":
                return m_b - kept, -(m_b - m_w)
            return 0.0, -m_w
        if kind == "F":
            return m_b, 0.0
        if kind == "B":
            return 0.0, -m_b
        if kind == "I":
            return 0.0, -(m_b - m_w)
        return 0.0, -m_w
