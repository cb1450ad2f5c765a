"""What no order can beat: a lower bound on the step time, and the smallest memory limit.

**Lower bound**: the best of three provable bounds, each named by its kind
(:class:`LowerBound`). All read the paths of one microbatch through the dependency rule
(:func:`~pipebubble.ir.deps.precedences` over its F, I and W actions, ``comm`` on hops):
``release(a)``, the longest path before action ``a`` starts, and ``tail(a)``, the longest
path from its start to the end of the microbatch (its own time included).

- **busiest rank**: rank r's first action is a forward, which cannot start before its input
  has gone through every earlier stage (``head_r``, the least release of r's forwards); from
  then on the rank is busy ``busy_r`` = m x its F + I + W at least:
  ``step >= head_r + busy_r``.
- **fill and drain**: one microbatch's whole path (the longest release + tail); and, per
  rank, the last of its F and I actions is an I (each F comes before its own I on the same
  rank), after which that microbatch's gradient still has to reach the end of its path:
  ``step >= head_r + m x (F + I of r's stages) + min over r's stages s of (tail(I_s) - I_s)``.
- **memory** (with a limit, for orders that run each stage's microbatches in order, as
  every schedule here does): a microbatch holds what its F on stage s leaves (``M_B``, or
  the kept input under recomputation) until its I there ends, and all that time also what
  it left on the earlier stages of s's rank (their I's come after s's: the V's second
  stage on a rank nests in its first, an interleaved chunk in the chunks before it). If
  rank r's limit holds at most k microbatches' worth of that, ``F(s, j + k)`` cannot
  start before ``I(s, j)`` has ended, so the forwards
  of microbatches 0, k, 2k, ... are each a round trip ``F(s) .. I(s)`` apart:
  ``step >= release(F_s) + floor((m - 1) / k) x trip(s) + tail(F_s)``. And by area: each
  microbatch holds what its F on s left for at least the round trip, and ``M_W`` for at
  least its W after that, all of it on the rank between its first forward's release and
  the step's end, under the limit: ``step >= head_r + m x sum over r's stages of (kept_s x
  trip(s) + M_W,s x W_s) / limit_r``.

>>> from pipebubble.costs import CostModel
>>> lower_bound(CostModel().resolve(4), (0, 1, 2, 3), 8)  # 3m + p - 1 with F = I = W = 1
27.0
>>> b = bound(CostModel().resolve(2), (0, 1), 3, limits=[1, 1])  # one microbatch in flight
>>> b.value, b.kind, b.by_kind["busiest rank"]
(13.0, 'memory', 10.0)

**Smallest limit.** A microbatch's activation stays on a rank from its F on a stage until
the I of the rank's *last* stage it passes through starts (that I needs the gradient that
comes back through the later stages), so a rank holds, at the very least, one forward of
each of its stages at once, plus what recomputation re-materialises at an I:
``need_r = sum of M_B over r's stages (+ the largest recomputed M_B)``. Any limit at or above
it is feasible (one microbatch at a time); below it nothing is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ...costs import StageCosts, fits_limit
from ...ir.deps import Layout, precedences
from ...ir.schedule import Action

KINDS = ("busiest rank", "fill and drain", "memory")


@dataclass(frozen=True)
class LowerBound:
    """The best provable bound (``value``), which kind gives it, and every kind's value."""

    value: float
    kind: str
    by_kind: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"value": self.value, "kind": self.kind, "by_kind": dict(self.by_kind)}


def _stages_of(stage_to_rank: tuple[int, ...]) -> list[list[int]]:
    p = max(stage_to_rank) + 1
    return [[s for s, r in enumerate(stage_to_rank) if r == q] for q in range(p)]


@lru_cache(maxsize=256)
def _dag(where: tuple[int, ...]) -> tuple:
    """One microbatch's F, I and W actions on placement ``where``, the dependency rule's
    edges among them (successors, each with whether it crosses ranks) and a topological
    order: the placement's alone, whatever the costs."""
    S = len(where)
    acts = [Action(s, k, 0) for s in range(S) for k in "FIW"]
    succ: dict[Action, list[tuple[Action, bool]]] = {a: [] for a in acts}
    count = dict.fromkeys(acts, 0)
    for e in precedences(acts, Layout(S, tuple(where), (0,))):
        succ[e.before].append((e.after, e.crosses))
        count[e.after] += 1
    order = [a for a in acts if not count[a]]
    for a in order:
        for b, _ in succ[a]:
            count[b] -= 1
            if not count[b]:
                order.append(b)
    return acts, succ, tuple(order)


