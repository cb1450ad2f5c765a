"""Cut a chain of L layers into S contiguous stages so that the slowest stage is fastest.

This is the *chains-on-chains* partitioning problem (Bokhari 1988; Pinar & Aykanat 2004):
given non-negative layer costs ``c_0 .. c_{L-1}``, choose cut points
``0 = j_0 < j_1 < ... < j_S = L`` (every stage gets at least one layer) minimising the
bottleneck

    max_k  ( c[j_k] + ... + c[j_{k+1} - 1] + extra_k )

where ``extra_k`` is a fixed cost on the first stage (embedding, data loading) or the last
(loss), optionally subject to a memory cap per stage: stage k's memory, a sum of per-layer
weights that may differ by stage (early stages of 1F1B hold more microbatches in flight),
must not exceed ``cap_k``.

How (exact, not a greedy approximation):

1. *Feasibility of a bottleneck B* is decided exactly by a reachability sweep: ``R_k`` is
   the set of positions j such that the first j layers can be cut into k stages, each within
   B and within its memory cap. From a start i in ``R_k`` stage k can end anywhere in
   ``(i, reach_k(i)]`` because costs are non-negative (a longer stage never costs less), so
   ``R_{k+1}`` is a union of intervals, built in O(L) with a difference array.
   B is feasible iff L is in ``R_S``. (A plain greedy "fill each stage" is exact only
   without stage-dependent memory caps; the sweep is exact with them.)
2. *Search over integers.* Costs are made integers first (they already are for FLOPs
   and parameter counts; times in seconds are scaled so the total is 2^50 and rounded, an
   error of at most 2^-51 of the total per layer). Feasibility is monotone in B and the
   optimum is an integer, so bisection finds it exactly. Two shortcuts keep the number of
   sweeps small (~15 for 1,000 layers) without giving up exactness: a feasible probe drops
   the upper end to the bottleneck its cut actually achieves, and an infeasible probe
   raises the lower end to the smallest B at which any reachable stage could take one more
   layer (below it every ``R_k`` is unchanged, so every B below it is infeasible too).
3. *Reconstruction* walks back from L choosing, among the starts that keep the rest
   feasible, the one whose stage is closest to the average of what remains, then closest
   to the average layer count (``balanced``), or the earliest/latest start. Every choice
   has the optimal bottleneck; ties only change the other stages.

Cost: O(S · L log L) per sweep; 1,000 layers into 64 stages takes about 0.1 s
(``bench/bench_partition.py``). :func:`min_max_partition_dp` is the textbook O(L² S)
dynamic programme, kept as a reference and as the benchmark's baseline.

>>> min_max_partition([1, 2, 3, 4, 5, 6], 3)   # 1+2+3 | 4+5 | 6: the slowest costs 9
[(0, 2), (3, 4), (5, 5)]
>>> bottleneck([1, 2, 3, 4, 5, 6], [(0, 2), (3, 4), (5, 5)])
9.0
>>> min_max_partition([1, 1, 1, 1], 2, first_extra=2)   # stage 0 also pays 2
[(0, 0), (1, 3)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .errors import UserError

Ranges = list[tuple[int, int]]  # (first_layer, last_layer), inclusive, one per stage
TIE_BREAKS = ("balanced", "early", "late")
_SCALE_TOTAL = 2**50


class PartitionError(UserError):
    """The layers cannot be cut as asked (too many stages, memory caps, bad costs)."""


def bottleneck(costs: Sequence[float], ranges: Ranges, first_extra: float = 0.0,
               last_extra: float = 0.0) -> float:
    """The slowest stage's cost (with the first/last-stage extras) for a given cut."""
    return max(stage_sums(costs, ranges, first_extra, last_extra))


def stage_sums(costs: Sequence[float], ranges: Ranges, first_extra: float = 0.0,
               last_extra: float = 0.0) -> list[float]:
    """Each stage's cost: the sum of its layers' costs plus its extra."""
    out = [float(sum(costs[a:b + 1])) for a, b in ranges]
    out[0] += first_extra
    out[-1] += last_extra
    return out


def ranges_from_ends(ends: Sequence[int]) -> Ranges:
    """Stage ends (exclusive positions, the last is L) -> inclusive layer ranges."""
    out, start = [], 0
    for j in ends:
        out.append((start, j - 1))
        start = j
    return out


