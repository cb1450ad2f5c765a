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
    paths = _kept_paths(sc, tuple(stage_to_rank))
    dur, succ, order, release, tail = paths[:5]
    trips = paths[5]  # stage -> its round trip F .. I (costs and placement alone)
    f = [sc.duration(s, "F") for s in range(S)]
    i = [sc.duration(s, "I") for s in range(S)]
    w = [sc.duration(s, "W") for s in range(S)]
    busiest = 0.0
    fill = max(release[a] + tail[a] for a in order)
    for mine in _stages_of(stage_to_rank):
        if not mine:
            continue
        head = min(release[Action(s, "F", 0)] for s in mine)
        busiest = max(busiest, head + m * sum(f[s] + i[s] + w[s] for s in mine))
        after = min(tail[Action(s, "I", 0)] - i[s] for s in mine)
        fill = max(fill, head + m * sum(f[s] + i[s] for s in mine) + after)
    by_kind = {"busiest rank": busiest, "fill and drain": fill}
    if limits is not None or held is not None:
        memory = 0.0
        nested = 0.0 if held is not None else _nested(sc, stage_to_rank)
        for s in range(S):
            if held is not None:
                k = held[s]
            else:
                kept = nested[s]
                limit = limits[stage_to_rank[s]]
                if sum(sc.memory_deltas(s, "F")) <= 0:
                    continue
                k = int(limit // kept) + 1
                while k > 0 and not fits_limit(k * kept, limit):
                    k -= 1
            if k >= m or k <= 0:
                continue  # no constraint (k = 0: below the smallest limit, refused elsewhere)
            fa = Action(s, "F", 0)
            if not trips:  # every stage's round trip, in one pass (kept with the paths)
                trips.update(_trips(S, dur, succ, order))
            memory = max(memory, release[fa] + (m - 1) // k * trips[s] + tail[fa])
        if limits is not None:  # the area each microbatch holds, against the limit's
            if not trips:
                trips.update(_trips(S, dur, succ, order))
            for r, mine in enumerate(_stages_of(stage_to_rank)):
                if not mine or limits[r] <= 0:
                    continue
                area = m * sum(sum(sc.memory_deltas(s, "F")) * trips[s]
                               + sc.weight_memory[s] * w[s] for s in mine)
                if area > 0:
                    head = min(release[Action(s, "F", 0)] for s in mine)
                    memory = max(memory, head + area / limits[r])
        if memory > 0:  # some stage's limit binds
            by_kind["memory"] = memory
    kind = max(by_kind, key=lambda k: (by_kind[k], -KINDS.index(k)))
    return LowerBound(by_kind[kind], kind, by_kind)


def _nested(sc: StageCosts, stage_to_rank: tuple[int, ...]) -> list[float]:
    """Per stage s, what a microbatch holds on s's rank while it is in flight on s (its F
    on s begun, its I there not ended): what its F left on s and on every earlier stage of
    that rank, whose I comes after s's (the gradient flows back through s first)."""
    out, seen = [], {}
    for s, r in enumerate(stage_to_rank):
        seen[r] = seen.get(r, 0.0) + sum(sc.memory_deltas(s, "F"))
        out.append(seen[r])
    return out


KEEP_PATHS = 256  # (costs, placement) whose paths are kept, at most
_PATHS: OrderedDict[tuple, tuple] = OrderedDict()


def _kept_paths(sc: StageCosts, where: tuple[int, ...]) -> tuple:
    """:func:`_paths` and a dict of the round trips :func:`bound` has measured, kept per
    (costs, placement): they depend on nothing else, and the planner asks the bound of the
    same costs under a limit per sharding and at every microbatch count."""
    key = (sc.key(), where)
    got = _PATHS.get(key)
    if got is not None:
        _PATHS.move_to_end(key)
        return got
    got = _PATHS[key] = (*_paths(sc, where), {})
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
    out = []
    for mine in _stages_of(stage_to_rank):
        held = sum(sum(sc.memory_deltas(s, "F")) for s in mine)
        extra = max((sc.memory_deltas(s, "I")[0] for s in mine), default=0.0)
        out.append(held + extra)
    return out