def _paths(sc: StageCosts, where: tuple[int, ...]):
    """One microbatch's DAG: durations, successors with lags, a topological order,
    ``release`` and ``tail`` of every action (see the module docstring)."""
    acts, edges, order = _dag(tuple(where))
    dur = {a: sc.duration(a.stage, a.kind) for a in acts}
    comm = sc.comm
    succ = {a: [(b, comm if crosses else 0.0) for b, crosses in out]
            for a, out in edges.items()}
    release = dict.fromkeys(acts, 0.0)
    for a in order:
        for b, lag in succ[a]:
            release[b] = max(release[b], release[a] + dur[a] + lag)
    tail = dict(dur)
    for a in reversed(order):
        for b, lag in succ[a]:
            tail[a] = max(tail[a], dur[a] + lag + tail[b])
    return dur, succ, order, release, tail


def bound(sc: StageCosts, stage_to_rank: tuple[int, ...], microbatches: int,
          limits: Sequence[float] | None = None,
          held: Sequence[int] | None = None) -> LowerBound:
    """The best of the provable bounds (see the module docstring), named by kind; the
    memory kind only with ``limits`` (one per rank) or ``held``: of one order, how many
    microbatches each stage holds at once (an F not yet followed by its I or B, in the
    rank's order: :func:`~pipebubble.plan.families.held_per_stage` until B/I). Then k is
    that count, whatever the memory: in an order that runs each stage's microbatches in
    order and holds at most k of them, ``F(s, j + k)`` comes after ``I(s, j)`` (or its B,
    which ends later) on the rank, so the round trips bound that order's step."""
    S, m = len(stage_to_rank), microbatches
    fr = _kept_frame(sc, tuple(stage_to_rank))
    if limits is not None or held is not None:
        kept, nested, m_w = _memory(sc, stage_to_rank)
    busiest = max((h + m * x for h, x in zip(fr.head, fr.busy, strict=True)), default=0.0)
    fill = max([fr.path] + [h + m * x + a for h, x, a in zip(fr.head, fr.fi, fr.after,
                                                             strict=True)])
    by_kind = {"busiest rank": busiest, "fill and drain": fill}
    if limits is not None or held is not None:
        memory = 0.0
        for s in range(S):
            if held is not None:
                k = held[s]
            else:
                if kept[s] <= 0:
                    continue
                need, limit = nested[s], limits[stage_to_rank[s]]
                k = int(limit // need) + 1
                while k > 0 and not fits_limit(k * need, limit):
                    k -= 1
            if k >= m or k <= 0:
                continue  # no constraint (k = 0: below the smallest limit, refused elsewhere)
            memory = max(memory, fr.release_f[s] + (m - 1) // k * fr.trips()[s]
                         + fr.tail_f[s])
        if limits is not None:  # the area each microbatch holds, against the limit's
            trips, w = fr.trips(), fr.w
            for r, mine in enumerate(fr.stages):
                area = sum(kept[s] * trips[s] + m_w[s] * w[s] for s in mine)
                if area > 0 and limits[r] > 0:
                    memory = max(memory, fr.head_of[r] + m * area / limits[r])
        if memory > 0:  # some stage's limit binds
            by_kind["memory"] = memory
    kind = max(by_kind, key=lambda k: (by_kind[k], -KINDS.index(k)))
    return LowerBound(by_kind[kind], kind, by_kind)


def _memory(sc: StageCosts, where: tuple[int, ...]) -> tuple[list, list, list]:
    """Per stage what its F keeps, what a microbatch holds on its rank while in flight
    there (its F on the stage begun, its I there not ended: what its F left on the stage
    and on every earlier stage of that rank, whose I comes after this one's) and M_W: the
    memory :func:`bound` reads (the frame is the time's)."""
    kept = [sum(sc.memory_deltas(s, "F")) for s in range(len(where))]
    out, seen = [], {}
    for s, r in enumerate(where):
        seen[r] = seen.get(r, 0.0) + kept[s]
        out.append(seen[r])
    return kept, out, list(sc.weight_memory)


class _Frame:
    """What :func:`bound` reads of one placement's durations and comm, whatever the
    microbatches, limits and memory: per rank with stages its first forward's release
    (``head``), its F + I + W (``busy``) and F + I (``fi``) per microbatch and the least
    path after its last I (``after``); one microbatch's whole path; per stage its F's
    release and tail; the round trips, made when first asked (a pass over the DAG)."""

    def __init__(self, sc: StageCosts, where: tuple[int, ...]):
        dur, succ, order, release, tail = _paths(sc, where)
        self._dag = (len(where), dur, succ, order)
        S = len(where)
        f = [sc.duration(s, "F") for s in range(S)]
        i = [sc.duration(s, "I") for s in range(S)]
        self.w = [sc.duration(s, "W") for s in range(S)]
        self.path = max(release[a] + tail[a] for a in order)
        self.release_f = [release[Action(s, "F", 0)] for s in range(S)]
        self.tail_f = [tail[Action(s, "F", 0)] for s in range(S)]
        self.stages = _stages_of(where)
        self.head_of = [min((self.release_f[s] for s in mine), default=0.0)
                        for mine in self.stages]
        full = [mine for mine in self.stages if mine]
        self.head = [h for h, mine in zip(self.head_of, self.stages, strict=True) if mine]
        self.busy = [sum(f[s] + i[s] + self.w[s] for s in mine) for mine in full]
        self.fi = [sum(f[s] + i[s] for s in mine) for mine in full]
        self.after = [min(tail[Action(s, "I", 0)] - i[s] for s in mine) for mine in full]
        self._trips: dict[int, float] | None = None

    def trips(self) -> dict[int, float]:
        """Every stage's round trip F .. I (:func:`_trips`), once."""
        if self._trips is None:
            self._trips = _trips(*self._dag)
        return self._trips


KEEP_PATHS = 256  # (costs, placement) whose frames are kept, at most
_PATHS: OrderedDict[tuple, _Frame] = OrderedDict()


def _kept_frame(sc: StageCosts, where: tuple[int, ...]) -> _Frame:
    """:class:`_Frame` of (durations and comm, placement), kept: it depends on nothing
    else, and the planner asks the bound of the same durations under a limit and memory
    per sharding and at every microbatch count."""
    key = (tuple(sc.f), tuple(sc.b), tuple(sc.w), sc.comm, tuple(sc.recompute),
           tuple(sc.i_extra) if sc.i_extra else None, where)  # what the durations read
    got = _PATHS.get(key)
    if got is not None:
        _PATHS.move_to_end(key)
        return got
    got = _PATHS[key] = _Frame(sc, where)
    while len(_PATHS) > KEEP_PATHS:
        _PATHS.popitem(last=False)
    return got


def _trips(S: int, dur, succ, order) -> dict[int, float]:
    """Every stage's round trip, the longest path from its F's start to its I's end, in one
    pass over the topological ``order`` for all S sources at once (one row of path lengths
    per action, a column per source; unreachable: -inf): each action's column is final once
    the scan reaches it, and a path's length is summed action by action along it (start,
    plus the action's time, plus the lag to the next), whichever source it is from."""
    import numpy as np

    row = {a: n for n, a in enumerate(order)}
    at = np.full((len(order), S), -np.inf)
    for s in range(S):
        at[row[Action(s, "F", 0)], s] = 0.0
    for a in order:
        out = succ[a]
        if not out:
            continue
        t0 = at[row[a]] + dur[a]
        for b, lag in out:
            dst = at[row[b]]
            np.maximum(dst, t0 + lag, out=dst)
    return {s: float(at[row[Action(s, "I", 0)], s] + dur[Action(s, "I", 0)])
            for s in range(S)}


def lower_bound(sc: StageCosts, stage_to_rank: tuple[int, ...], microbatches: int,
                limits: Sequence[float] | None = None) -> float:
    """A step time no order of the split-backward (F, I, W) actions can beat: the value of
    :func:`bound`."""
    return bound(sc, stage_to_rank, microbatches, limits).value


def min_limits(sc: StageCosts, stage_to_rank: tuple[int, ...]) -> list[float]:
    """Per rank, the smallest activation-memory limit any order can run under; see above."""
    kept = _memory(sc, stage_to_rank)[0]
    out = []
    for mine in _stages_of(stage_to_rank):
        held = sum(kept[s] for s in mine)
        extra = max((sc.memory_deltas(s, "I")[0] for s in mine), default=0.0)
        out.append(held + extra)
    return out