def check_stage_count(num_layers: int, num_stages: int) -> None:
    """More stages than layers: one line naming both and the largest stage count (every
    command that cuts a model says it in these words)."""
    n = num_layers
    if num_stages > n:
        raise PartitionError(f"the model has {n} layer{'s' if n != 1 else ''}, fewer than the "
                             f"{num_stages} stages (ranks x chunks); at most {n} stages can "
                             "run it (every stage needs a layer)")


def check_counts(num_layers: int, stages: int) -> None:
    if not isinstance(stages, int) or stages < 1:
        raise PartitionError(f"stages must be an integer >= 1, got {stages!r}")
    if num_layers < 1:
        raise PartitionError("there are no layers to cut; the model needs at least one layer")
    if stages > num_layers:
        raise PartitionError(
            f"cannot cut {num_layers} layers into {stages} stages: every stage needs at least "
            f"one layer (use at most {num_layers} stages)"
        )


def _check_costs(costs: Sequence[float], first_extra: float, last_extra: float) -> np.ndarray:
    arr = np.asarray(costs, dtype=np.float64)
    for i, c in enumerate(arr):
        if not (c >= 0 and math.isfinite(c)):
            raise PartitionError(f"cost of layer {i} must be finite and >= 0, got {c}")
    for name, e in (("first_extra", first_extra), ("last_extra", last_extra)):
        if not (e >= 0 and math.isfinite(e)):
            raise PartitionError(f"{name} must be finite and >= 0, got {e}")
    return arr


def _integers(arr: np.ndarray, extras: list[float]) -> tuple[np.ndarray, list[int]]:
    """Integer costs with the same optimum: as they are if integral, else scaled to 2^50."""
    top = max(float(arr.max()), *extras)
    small = top < 2**53 / (len(arr) + len(extras))  # then every sum is exact in a float
    integral = all(float(x).is_integer() for x in extras) and bool(np.all(arr == np.rint(arr)))
    if integral and small:
        return arr.astype(np.int64), [int(x) for x in extras]
    if top <= 0:
        return np.zeros(len(arr), dtype=np.int64), [0] * len(extras)
    # Normalise by the largest value first: neither a subnormal total nor one that would
    # overflow (values near 1e308) may break the scale.
    norm, ext = arr / top, [x / top for x in extras]
    scale = _SCALE_TOTAL / (float(norm.sum()) + sum(ext))
    return np.rint(norm * scale).astype(np.int64), [int(round(x * scale)) for x in ext]


def _memory_reach(memory: Sequence[Sequence[float]] | None,
                  memory_cap: float | Sequence[float] | None, stages: int, L: int
                  ) -> list[np.ndarray] | None:
    """Per stage k: for each start i, the furthest end j with memory[k][i:j] within cap_k."""
    if memory is None and memory_cap is None:
        return None
    if memory is None or memory_cap is None:
        raise PartitionError("memory caps need both per-layer memory and a cap")
    caps = ([float(memory_cap)] * stages if isinstance(memory_cap, int | float)
            else [float(c) for c in memory_cap])
    if len(caps) != stages:
        raise PartitionError(f"memory_cap has {len(caps)} values; expected 1 or {stages}")
    rows = [memory[0]] * stages if len(memory) == 1 else list(memory)
    if len(rows) != stages or any(len(r) != L for r in rows):
        raise PartitionError(f"memory must have 1 or {stages} rows of {L} values (stages x layers)")
    out, cache = [], {}
    for k in range(stages):
        if not caps[k] >= 0:
            raise PartitionError(f"memory cap must be >= 0, got {caps[k]} for stage {k}")
        m = np.asarray(rows[k], dtype=np.float64)  # (rows alike by their doubles: one answer)
        key = (m.tobytes(), caps[k])
        if key not in cache:
            if np.any(~(m >= 0)):
                raise PartitionError(f"memory of every layer must be >= 0 (stage {k})")
            q = np.concatenate(([0.0], np.cumsum(m)))
            cache[key] = np.searchsorted(q, q + caps[k], side="right") - 1
        out.append(cache[key])
    return out


