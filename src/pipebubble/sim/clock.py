"""The kernel's clock, one action at a time: for a search that builds an order as it goes.

The kernel (``sim/kernel.py``) times a finished order: an action starts at ``max(end of the
previous action on its rank, end of each producer + lag)`` and ends ``duration`` later. A
list scheduler (``schedules/auto/greedy.py``) builds the order instead, and at each choice
asks when each candidate *could* start if placed next on its rank. :class:`Clock` answers
that with the same rule and the same arithmetic, so the order it builds comes out with the
simulator's times:

- the producers and lags are the dependency rule's (:func:`~pipebubble.ir.deps.precedences`
  of one microbatch: the rule is the same for every microbatch, and a producer is of the
  same microbatch), ``comm`` on an edge that crosses ranks, as the kernel compiles them;
- :attr:`Clock.ready` holds, per action, when its inputs are all there (the latest
  producer end + lag; ``inf`` while a producer is not placed), kept up to date as actions
  are placed (a placed action passes its end on to the actions waiting for it), so a
  candidate's arrival is one list read;
- :meth:`Clock.earliest` is ``max(rank free, ready)``: the kernel's start if placed next;
- :meth:`Clock.place` places an action at a start (the earliest, or later where the caller
  chose to wait) and books its end, the rank's free time and its memory;
- the memory in use per rank (:attr:`Clock.used`: each action adds its net at its start,
  the same running sum as the memory walk) is tested against the limit with the one
  tolerance: :meth:`Clock.fits` is :func:`~pipebubble.costs.fits_limit`, and
  :attr:`Clock.room` is the highest level that passes it, for a caller's inner loop.

Actions are numbered ``x = (kind * S + stage) * m + microbatch`` with kinds F, I, W (0, 1,
2): :meth:`Clock.id`.

>>> from pipebubble.costs import CostModel
>>> c = Clock(CostModel(comm=0.5).resolve(2), (0, 1), 1)
>>> f0, f1 = c.id("F", 0, 0), c.id("F", 1, 0)
>>> c.earliest(f1)                 # its input is not there yet
inf
>>> c.place(f0, c.earliest(f0))    # F(0) on rank 0, 0 .. 1
1.0
>>> c.earliest(f1)                 # arrives at 1 + comm
1.5
"""

from __future__ import annotations

from typing import NamedTuple

from ..costs import FIT_TOLERANCE, StageCosts, fits_limit
from ..ir.deps import precedences
from ..ir.schedule import Action

_INF = float("inf")
KINDS = "FIW"


class _Topology(NamedTuple):
    num_stages: int
    stage_to_rank: tuple[int, ...]
    chain_starts: tuple[int, ...]


