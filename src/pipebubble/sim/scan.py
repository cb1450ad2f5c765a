"""The clock's ends by whole-rank scans: the kernel's result with no Python step per action.

The kernel's loop (``sim/kernel.py``) times a step as ``end[i] = max(end[i - 1], ready[i])
+ d[i]``, where ``ready[i]`` is ``end[producer[i]] + lag[i]`` (a block: the larger of two
such). A rank's steps are one chain, so once every ``ready`` is known its ends are a
*max-plus scan*: with ``S`` the running sum of the rank's durations (``P[i] = S[i] - d[i]``,
the sum before step i),

    end[i] = S[i] + max(0, max over j <= i of (ready[j] - P[j])),

one ``numpy.maximum.accumulate`` per rank. The ``ready`` times come from other ranks' ends,
so :func:`solve` iterates: it starts every end at its rank's own chain (``S``, a lower bound:
a step never ends before its rank's earlier work is done), and recomputes a rank from the
current ends whenever a rank it waits for has changed, sweeping the ranks downstream then
upstream (1F1B's forwards flow down, its backwards up). Every value only grows and stays a
lower bound of the longest path; when a sweep changes nothing, the ends satisfy the loop's
equation at every step, and on an acyclic program that equation has one solution: the
loop's. 1F1B, DualPipe and DualPipeV without comm settle in 3 or 4 sweeps. Where the ranks
wait for each other at every step (a comm lag), the longest path zigzags between ranks once
per microbatch and each sweep settles one more zigzag: :func:`solve` gives up after
:data:`SWEEPS` sweeps, declines programs with a lag from the start, and the kernel runs its
loop.

**The same doubles.** The scan adds in another order than the loop (``S[i] + (ready[j] -
P[j])`` where the loop adds ``d[j] + ... + d[i]`` to ``ready[j]``), which in floating point
can differ in the last bit. :func:`solve` therefore runs only where every addition is exact,
so that any order gives the one real sum: every duration and lag a multiple of ``2**-K``
and every sum the program can form (at most all durations plus a lag per step) below
``2**(51 - K)`` in magnitude, for one K >= 0 (the default costs are integers). Otherwise
it declines, as it does for a step of no duration (a cycle of such steps, a deadlock the
loop would report, could look settled) and for a negative lag.

>>> import numpy as np
>>> # rank 0: steps 1, 2 (1 and 2 long); rank 1: step 4, 3 long, waits for step 1 + 0.5
>>> # (step 0: a boundary, which ends at 0, is what a step without a dependency waits for)
>>> end = np.array([0.0, np.inf, np.inf, 0.0, np.inf, 0.0])
>>> solve([np.array([0, 0, 0, 0, 1, 0])], [np.array([0, 0, 0, 0, 0.5, 0])],
...       [np.array([0, 1, 2, 0, 3, 0.0])], [1, 4], [2, 4], end, lagged=True)
True
>>> end[[1, 2, 4]].tolist()
[1.0, 3.0, 4.5]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SWEEPS = 8
"""Sweeps over the ranks after which :func:`solve` gives up. 1F1B, GPipe, interleaved 1F1B,
ZB-H1/H2, DualPipe and DualPipeV settle in 3 or 4 without comm, V-Min in 7 with f = 1,
b = 2, w = 1 (p = 4 … 32, m = 256 … 2,048; its loop then takes 3 to 4 times the scan's time),
V-Half in 5 to 21 depending on the costs; a program that zigzags needs about one per
microbatch. A sweep costs a 15th to a 25th of the loop (1F1B p=64 m=8192), so giving up
costs the loop about 30 to 40 % more. With a comm lag every family but GPipe zigzags (rank
r+1's F waits for rank r's at every step), so :func:`solve` does not try programs with a
lag other than 0 (unless asked: the tests)."""

SCAN_FROM = 2048
"""Steps from which the kernel tries :func:`solve` before its loop, if the ranks have
:data:`PER_RANK` steps each on average too (below that the dozen numpy calls per rank and
sweep cost more than the loop's steps: 1F1B p=64 m=32, 64 steps a rank, takes the scan twice
the loop's time; at 256 steps a rank three quarters)."""

PER_RANK = 192


def worth_trying(steps: int, ranks: int) -> bool:
    """Whether a program of ``steps`` steps over ``ranks`` ranks is large enough for
    :func:`solve` to beat the loop (:data:`SCAN_FROM`, :data:`PER_RANK`)."""
    return steps >= SCAN_FROM and steps >= PER_RANK * ranks


def solve(producers: Sequence[np.ndarray], lags: Sequence[float | np.ndarray],
          durations: Sequence[np.ndarray], first: Sequence[int], last: Sequence[int],
          end: np.ndarray, sweeps: int = SWEEPS, lagged: bool = False) -> bool:
    """Write the loop's ends into ``end`` (which holds the program's initial ends: the
    boundary steps' 0, ``inf`` for the ranks' steps) and return True; or return False and
    leave the ranks' steps at ``inf``. ``producers``, ``lags``, ``durations``: one column
    each for a program's step, two for a block (its forward part's, then its backward part's); a lag
    is one number for every step or a column. Rank r's steps are ``first[r]`` ..
    ``last[r]``. It gives up after ``sweeps`` sweeps (with as many as steps, an acyclic
    program always settles), and declines a lag other than 0 unless ``lagged`` (see
    :data:`SWEEPS`)."""
    import numpy as np

    ranges = [(lo, hi + 1) for lo, hi in zip(first, last, strict=True) if hi >= lo]
    if not ranges:
        return True
    if not lagged and any(np.any(lag) for lag in lags):
        return False
    dur = durations[0] if len(durations) == 1 else durations[0] + durations[1]
    if not _exact(dur, durations, lags, sum(hi - lo for lo, hi in ranges)):
        return False
    p = len(ranges)
    total = np.zeros(len(end))  # each rank's running sum of durations (S)
    for lo, hi in ranges:
        np.cumsum(dur[lo:hi], out=total[lo:hi])
    before = total - dur  # the sum before each step (P); exact, as every sum here
    # (numpy gathers fastest by intp indices; a column of lags is read per rank)
    columns = [(prod.astype(np.intp), lag if np.ndim(lag) else float(lag), np.ndim(lag) > 0)
               for prod, lag in zip(producers, lags, strict=True)]
    waits_on = _waits_on([c[0] for c in columns], ranges, len(end))
    for lo, hi in ranges:
        end[lo:hi] = total[lo:hi]  # the lower bound: the rank's own chain
    stale = [True] * p
    for sweep in range(sweeps):
        changed = False
        for r in (range(p) if sweep % 2 == 0 else range(p - 1, -1, -1)):
            if not stale[r]:
                continue
            stale[r] = False
            lo, hi = ranges[r]
            ready = None
            for prod, lag, column in columns:
                x = end[prod[lo:hi]]
                x += lag[lo:hi] if column else lag
                ready = x if ready is None else np.maximum(ready, x, out=ready)
            ready -= before[lo:hi]
            np.maximum.accumulate(ready, out=ready)
            np.maximum(ready, 0.0, out=ready)
            ready += total[lo:hi]
            if not np.array_equal(ready, end[lo:hi]):
                changed = True
                end[lo:hi] = ready
                for c in waits_on[r]:
                    stale[c] = True
        if not changed:
            return True
    for lo, hi in ranges:
        end[lo:hi] = np.inf
    return False


def _exact(dur: np.ndarray, durations: Sequence[np.ndarray], lags: Sequence, steps: int
           ) -> bool:
    """Whether every sum of these durations and lags is exact in doubles (see the module
    doc): ``steps`` positive durations (the ranks' steps; the other steps' are 0), lags >= 0,
    all on one grid ``2**-K`` with the largest possible sum below ``2**(51 - K)``."""
    import numpy as np

    if np.count_nonzero(dur > 0) != steps:  # (a negative one: counted out too)
        return False
    top_lag = 0.0
    for lag in lags:
        if not np.isfinite(lag).all() or np.any(lag < 0):  # (a column, or one number)
            return False
        top_lag = max(top_lag, float(np.max(lag)))
    bound = (float(dur.sum()) + len(lags) * steps * top_lag) * (1 + 1e-9) + 1.0
    if not math.isfinite(bound):
        return False
    k = 50 - math.ceil(math.log2(bound))  # every sum below 2**(51 - k), with room
    if k < 0:  # (sums past 2**50: a scale below 1 could round a small value to 0)
        return False
    scale = 2.0 ** k
    for x in [*durations, *lags]:
        y = np.multiply(x, scale)  # (by a power of two: exact)
        if np.ndim(y) == 0:
            if y != math.floor(y):
                return False
            continue
        np.subtract(y, np.floor(y), out=y)
        if y.any():  # off the grid
            return False
    return True


def _waits_on(producers: Sequence[np.ndarray], ranges: Sequence[tuple[int, int]],
              size: int) -> list[list[int]]:
    """For each rank (index into ``ranges``), the ranks with a step that waits for one of its
    steps (itself included when it waits for its own: a V placement's turn)."""
    import numpy as np

    p = len(ranges)
    rank_at = np.full(size, -1, dtype=np.int64)
    for r, (lo, hi) in enumerate(ranges):
        rank_at[lo:hi] = r
    if p * p > 1 << 22:  # (a table too large: the pairs, sorted)
        pairs = np.unique(np.concatenate([
            rank_at[prod[lo:hi]] * p + r for prod in producers for r, (lo, hi) in
            enumerate(ranges)]))
        pairs = pairs[pairs >= 0]  # (a boundary or spare producer: -1 x p + r < 0)
        waits_on: list[list[int]] = [[] for _ in range(p)]
        for producer, consumer in zip((pairs // p).tolist(), (pairs % p).tolist(),
                                      strict=True):
            waits_on[producer].append(consumer)
        return waits_on
    edges = np.zeros(p * p, dtype=np.int64)
    for prod in producers:
        for r, (lo, hi) in enumerate(ranges):
            src = rank_at[prod[lo:hi]]
            src = src[src >= 0]
            edges[r * p:(r + 1) * p] += np.bincount(src, minlength=p)
    table = edges.reshape(p, p)  # table[consumer, producer]
    return [np.flatnonzero(table[:, r]).tolist() for r in range(p)]