class _Sweep:
    """Feasibility of a bottleneck B by reachability, on integer prefix sums."""

    def __init__(self, q: np.ndarray, extras: list[int], mem_reach: list[np.ndarray] | None):
        self.L, self.S = len(q), len(extras)
        self.P = np.concatenate(([0], np.cumsum(q))).astype(np.int64)
        self.extras = extras
        self.idx = np.arange(self.L + 1)
        # Stage k must end by L - (S - 1 - k) so later stages keep a layer each.
        self.limit = []
        for k in range(self.S):
            lim = np.full(self.L + 1, self.L - (self.S - 1 - k), dtype=np.int64)
            if mem_reach is not None:
                lim = np.minimum(lim, mem_reach[k])
            self.limit.append(lim)

    def run(self, B: int) -> tuple[bool, list[np.ndarray], list[np.ndarray], int]:
        """(feasible, R, reach, next): R[k] = positions reachable with k stages; reach[k][i] =
        the furthest end of stage k started at i; ``next`` = the smallest bottleneck above B
        at which some stage could take one more layer (nothing changes below it)."""
        L, P, idx = self.L, self.P, self.idx
        R = [idx == 0]
        reaches: list[np.ndarray] = []
        nxt = None
        for k in range(self.S):
            by_time = np.searchsorted(P, P + (B - self.extras[k]), side="right") - 1
            reach = np.minimum(by_time, self.limit[k])
            starts = np.flatnonzero(R[k])
            # One layer past the time limit, where the stage's other limits allow it.
            ext = np.maximum(by_time[starts], starts) + 1
            ok = ext <= self.limit[k][starts]
            if ok.any():
                v = int((P[ext[ok]] - P[starts[ok]]).min()) + self.extras[k]
                nxt = v if nxt is None else min(nxt, v)
            starts = starts[reach[starts] > starts]
            if starts.size == 0:
                return False, R, reaches, nxt
            diff = (np.bincount(starts + 1, minlength=L + 2)
                    - np.bincount(reach[starts] + 1, minlength=L + 2))
            R.append(np.cumsum(diff)[: L + 1] > 0)
            reaches.append(reach)
        return bool(R[self.S][L]), R, reaches, nxt


def min_max_partition(
    costs: Sequence[float],
    stages: int,
    *,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    memory: Sequence[Sequence[float]] | None = None,
    memory_cap: float | Sequence[float] | None = None,
    tie_break: str = "balanced",
    slack: float = 0.0,
) -> Ranges:
    """Cut ``costs`` into ``stages`` contiguous stages minimising the slowest stage.

    ``memory`` is one row of per-layer memory (every stage alike) or one row per stage;
    ``memory_cap`` a scalar or one cap per stage. ``slack`` > 0 allows a bottleneck up to
    ``(1 + slack)`` times the optimum (to produce near-optimal alternatives to score by
    simulation). Returns inclusive ``(first_layer, last_layer)`` per stage.
    Raises :class:`PartitionError` with the reason when no cut is possible.
    """
    if tie_break not in TIE_BREAKS:
        raise PartitionError(f"unknown tie_break {tie_break!r}; valid are {', '.join(TIE_BREAKS)}")
    L = len(costs)
    check_counts(L, stages)
    arr = _check_costs(costs, first_extra, last_extra)
    extras = [0.0] * stages
    extras[0] += first_extra
    extras[-1] += last_extra
    got = _min_max(arr, stages, extras, memory, memory_cap, tie_break, slack)
    if got is None:
        raise PartitionError(_memory_message(L, stages, memory, memory_cap))
    return got


def capped_partition(costs: Sequence[float], stages: int, memory: Sequence[Sequence[float]],
                     memory_cap: float | Sequence[float]) -> Ranges | None:
    """:func:`min_max_partition` under memory caps, or None where no cut fits them (no
    message built: a search asks this many times).

    >>> capped_partition([1, 1, 1, 1], 2, [[1, 1, 1, 1]], 2)
    [(0, 1), (2, 3)]
    >>> capped_partition([1, 1, 1, 1], 2, [[1, 1, 1, 1]], 1) is None
    True
    """
    L = len(costs)
    check_counts(L, stages)
    return _min_max(_check_costs(costs, 0.0, 0.0), stages, [0.0] * stages, memory,
                    memory_cap, "balanced", 0.0)


def capped_within(costs: Sequence[float], stages: int, memory: Sequence[Sequence[float]],
                  memory_cap: float | Sequence[float], bottleneck: float) -> bool:
    """False only when no cut under the memory caps keeps every stage's cost within
    ``bottleneck`` (one feasibility sweep, not the whole search; True may err by rounding,
    False never does).

    >>> capped_within([1, 1, 1, 1], 2, [[1, 1, 1, 1]], 3, 2.0)
    True
    >>> capped_within([1, 1, 1, 1], 2, [[3, 1, 1, 1]], 3, 2.0)  # stage 0 takes 1 layer
    False
    """
    arr = _check_costs(costs, 0.0, 0.0)
    L = len(arr)
    check_counts(L, stages)
    q, qe = _integers(arr, [0.0] * stages)
    top = float(arr.max())
    if top <= 0 or not math.isfinite(bottleneck):
        return True
    if np.array_equal(q, arr):  # integral costs, taken as they are
        B = math.floor(bottleneck)
    else:  # scaled: q = rint(arr x units); a stage's integer sum exceeds its cost x units
        units = float(q.max()) / top  # by at most half a unit per layer: L units cover it
        B = math.floor(bottleneck * units * (1 + 1e-9)) + L + 1
    if B >= int(q.sum()):
        return True
    return _Sweep(q, qe, _memory_reach(memory, memory_cap, stages, L)).run(B)[0]


