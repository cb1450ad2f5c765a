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
  :attr:`Clock.room` is the highest level that passes it, for a caller's inner loop;
- with ``limits_i``, the memory is also counted as if W kept nothing (``M_W = 0``: each
  activation held until its I), in :attr:`Clock.used_i` under :attr:`Clock.room_i`. A
  rank's running sum is affine in ``M_W``, so an order within both limits holds no more
  than them for every ``M_W`` between 0 and the costs' own (the building blocks' test).

A list scheduler that runs in time steps (every rank picks at most one action per step, as
the building blocks' reorder does) places a step's picks with one call,
:meth:`Clock.place_at`. :meth:`Clock.units` makes the clock of the blocks' own units: every
F, I and W one unit long, no ``comm``, one unit of memory per activation, all in ints.

A search that lays passes out in unit time and then moves some earlier (the building
blocks' ends-only reorder) tests a move against memory that passes not placed yet will
hold. A unit clock's *calendar* (:meth:`Clock.calendar`) holds that: each pass booked at a
unit (:meth:`Clock.book`), per rank the booked pass of each unit (:attr:`Clock.taken`) and
the memory in use during each unit once every booked pass runs where it is booked
(:attr:`Clock.held`, :attr:`Clock.held_i`: ``used``'s and ``used_i``'s counts, in ints);
:meth:`Clock.fits_from` (how early a pass may move without passing a limit at a unit it
crosses, the one tolerance) and :meth:`Clock.first_free` answer from them, and
:meth:`Clock.pull` moves a booked pass by their answer and places it.

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

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from math import floor

from ..costs import StageCosts, fit_bound, fits_limit
from ..ir.deps import Layout, precedences
from ..ir.schedule import Action

_INF = float("inf")
_NO_ROOM = 1 << 62  # a unit calendar's room without a limit: a level no count reaches
KINDS = "FIW"


@lru_cache(maxsize=64)
def _rule_rows(stage_to_rank: tuple[int, ...], chain_starts: tuple[int, ...]
               ) -> tuple[tuple[int, int, bool, bool], ...]:
    """The edges of :func:`~pipebubble.ir.deps.precedences` among one microbatch's F, I
    and W, as (producer row, consumer row, crosses, between two stages), rows ``kind S +
    stage``: asked once per placement (a search builds many clocks on one)."""
    S = len(stage_to_rank)
    one = [Action(s, k, 0) for k in KINDS for s in range(S)]
    return tuple((KINDS.index(e.before.kind) * S + e.before.stage,
                  KINDS.index(e.after.kind) * S + e.after.stage, e.crosses,
                  e.before.stage != e.after.stage)
                 for e in precedences(one, Layout(S, stage_to_rank, chain_starts)))


def _table(sc: StageCosts, stage_to_rank: tuple[int, ...], chain_starts: tuple[int, ...],
           m: int) -> tuple:
    """The clock's per-row tables (row = kind S + stage): what waits for each row (row,
    lag), the lag into it from a neighbour stage, how many producers it has, and its
    entry (rank, duration, memory added at the start, net memory, the waiters' offsets
    and lags, net memory if W kept nothing); then the per-action lists made from them."""
    S = len(stage_to_rank)
    # An int comm (Clock.units) keeps the times ints: zero, the lags and every whole
    # duration (StageCosts.duration gives I as a float).
    ints = isinstance(sc.comm, int)
    zero = sc.comm * 0
    rows = 3 * S  # row = kind * S + stage
    # The rule, per row: what waits for it (row, lag), and how many producers it has.
    consumers: list[list[tuple[int, float]]] = [[] for _ in range(rows)]
    hop = [zero] * rows  # the lag of the edge into a row from a neighbour stage
    npred = [0] * rows
    for b, a, crosses, between in _rule_rows(stage_to_rank, chain_starts):
        lag = sc.comm if crosses else zero
        consumers[b].append((a, lag))
        npred[a] += 1
        if between:
            hop[a] = lag
    # What an action passes its end on to, the same for every microbatch of a row: one
    # waiter with one producer (its ready time is this end + lag) and one with two at
    # most (the rule: an output feeds one neighbour stage and one action of its own
    # stage, and an action waits for two at most); as the offset of the waiter's number
    # (0: none) and the lag.
    if max(npred, default=0) > 2:
        raise ValueError("the rule gave an action more than two producers")
    one, one_lag, more, more_lag = [0] * rows, [zero] * rows, [0] * rows, [zero] * rows
    for row in range(rows):
        for a, lag in consumers[row]:
            at, lags = (one, one_lag) if npred[a] == 1 else (more, more_lag)
            if at[row]:
                raise ValueError("the rule gave one action two waiters of one kind")
            at[row], lags[row] = (a - row) * m, lag
    kept_none = replace(sc, weight_memory=[0 * x for x in sc.weight_memory])
    table = []
    for k in KINDS:
        for s in range(S):
            row = KINDS.index(k) * S + s
            a0, a1 = sc.memory_deltas(s, k)
            d = sc.duration(s, k)
            table.append((stage_to_rank[s], int(d) if ints and d == int(d) else d, a0, a0 + a1,
                          one[row], one_lag[row], more[row], more_lag[row],
                          sum(kept_none.memory_deltas(s, k))))
    # Per action (x = row m + j): its row's entry, its first ready time, its producers;
    # on a unit clock (every action one int unit, no lag) the short entry of the unit body.
    info: list[tuple] = []
    ready: list[float] = []
    for row, entry in enumerate(table):
        info += [entry] * m
        ready += [_INF if npred[row] else zero] * m
    unit = None
    if ints and all(e[1] == 1 and e[5] == 0 and e[7] == 0 for e in table):
        unit = []
        for e in table:  # (rank, net, net if W kept nothing, waiter offsets)
            unit += [(e[0], e[3], e[8], e[4], e[6])] * m
    return consumers, hop, npred, table, (info, ready, unit)


def _unit_costs(S: int) -> StageCosts:
    """Every F, I and W one int unit long, no comm, one unit of memory per activation."""
    ones = [1] * S
    return StageCosts(f=ones, b=[2] * S, w=ones, comm=0, activation_memory=ones,
                      weight_memory=ones, input_memory=[0] * S, recompute=[False] * S,
                      overlap=1.0, allreduce=[0] * S)


@lru_cache(maxsize=64)
def _unit_table(stage_to_rank: tuple[int, ...], chain_starts: tuple[int, ...], m: int):
    """:func:`_table` of :func:`_unit_costs`, kept (a search builds many such clocks;
    they only read it, and copy what they change)."""
    return _table(_unit_costs(len(stage_to_rank)), stage_to_rank, chain_starts, m)


class Clock:
    """Per-rank clocks of an order being built (see the module docstring).

    ``sc`` holds one entry per stage, ``stage_to_rank`` places them, ``chain_starts`` as a
    Schedule's (one chain: ``(0,)``); ``limits[r]`` caps rank r's activation memory (None:
    no cap), ``limits_i[r]`` the same memory counted as if W kept nothing (None: not
    counted). The state is public lists, read by a caller's inner loop: ``ready``, ``end``
    (per action; ``inf`` until placed), ``free``, ``used``, ``room``, ``used_i``,
    ``room_i`` (per rank; ``used_i`` is counted with ``limits_i``, and on a unit clock)."""

    def __init__(self, sc: StageCosts, stage_to_rank: tuple[int, ...], microbatches: int,
                 limits: Sequence[float] | None = None, chain_starts: tuple[int, ...] = (0,),
                 limits_i: Sequence[float] | None = None, _rows: tuple | None = None):
        S, m = len(stage_to_rank), microbatches
        p = max(stage_to_rank, default=-1) + 1
        if len(sc.f) != S:
            raise ValueError(f"costs are for {len(sc.f)} stages but stage_to_rank places {S}")
        for name, lim in (("limits", limits), ("limits_i", limits_i)):
            if lim is not None and len(lim) != p:
                raise ValueError(f"{name} has {len(lim)} values; expected one per rank ({p})")
        self.S, self.m, self.p = S, m, p
        self.chain_starts = tuple(chain_starts)
        consumers, hop, npred, table, per_action = (
            _table(sc, tuple(stage_to_rank), tuple(chain_starts), m) if _rows is None
            else _rows)
        self.consumers: list[list[tuple[int, float]]] = consumers
        self.hop = hop
        self.rows: list[tuple] = table
        zero = sc.comm * 0
        rows = 3 * S
        # per action: its row's entry (read only: shared), its ready time, its producers
        # not placed yet (copied from the row's)
        self._info, ready, self._unit_info = per_action
        self.ready: list[float] = list(ready)
        size = rows * m
        self._part: list = [None] * size  # a waiter's first producer's end + lag, if in
        self.end = [_INF] * size
        self.free = [zero] * p
        self.used = [0.0] * p
        self.used_i = [0.0] * p
        self.begin = [_INF] * p  # each rank's first start, and its busy time
        self.busy = [zero] * p
        self.limits = limits
        self.limits_i = limits_i
        self.room, self.room_i = ([_INF] * p if lim is None else [fit_bound(x) for x in lim]
                                  for lim in (limits, limits_i))
        self.place, self.place_at = self._placer()

    @classmethod
    def units(cls, stage_to_rank: tuple[int, ...], microbatches: int,
              limits: Sequence[float] | None = None, chain_starts: tuple[int, ...] = (0,),
              limits_i: Sequence[float] | None = None) -> Clock:
        """The clock of unit passes: every F, I and W one unit long, no ``comm``, and one
        unit of memory from each F to its W (:attr:`used`; to its I: :attr:`used_i`); the
        times are ints (the building blocks' units).

        >>> c = Clock.units((0, 1, 1, 0), 2, limits=[2, 2], limits_i=[1, 1])
        >>> c.place_at([c.id("F", 0, 0)], 0); c.earliest(c.id("F", 1, 0)), c.used
        (1, [1.0, 0.0])
        """
        stage_to_rank, chain_starts = tuple(stage_to_rank), tuple(chain_starts)
        sc = _unit_costs(len(stage_to_rank))
        return cls(sc, stage_to_rank, microbatches, limits, chain_starts, limits_i,
                   _rows=_unit_table(stage_to_rank, chain_starts, microbatches))

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

    def place_at(self, xs: Sequence[int], start: float) -> None:  # (replaced: _placer)
        """:meth:`place` of each action of ``xs`` (each next on its own rank) at ``start``,
        in one call: a list scheduler that runs in time steps places a step's picks so."""
        raise NotImplementedError  # pragma: no cover

    def _placer(self):
        """:meth:`place` and :meth:`place_at` as closures over the state lists: a list
        scheduler calls them once per action or per step, and a closure's reads are
        cheaper than attribute look-ups. Three bodies, the same bookkeeping: the plain one;
        one that also counts ``used_i`` (with ``limits_i``); and, when every action lasts
        one int unit with no lag (:meth:`units`), one with those constants folded in."""
        info, end, free, used, used_i = self._info, self.end, self.free, self.used, self.used_i
        begin, busy = self.begin, self.busy
        part, ready = self._part, self.ready
        uinfo = self._unit_info
        if uinfo is not None:  # (rank, net, net if W kept nothing, waiter offsets)

            def place_at(xs: Sequence[int], start: float) -> None:
                e = start + 1
                for x in xs:
                    r, net, net_i, one, more = uinfo[x]
                    end[x] = e
                    free[r] = e
                    used[r] += net
                    used_i[r] += net_i
                    if start < begin[r]:
                        begin[r] = start
                    busy[r] += 1
                    if one:
                        ready[x + one] = e
                    if more:
                        c = x + more
                        q = part[c]
                        if q is None:  # the first of its two producers
                            part[c] = e
                        else:
                            ready[c] = e if e > q else q

            def place(x: int, start: float) -> float:
                r, net, net_i, one, more = uinfo[x]
                e = start + 1
                end[x] = e
                free[r] = e
                used[r] += net
                used_i[r] += net_i
                if start < begin[r]:
                    begin[r] = start
                busy[r] += 1
                if one:
                    ready[x + one] = e
                if more:
                    c = x + more
                    q = part[c]
                    if q is None:  # the first of its two producers
                        part[c] = e
                    else:
                        ready[c] = e if e > q else q
                return e

        elif self.limits_i is None:
            def place(x: int, start: float) -> float:
                r, d, _, net, one, one_lag, more, more_lag, _ = info[x]
                e = start + d
                end[x] = e
                free[r] = e
                used[r] += net
                if start < begin[r]:
                    begin[r] = start
                busy[r] += d
                if one:
                    ready[x + one] = e + one_lag
                if more:  # the later producer end + lag, once both are placed
                    c = x + more
                    v = e + more_lag
                    q = part[c]
                    if q is None:  # the first of its two producers
                        part[c] = v
                    else:
                        ready[c] = v if v > q else q
                return e

            def place_at(xs: Sequence[int], start: float) -> None:
                for x in xs:
                    place(x, start)

        else:
            def place(x: int, start: float) -> float:
                r, d, _, net, one, one_lag, more, more_lag, net_i = info[x]
                e = start + d
                end[x] = e
                free[r] = e
                used[r] += net
                used_i[r] += net_i
                if start < begin[r]:
                    begin[r] = start
                busy[r] += d
                if one:
                    ready[x + one] = e + one_lag
                if more:
                    c = x + more
                    v = e + more_lag
                    q = part[c]
                    if q is None:
                        part[c] = v
                    else:
                        ready[c] = v if v > q else q
                return e

            def place_at(xs: Sequence[int], start: float) -> None:
                for x in xs:
                    place(x, start)

        place.__doc__ = Clock.place.__doc__
        place_at.__doc__ = Clock.place_at.__doc__
        return place, place_at

    # The unit calendar (unit clocks): passes booked at units they have not reached yet.

    def calendar(self, horizon: int) -> None:
        """Start the clock's *unit calendar* over units ``0 .. horizon - 1``: a search that
        lays passes out in unit time and moves some of them earlier books every pass at a
        unit first (:meth:`book`), then tests a move against what the rank will hold at
        each unit once every booked pass runs where it is booked, and places the pass
        (:meth:`pull`). Per rank, :attr:`taken` holds the booked pass of each unit
        (number + 1; 0: the unit is free), :attr:`held` the memory in use during each unit
        (``used``'s count: a pass adds its start part at its unit and the rest after it,
        as the memory walk), :attr:`held_i` the same as if W kept nothing (``used_i``'s).
        :meth:`fits_from` and :meth:`first_free` answer from them; :meth:`pull` moves a
        booked pass earlier by their answer and places it.
        Unit clocks only (:meth:`units`: one unit per pass, int memory).

        >>> c = Clock.units((0, 1, 1, 0), 1, limits=[1, 1])
        >>> c.calendar(8)
        >>> for kind, stage, at in (("F", 0, 0), ("F", 3, 4), ("I", 3, 5), ("W", 3, 6)):
        ...     c.book(c.id(kind, stage, 0), at)
        >>> c.held[0]                        # F(0) held, F(3) too from unit 4 on
        [1, 1, 1, 1, 2, 2, 2, 1]
        >>> c.fits_from(0, 1, 4)             # one more activation over units 1..3 fits?
        4
        """
        if self._unit_info is None:
            raise ValueError("the unit calendar is for unit clocks (Clock.units)")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.horizon = horizon
        self.taken: list[list[int]] = [[0] * horizon for _ in range(self.p)]
        # the levels (per rank: used's, used_i's), as differences until first read (a
        # booking is then one add per pass)
        self._diffs: list[list[int]] | None = [[0] * (horizon + 1) for _ in range(2 * self.p)]
        import numpy as np

        # (int64 arrays: a pull moves a pass over a hundred units and more at p >= 16, and
        # adds to a span of them: one array operation, not a loop)
        self._held: list = [np.zeros(horizon, dtype=np.int64) for _ in range(2 * self.p)]
        self._pending = [True]
        # per row: (start part, rest) of used, the same of used_i (F adds at its start,
        # I / W free at their end; W keeping nothing changes only the net)
        self._cal_rows = [(int(e[2]), int(e[3] - e[2]), int(e[2]), int(e[8] - e[2]))
                          for e in self.rows]
        self.pull = self._puller()

    def book(self, x: int, at: int, count: int = 1, every: int = 1) -> None:
        """Book pass ``x`` at unit ``at`` on the calendar (:meth:`calendar`), and with
        ``count`` > 1 the next microbatches of its row (``x + 1``, ...) every ``every``
        units after: the calendar's memory counts it there from now on. Raises
        ValueError if a unit is taken or past the horizon."""
        m = self.m
        row, j = divmod(x, m)
        if count < 1 or j + count > m or every < 1:
            raise ValueError(f"book: {count} passes every {every} from microbatch {j} of {m}")
        hi = at + every * (count - 1)
        if at < 0 or hi >= self.horizon:
            raise ValueError(f"book: units {at} .. {hi} are outside 0 .. {self.horizon - 1}")
        r = self.rows[row][0]
        slots = self.taken[r]
        if any(slots[at:hi + 1:every]):
            raise ValueError(f"book: a unit of {at} .. {hi} (every {every}) is taken on rank {r}")
        slots[at:hi + 1:every] = range(x + 1, x + 1 + count)
        a0, a1, a0_i, a1_i = self._cal_rows[row]
        if self._diffs is not None:  # (a row's units as slices: a block books whole rows)
            d, d_i = self._diffs[2 * r], self._diffs[2 * r + 1]
            now, after = slice(at, hi + 1, every), slice(at + 1, hi + 2, every)
            if a0:
                d[now] = [v + a0 for v in d[now]]
            if a0_i:
                d_i[now] = [v + a0_i for v in d_i[now]]
            if a1:
                d[after] = [v + a1 for v in d[after]]
            if a1_i:
                d_i[after] = [v + a1_i for v in d_i[after]]
            return
        held, held_i = self._held[2 * r], self._held[2 * r + 1]
        for u in range(at, hi + 1, every):
            held[u] += a0
            held_i[u] += a0_i
            held[u + 1:] += a0 + a1
            held_i[u + 1:] += a0_i + a1_i

    def _levels(self) -> list:
        if self._diffs is not None:
            import numpy as np

            for lv, d in zip(self._held, self._diffs, strict=True):
                np.cumsum(d[:-1], out=lv)
            self._diffs = None
            self._pending[0] = False
        return self._held

    @property
    def held(self) -> list[list[int]]:
        """Per rank, the memory in use during each unit of the calendar (``used``'s
        count), every booked pass at its unit (a copy, as lists)."""
        return [lv.tolist() for lv in self._levels()[0::2]]

    @property
    def held_i(self) -> list[list[int]]:
        """:attr:`held` as if W kept nothing (``used_i``'s count)."""
        return [lv.tolist() for lv in self._levels()[1::2]]

    def fits_from(self, rank: int, lo: int, hi: int, extra: int = 1) -> int:
        """The first unit ``u`` in ``lo .. hi`` such that ``extra`` more memory at every
        unit of ``u .. hi - 1`` fits ``rank``'s limits (:attr:`held` against ``limits``,
        :attr:`held_i` against ``limits_i``, the one tolerance of
        :func:`~pipebubble.costs.fits_limit`): how early a pass that adds ``extra`` and is
        booked at ``hi`` may move without passing a limit at a unit it crosses."""
        levels = self._levels()
        held, held_i = levels[2 * rank], levels[2 * rank + 1]
        room, room_i = self.room[rank] - extra, self.room_i[rank] - extra
        import numpy as np

        if lo >= hi:
            return hi
        over = np.flatnonzero((held[lo:hi] > room) | (held_i[lo:hi] > room_i))
        return lo + int(over[-1]) + 1 if len(over) else lo

    def first_free(self, rank: int, lo: int, hi: int) -> int:
        """The first unit of ``lo .. hi - 1`` no pass is booked at on ``rank`` (-1: none)."""
        if lo >= hi:
            return -1
        try:
            return self.taken[rank].index(0, lo, hi)
        except ValueError:
            return -1

    def pull(self, x: int, at: int, lo: int) -> int:  # (replaced per calendar: _puller)
        """Place pass ``x``, booked at unit ``at``, at the first free unit of ``lo .. at -
        1`` on its rank from which its memory fits (a pass that adds memory at its start,
        a forward, moves over no unit where that would pass a limit: :meth:`fits_from`),
        or at ``at`` if there is none; returns the unit. Its booking moves with it, so the
        calendar's memory counts it from there on (``x`` must be booked at ``at``: the
        calendar is not checked, a search calls it once a pass)."""
        raise ValueError("pull: start the calendar first (Clock.calendar)")

    def _puller(self):
        """:meth:`pull` as a closure over the calendar's lists (a search calls it once a
        pass; :meth:`fits_from` and :meth:`first_free` inline)."""
        m, taken, levels, cal = self.m, self.taken, self._held, self._cal_rows
        # the levels are ints: the rooms as the highest int that passes (an int compare is
        # cheaper than a mixed one; no limit: a level no count reaches)
        room_of, room_i_of = ([floor(x) if x < _INF else _NO_ROOM for x in rooms]
                              for rooms in (self.room, self.room_i))
        # per row: its rank's calendar and levels, the rooms left for its start part
        # (None: it adds nothing at its start, no limit to test), its parts
        per_row = []
        for e, (a0, a1, a0_i, a1_i) in zip(self.rows, cal, strict=True):
            r = e[0]
            rooms = (room_of[r] - a0, room_i_of[r] - a0_i) if a0 > 0 or a0_i > 0 else None
            per_row.append((taken[r], levels[2 * r], levels[2 * r + 1], rooms,
                            a0, a1, a0_i, a1_i))
        pending, settle, place = self._pending, self._levels, self.place

        def pull(x: int, at: int, lo: int) -> int:
            slots, held, held_i, rooms, a0, a1, a0_i, a1_i = per_row[x // m]
            if pending[0]:
                settle()
            if lo >= at:
                place(x, at)
                return at
            if rooms is not None:  # the last unit below ``at`` where one more does not fit
                room, room_i = rooms
                over = ((held[lo:at] > room) | (held_i[lo:at] > room_i)).nonzero()[0]
                if len(over):
                    lo += int(over[-1]) + 1
            try:
                to = slots.index(0, lo, at) if lo < at else -1
            except ValueError:
                to = -1
            if to < 0:
                place(x, at)
                return at
            slots[at], slots[to] = 0, x + 1
            # its start part now counts over to .. at - 1 too, the rest over to + 1 .. at
            if a0:
                held[to:at] += a0
            if a0_i:
                held_i[to:at] += a0_i
            if a1:
                held[to + 1:at + 1] += a1
            if a1_i:
                held_i[to + 1:at + 1] += a1_i
            place(x, to)
            return to

        pull.__doc__ = Clock.pull.__doc__
        return pull

    def booked(self, names: Sequence | None = None) -> list[list]:
        """Per rank, the booked passes in unit order (the calendar's orders): their
        numbers, or ``names[number]`` of each."""
        if names is None:
            return [[x - 1 for x in slots if x] for slots in self.taken]
        named = [None, *names]
        return [[named[x] for x in slots if x] for slots in self.taken]

    @property
    def step_time(self) -> float:
        """The latest end on any rank so far."""
        return max(self.free, default=0.0)

    @property
    def span_idle(self) -> float:
        """The idle time inside the ranks' spans (first start to last end), summed."""
        return sum(self.free[r] - self.begin[r] - self.busy[r] for r in range(self.p)
                   if self.begin[r] < _INF)