class Clock:
    """Per-rank clocks of an order being built (see the module docstring).

    ``sc`` holds one entry per stage, ``stage_to_rank`` places them, ``chain_starts`` as a
    Schedule's (one chain: ``(0,)``); ``limits[r]`` caps rank r's activation memory (None:
    no cap). The state is public lists, read by a caller's inner loop: ``ready``, ``end``
    (per action; ``inf`` until placed), ``free``, ``used``, ``room`` (per rank)."""

    def __init__(self, sc: StageCosts, stage_to_rank: tuple[int, ...], microbatches: int,
                 limits: list[float] | None = None, chain_starts: tuple[int, ...] = (0,)):
        S, m = len(stage_to_rank), microbatches
        p = max(stage_to_rank, default=-1) + 1
        if len(sc.f) != S:
            raise ValueError(f"costs are for {len(sc.f)} stages but stage_to_rank places {S}")
        if limits is not None and len(limits) != p:
            raise ValueError(f"limits has {len(limits)} values; expected one per rank ({p})")
        self.S, self.m, self.p = S, m, p
        rows = 3 * S  # row = kind * S + stage
        # The rule, per row: what waits for it (row, lag), and how many producers it has.
        one = [Action(s, k, 0) for k in KINDS for s in range(S)]
        self.consumers: list[list[tuple[int, float]]] = [[] for _ in range(rows)]
        self.hop = [0.0] * rows  # the lag of the edge into a row from a neighbour stage
        npred = [0] * rows
        for e in precedences(one, _Topology(S, tuple(stage_to_rank), tuple(chain_starts))):
            lag = sc.comm if e.crosses else 0.0
            a = KINDS.index(e.after.kind) * S + e.after.stage
            self.consumers[KINDS.index(e.before.kind) * S + e.before.stage].append((a, lag))
            npred[a] += 1
            if e.before.stage != e.after.stage:
                self.hop[a] = lag
        # What an action passes its end on to, the same for every microbatch of a row: one
        # waiter with one producer (its ready time is this end + lag) and one with several
        # at most (the rule: an output feeds one neighbour stage and one action of its
        # own stage); as the offset of the waiter's number (0: none) and the lag.
        one, one_lag, more, more_lag = [0] * rows, [0.0] * rows, [0] * rows, [0.0] * rows
        for row in range(rows):
            for a, lag in self.consumers[row]:
                at, lags = (one, one_lag) if npred[a] == 1 else (more, more_lag)
                if at[row]:
                    raise ValueError("the rule gave one action two waiters of one kind")
                at[row], lags[row] = (a - row) * m, lag
        # Per row: (rank, duration, memory added at the start, net memory, the waiters);
        # per action, a reference to its row's tuple (one list: cheap to build and read).
        self.rows: list[tuple] = []
        self.ready: list[float] = []
        self._missing: list[int] = []
        self._info: list[tuple] = []
        for k in KINDS:
            for s in range(S):
                row = KINDS.index(k) * S + s
                a0, a1 = sc.memory_deltas(s, k)
                info = (stage_to_rank[s], sc.duration(s, k), a0, a0 + a1,
                        one[row], one_lag[row], more[row], more_lag[row])
                self.rows.append(info)
                self._info += [info] * m
                self.ready += [_INF if npred[row] else 0.0] * m
                self._missing += [npred[row]] * m
        size = rows * m
        self._part = [-_INF] * size  # the latest producer end + lag seen so far
        self.end = [_INF] * size
        self.free = [0.0] * p
        self.used = [0.0] * p
        self.begin = [_INF] * p  # each rank's first start, and its busy time
        self.busy = [0.0] * p
        self.limits = limits
        self.room = [_INF] * p if limits is None else [
            x + FIT_TOLERANCE * max(1.0, abs(x)) for x in limits]  # fits_limit's bound
        self.place = self._placer()

    def id(self, kind: str, stage: int, microbatch: int) -> int:
        """The number of an action (``kind`` one of F, I, W)."""
        return (KINDS.index(kind) * self.S + stage) * self.m + microbatch

    def earliest(self, x: int) -> float:
        """When action ``x`` would start if placed next on its rank (``inf``: an input is
        not placed yet): the kernel's ``max(end of the previous, producer end + lag)``."""
        f = self.free[self._info[x][0]]
        r = self.ready[x]
        return r if r > f else f

    def fits(self, rank: int, extra: float = 0.0) -> bool:
        """Whether ``rank``'s memory in use plus ``extra`` fits its limit
        (:func:`~pipebubble.costs.fits_limit`; always, without limits)."""
        return self.limits is None or fits_limit(self.used[rank] + extra, self.limits[rank])

    def place(self, x: int, start: float) -> float:  # (replaced per instance: _placer)
        """Place action ``x`` next on its rank, starting at ``start`` (its earliest, or
        later where the caller chose to wait); returns its end. The actions waiting for it
        learn when its output is there."""
        raise NotImplementedError  # pragma: no cover

    def _placer(self):
        """:meth:`place` as a closure over the state lists: a list scheduler calls it once
        per action, and a closure's reads are cheaper than attribute look-ups."""
        info, end, free, used = self._info, self.end, self.free, self.used
        begin, busy = self.begin, self.busy
        part, missing, ready = self._part, self._missing, self.ready

        def place(x: int, start: float) -> float:
            r, d, _, net, one, one_lag, more, more_lag = info[x]
            e = start + d
            end[x] = e
            free[r] = e
            used[r] += net
            if start < begin[r]:
                begin[r] = start
            busy[r] += d
            if one:
                ready[x + one] = e + one_lag
            if more:  # the latest producer end + lag, once every producer is placed
                c = x + more
                v = e + more_lag
                if v > part[c]:
                    part[c] = v
                missing[c] -= 1
                if not missing[c]:
                    ready[c] = part[c]
            return e

        place.__doc__ = Clock.place.__doc__
        return place

    @property
    def step_time(self) -> float:
        """The latest end on any rank so far."""
        return max(self.free, default=0.0)

    @property
    def span_idle(self) -> float:
        """The idle time inside the ranks' spans (first start to last end), summed."""
        return sum(self.free[r] - self.begin[r] - self.busy[r] for r in range(self.p)
                   if self.begin[r] < _INF)