_KEPT: dict = {}  # _min_max's answers by their input (a planner asks the same cut often)


def _min_max(arr: np.ndarray, stages: int, extras: list[float], memory, memory_cap,
             tie_break: str, slack: float) -> Ranges | None:
    """:func:`_min_max_cut`, kept by its input (the costs' and memory's float64 bytes,
    which are all it reads); callers get a fresh list."""
    try:
        key = (arr.tobytes(), len(arr), stages, tuple(extras),
               None if memory is None else tuple(
                   np.asarray(r, dtype=np.float64).tobytes() for r in memory),
               memory_cap if memory_cap is None or isinstance(memory_cap, int | float)
               else tuple(float(c) for c in memory_cap), tie_break, slack)
    except (TypeError, ValueError):  # not something the cut takes: let it say why
        return _min_max_cut(arr, stages, extras, memory, memory_cap, tie_break, slack)
    if key not in _KEPT:
        if len(_KEPT) >= 4096:
            _KEPT.clear()
        _KEPT[key] = _min_max_cut(arr, stages, extras, memory, memory_cap, tie_break, slack)
    got = _KEPT[key]
    return None if got is None else list(got)


def _min_max_cut(arr: np.ndarray, stages: int, extras: list[float], memory, memory_cap,
                 tie_break: str, slack: float) -> Ranges | None:
    q, qe = _integers(arr, extras)
    L = len(arr)
    sweep = _Sweep(q, qe, _memory_reach(memory, memory_cap, stages, L))
    hi = int(sweep.P[-1]) + max(qe)
    if memory is not None and not sweep.run(hi)[0]:  # without caps every S <= L cut fits
        return None
    lo = max(int(q.max()), -(-(int(sweep.P[-1]) + sum(qe)) // stages),
             qe[0] + int(q[0]), qe[-1] + int(q[-1]))
    # Invariant: every B < lo is infeasible, hi is the bottleneck of a feasible cut.
    if memory is None and not any(qe):
        # Every stage alike (no caps, no extras): filling each stage as far as it goes
        # decides a bottleneck exactly (a later start never reaches less far), on the
        # integer prefix sums in plain Python (bisect), far cheaper than the sweep; and
        # the reachable positions are intervals, so the cut is rebuilt without it too.
        P = sweep.P.tolist()
        best = _greedy_optimum(P, stages, lo, hi)
        if slack > 0:
            best = max(best, math.floor(best * (1 + slack)))
        return ranges_from_ends(_reconstruct_alike(P, stages, best, tie_break))
    # Without memory caps the optimum is at most lo + the largest layer (fill stages
    # greedily); probing there first halves the search.
    probe = lo + int(q.max()) + max(qe)
    while lo < hi:
        mid = probe if lo <= probe < hi else (lo + hi) // 2
        probe = -1
        ok, R, reach, nxt = sweep.run(mid)
        if ok:  # snap to what the cut actually achieves (<= mid)
            hi = _achieved(sweep, _reconstruct(sweep, R, reach, "early"))
        else:  # nothing changes until some stage can take one more layer
            lo = max(mid + 1, nxt if nxt is not None else hi)
    best = hi
    if slack > 0:
        best = max(best, math.floor(best * (1 + slack)))
    ok, R, reach, _ = sweep.run(best)
    assert ok
    return ranges_from_ends(_reconstruct(sweep, R, reach, tie_break))


def _greedy_optimum(P: list[int], stages: int, lo: int, hi: int) -> int:
    """The least feasible integer bottleneck in ``[lo, hi]`` (``hi`` feasible) when every
    stage is alike: a bottleneck B is feasible iff filling each stage as far as B allows
    reaches the end; a feasible probe drops ``hi`` to what its cut achieves, an infeasible
    one raises ``lo`` to the least bottleneck at which some stage takes one more layer."""
    from bisect import bisect_right

    L = len(P) - 1
    while lo < hi:
        B = (lo + hi) // 2
        i, worst, nxt = 0, 0, hi
        for k in range(stages):
            limit = L - (stages - 1 - k)
            j = min(bisect_right(P, P[i] + B) - 1, limit)
            if j <= i:
                break
            if j < limit:  # what this stage needs to take one more layer
                nxt = min(nxt, P[j + 1] - P[i])
            worst = max(worst, P[j] - P[i])
            i = j
        if i == L:
            hi = worst
        else:  # below nxt no stage takes one more layer: the same fill, still short
            lo = max(B + 1, nxt)
    return hi


def _reconstruct_alike(P: list[int], S: int, B: int, tie_break: str) -> list[int]:
    """:func:`_reconstruct` when every stage is alike and ``B`` is feasible (and at least
    the largest layer): the positions reachable after k stages are the interval
    ``[k, top_k]`` (each start reaches one layer further or more), and stage k may start
    at i < j and end at j iff ``P[j] - P[i] <= B``, so the candidates are an interval too;
    the same choice among them as :func:`_reconstruct` makes, found by bisection."""
    from bisect import bisect_left, bisect_right

    L = len(P) - 1
    top = [0]
    for k in range(S - 1):
        i = min(top[-1], L - (S - 1 - k) - 1)
        top.append(min(bisect_right(P, P[i] + B) - 1, L - (S - 1 - k)))
    ends, j = [L], L
    for k in range(S - 1, 0, -1):
        lo, hi = max(k, bisect_left(P, P[j] - B)), min(top[k], j - 1)
        if tie_break == "early":
            i = hi
        elif tie_break == "late":
            i = lo
        else:  # the cost closest to the mean of what remains, then the layer count
            target = P[j] / (k + 1)
            mean = j / (k + 1)
            x = bisect_left(P, P[j] - target, lo, hi + 1)
            values = {P[y] for y in (x - 1, x) if lo <= y <= hi}
            d = min(abs((P[j] - v) - target) for v in values)
            best = None
            for v in sorted(values):
                if abs((P[j] - v) - target) != d:
                    continue
                for y in range(max(lo, bisect_left(P, v)), min(hi, bisect_right(P, v) - 1) + 1):
                    key = (abs((j - y) - mean), y)
                    if best is None or key < best:
                        best = key
            i = best[1]
        ends.append(i)
        j = i
    return sorted(ends)


def _achieved(sweep: _Sweep, ends: list[int]) -> int:
    starts = [0, *ends[:-1]]
    return max(int(sweep.P[j] - sweep.P[i]) + e for i, j, e in zip(starts, ends, sweep.extras,
                                                                    strict=True))


def _reconstruct(sweep: _Sweep, R: list[np.ndarray], reach: list[np.ndarray],
                 tie_break: str) -> list[int]:
    """Walk back from L: stage k starts at some i in R[k] whose reach covers the current end."""
    P, ends, j = sweep.P, [sweep.L], sweep.L
    for k in range(sweep.S - 1, 0, -1):
        cand = np.flatnonzero(R[k][:j] & (reach[k][:j] >= j))
        if tie_break == "early":  # stages before k as full as they can be
            i = int(cand[-1])
        elif tie_break == "late":
            i = int(cand[0])
        else:  # stage k's cost closest to the mean of what remains, then its layer count
            target = (P[j] + sum(sweep.extras[: k + 1])) / (k + 1)
            cost = P[j] - P[cand] + sweep.extras[k]
            order = np.lexsort((np.abs((j - cand) - j / (k + 1)), np.abs(cost - target)))
            i = int(cand[order[0]])
        ends.append(i)
        j = i
    return sorted(ends)


def _memory_message(L: int, stages: int, memory, memory_cap) -> str:
    rows = [list(memory[0])] * stages if len(memory) == 1 else [list(r) for r in memory]
    low = [min(r[i] for r in rows) for i in range(L)]  # each layer at its cheapest stage
    worst = max(range(L), key=lambda i: low[i])
    if isinstance(memory_cap, int | float):
        cap_text = f"cap {memory_cap:g} per stage"
    else:
        cap_text = f"caps {', '.join(f'{c:g}' for c in memory_cap)}"
    return (
        f"no cut of {L} layers into {stages} stages keeps every stage within its memory "
        f"{cap_text}: the layers need at least {sum(low):g} in all "
        f"({sum(low) / stages:g} per stage on average) and layer {worst} alone {low[worst]:g}; "
        "raise the cap or use more stages"
    )


def min_max_partition_dp(
    costs: Sequence[float],
    stages: int,
    *,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    memory: Sequence[Sequence[float]] | None = None,
    memory_cap: float | Sequence[float] | None = None,
) -> Ranges:
    """The textbook O(L² S) dynamic programme for the same problem (a reference).

    ``D[k][j]`` = the best bottleneck for the first j layers in k stages
    = ``min_i max(D[k-1][i], cost(i, j) + extra_{k-1})`` over starts i whose stage fits its
    memory cap. Same integer costs as :func:`min_max_partition`, so the optima are equal.
    """
    L = len(costs)
    check_counts(L, stages)
    arr = _check_costs(costs, first_extra, last_extra)
    extras = [0.0] * stages
    extras[0] += first_extra
    extras[-1] += last_extra
    q, qe = _integers(arr, extras)
    P = np.concatenate(([0], np.cumsum(q))).astype(np.float64)
    mreach = _memory_reach(memory, memory_cap, stages, L)
    D = np.full(L + 1, np.inf)
    D[0] = 0.0
    arg = np.zeros((stages, L + 1), dtype=np.int64)
    for k in range(stages):
        Dn = np.full(L + 1, np.inf)
        for j in range(k + 1, L - (stages - 1 - k) + 1):
            i = np.arange(k, j)
            val = np.maximum(D[i], P[j] - P[i] + qe[k])
            if mreach is not None:
                val = np.where(mreach[k][i] >= j, val, np.inf)
            best = int(np.argmin(val))
            Dn[j], arg[k, j] = val[best], i[best]
        D = Dn
    if not math.isfinite(D[L]):
        raise PartitionError(_memory_message(L, stages, memory, memory_cap))
    ends, j = [L], L
    for k in range(stages - 1, 0, -1):
        j = int(arg[k, j])
        ends.append(j)
    return ranges_from_ends(sorted(ends))


_BALANCED: dict = {}  # balance_ranks's answers by input (the planner repeats cuts)


def balance_ranks(costs: np.ndarray, ranges: Ranges, where: tuple[int, ...]) -> Ranges:
    """:func:`_balance_ranks`, kept by its input (the costs' dtype and bytes, the ranges and
    the placement); callers get a fresh list."""
    arr = np.asarray(costs)
    key = (arr.dtype.str, arr.shape, arr.tobytes(), tuple(ranges), tuple(where))
    got = _BALANCED.get(key)
    if got is None:
        if len(_BALANCED) >= 4096:
            _BALANCED.clear()
        got = _BALANCED[key] = _balance_ranks(costs, ranges, where)
    return list(got)


def _balance_ranks(costs: np.ndarray, ranges: Ranges, where: tuple[int, ...]) -> Ranges:
    """Move single stage boundaries while the loads of the ranks, sorted from the largest,
    fall (lexicographically). The min-max cut balances stages; a rank holding several
    (interleaved, V placement, DualPipe's two copies: stage ``s`` holds the layers of
    ``ranges[s mod len(ranges)]``) carries their sum.

    >>> balance_ranks(np.ones(6), [(0, 2), (3, 3), (4, 4), (5, 5)],
    ...               (0, 1, 1, 0))   # V: rank 0 holds stages 0 and 3 (load 4 against 2)
    [(0, 1), (2, 3), (4, 4), (5, 5)]
    """
    q = np.concatenate(([0.0], np.cumsum(costs)))
    n = len(ranges)
    ranks = np.asarray(where)
    copy = np.arange(len(where)) % n  # stage -> its range
    size = int(ranks.max()) + 1

    def loads(ends: list[int]) -> tuple:
        e = np.asarray(ends)
        d = q[e] - q[np.concatenate(([0], e[:-1]))]
        # bincount adds in stage order, as a loop over the stages would
        per = np.bincount(ranks, weights=d[copy], minlength=size)
        return tuple(np.sort(per)[::-1].tolist())

    ends = [b + 1 for _, b in ranges]
    best = loads(ends)
    improved = True
    while improved:
        improved = False
        for k in range(n - 1):
            for step in (-1, 1):
                e = ends[k] + step
                if not (ends[k - 1] if k else 0) < e < ends[k + 1]:
                    continue
                trial = [*ends[:k], e, *ends[k + 1:]]
                value = loads(trial)
                if value < best:
                    ends, best, improved = trial, value, True
    return ranges_from_ends(ends)
