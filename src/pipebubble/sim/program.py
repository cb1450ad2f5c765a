"""The evaluation core: a schedule compiled once, asked many times, re-timed incrementally.

Every search (``auto``'s local search and MIP windows, the building blocks, the bounds)
asks one object the three questions it has about an order: *how long is the step*, *how
much does each rank hold at its peak*, and *does it fit this limit*. :class:`Compiled`
answers them from the kernel's program (``sim/kernel.py``: one step per action, each
starting at ``max(end[i - 1], end[producer[i]] + lag[i])``), built once from a Schedule and
its costs; the timing is the kernel's own loop, so the numbers are the simulator's to the
last bit.

**Re-timing a changed order.** A search changes a few actions at a time (a move, a swap,
the same move on every rank). :meth:`Compiled.reorder` takes the new orders of the ranks
that changed and re-times only what changes, by *dirty propagation*: the steps whose
predecessor on their rank changed are evaluated again, and a step whose end moves passes
the change on to its successors (the next step of its rank and the steps that wait for its
output); where an end stays the same, the change stops. A heap keyed by the old start times
(a topological order of the old program), the changed stretch first and in its new order
(its steps' old times travel with them, so they are no order of the new program), keeps
each step from being evaluated more than a few times. Past :attr:`~Compiled.FAR` of the
steps it hands over to the kernel's loop from the change on. The answer is exactly a full
simulation's (a hypothesis test keeps them equal). A re-time that the next edit takes back
(it restores the orders before it, exactly: a refused try) is not re-timed again: the
times it changed are put back (its undo list, or copies made before the kernel's loop).

A new order may deadlock (two ranks each waiting for the other). Every cycle of the new
program contains a new edge that points back in the old time order, and lies among the
steps whose old times fall between the changed steps' earliest and latest: a depth-first
search over just those decides it (exact when every action takes some time; with
zero-duration actions a tie in time does not order two steps, so :meth:`reorder` runs the
whole kernel instead).

**Answers from the tails** (a move's step time from each step's longest path to the end,
without re-timing it) lived here and in ``sim/critical.py``; they paid only from 4,096 steps,
which no product path reaches (``auto``'s local search stops at 300 actions), so they moved to
``bench/large_search/`` with the local search over large orders that used them (see its
README section and ``docs/design.md``, "The evaluation core").

**Fits the limit.** One tolerance, :data:`~pipebubble.costs.FIT_TOLERANCE` (relative to the
limit, and absolute below 1): :func:`~pipebubble.costs.fits_limit` is the one test.

>>> from pipebubble.schedules import get_schedule
>>> from pipebubble.costs import CostModel
>>> c = Compiled(get_schedule("1f1b", ranks=4, microbatches=8), CostModel())
>>> c.step_time, c.peaks()[0], c.fits([4, 4, 4, 4]), c.fits([3, 4, 4, 4])
(33.0, 4.0, True, False)
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from operator import itemgetter

from ..costs import CostModel, StageCosts, fits_limit
from ..ir.check import LiveKept, flat_actions
from ..ir.schedule import Schedule, ScheduleError, Step, make_schedule, step_actions
from .kernel import Program, compile_program, run

_INF = float("inf")


def memory_peak(start: Sequence[float], net: Sequence[float], order: Sequence[int],
                limit: float | None = None) -> float:
    """The activation peak of one rank's ``order`` (ids into ``start``/``net``: the memory
    an action adds at its start, and what it adds in all), the memory walk every search
    shares; with ``limit``, stops at the first step over it and returns that level.

    >>> memory_peak([1, 0, 0], [1, -0.5, -0.5], [0, 0, 1, 2])
    2.0
    """
    used = peak = 0.0
    for x in order:
        top = used + start[x]
        if top > peak:
            peak = top
            if limit is not None and not fits_limit(peak, limit):
                return peak
        used += net[x]
    return peak


def schedule_peaks(schedule: Schedule, costs: CostModel | StageCosts) -> list[float]:
    """Each rank's activation peak (the Timeline's ``peak_memory``, without timing
    anything: memory depends on the order only), from the validated flat actions.

    >>> from pipebubble.schedules import get_schedule
    >>> schedule_peaks(get_schedule("gpipe", ranks=2, microbatches=3), CostModel())
    [3.0, 3.0]
    """
    import numpy as np

    sc = costs if isinstance(costs, StageCosts) else costs.resolve(schedule.num_stages,
                                                                    schedule.chunks)
    table = np.array([sc.memory_deltas(s, k) for s in range(schedule.num_stages)
                      for k in "FIWB"], dtype=np.float64).reshape(-1, 2)
    # the peaks read the orders and this table only: a planner asks one order under the
    # same memory costs from several places (its shardings, auto's fused floor)
    # (a schedule's orders are immutable, so a kept answer stays true)
    kept = _peaks_kept.get(schedule)
    if kept is None:
        kept = {}
        if not _peaks_kept.put(schedule, kept):
            kept = None
    key = table.tobytes()
    got = None if kept is None else kept.get(key)
    if got is None:
        got = _peaks_of(schedule, table)
        if kept is not None:
            kept[key] = got
    return list(got)


KEEP_PEAKS = 64  # schedules whose peaks by memory table are kept (each while it lives)
_peaks_kept = LiveKept(KEEP_PEAKS)  # the schedule -> {memory table bytes: its peaks}


def _peaks_of(schedule: Schedule, table) -> tuple[float, ...]:
    """:func:`schedule_peaks` under the memory ``table`` (rows stage x 4 + kind: the start
    and end delta), computed."""
    import numpy as np

    flat = flat_actions(schedule)
    idx = flat.stage * 4 + flat.kind
    spans = list(zip(flat.offsets, flat.offsets[1:], strict=False))
    cumsum = np.cumsum
    # Whole bytes (every planner's table): the running sums in int64, several times faster
    # than numpy's float cumsum and the same doubles wherever every sum stays within 2^53
    # (then each float addition of the walk is exact); a rank past that walks in floats.
    ints = None
    if np.isfinite(table).all() and (np.abs(table).max() < _EXACT if table.size else True) \
            and (table == np.trunc(table)).all():
        ints = table.astype(np.int64).take(idx, axis=0).ravel()
    # (take along the rows: a few times faster than indexing the table by an array)
    deltas = table.take(idx, axis=0).ravel() if ints is None else None
    out = []
    for lo, hi in spans:
        if hi <= lo:
            out.append(0.0)
            continue
        if ints is not None:
            run = cumsum(ints[2 * lo:2 * hi])
            top = int(run.max())
            if top <= _EXACT and int(run.min()) >= -_EXACT:
                out.append(max(0.0, float(top)))
                continue
            seg = ints[2 * lo:2 * hi].astype(np.float64)
        else:  # row-major, the rows laid end to end are each action's start then end
            seg = deltas[2 * lo:2 * hi]  # delta: the interleaved deltas of :func:`_peak`
        out.append(max(0.0, float(cumsum(seg).max())))
    return tuple(out)


_EXACT = 2 ** 53  # every int up to this is a double, and a sum of two such is exact


def _peak(d0, d1) -> float:
    """The highest running sum of memory deltas, ``d0`` at each start and ``d1`` at each
    end in order, and 0: exactly the Timeline's sum (the same numpy cumsum)."""
    import numpy as np

    if not len(d0):
        return 0.0
    deltas = np.empty(2 * len(d0))
    deltas[0::2] = d0
    deltas[1::2] = d1
    return max(0.0, float(np.cumsum(deltas).max()))


def _first_difference(a: list[int], b: list[int]) -> int:
    """The first index where ``a`` and ``b`` differ (``len(a)`` if none), by bisection
    on prefix equality (list comparisons run in C)."""
    lo, hi = 0, len(a)
    if a == b:
        return hi
    while lo < hi:  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi) // 2
        if a[lo:mid + 1] == b[lo:mid + 1]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _last_difference(a: list[int], b: list[int]) -> int:
    """The last index where ``a`` and ``b`` (of one length, not equal) differ."""
    lo, hi = 0, len(a) - 1  # a[hi + 1:] == b[hi + 1:]; the answer is in lo..hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid:hi + 1] == b[mid:hi + 1]:
            hi = mid - 1
        else:
            lo = mid
    return lo


class Compiled:
    """``schedule`` under ``costs``, compiled once (validated on the way): step time,
    per-rank peaks, ``fits(limits)``, and incremental re-timing of changed orders.

    Orders are lists of *step ids*: ``steps[i]`` is the Action or Overlap with id ``i``
    (numbered rank after rank in the schedule's order); ``orders[r]`` is rank r's current
    order of ids. :meth:`reorder` changes them; :meth:`schedule`
    gives the current one.

    >>> from pipebubble.schedules import get_schedule
    >>> c = Compiled(get_schedule("zb-h1", ranks=2, microbatches=4), CostModel(comm=0.5))
    >>> o = c.orders[0]
    >>> swapped = o[:1] + [o[2], o[1]] + o[3:]  # 0F1 0I0 traded, then back
    >>> c.step_time, c.reorder({0: swapped}), c.reorder({0: o})
    (15.0, 17.0, 15.0)
    >>> c.counts["re-timed"], c.counts["restored"]
    (1, 1)
    """

    FAR = 0.03  # the share of steps after which a re-time hands over to the kernel's loop
    FLOOR = 64  # (plus this many)
    SMALL = 4096  # steps: below this, every re-time is the kernel's loop over them all

    def __init__(self, schedule: Schedule, costs: CostModel | StageCosts | None = None):
        import numpy as np

        costs = costs or CostModel()
        sc = costs if isinstance(costs, StageCosts) else costs.resolve(schedule.num_stages,
                                                                        schedule.chunks)
        if len(sc.f) != schedule.num_stages:
            raise ScheduleError(f"costs are for {len(sc.f)} stages but the schedule has "
                                f"{schedule.num_stages}")
        self.base, self.costs = schedule, sc
        flat = flat_actions(schedule)
        prog = compile_program(schedule, flat, sc)
        self._num_pairs = prog.num_pairs
        self.steps: list[Step] = [st for order in schedule.orders for st in order]
        self.orders: list[list[int]] = []
        nodes_of: list[tuple[int, ...]] = []
        at = 0
        for r, order in enumerate(schedule.orders):
            ids = []
            pos = prog.first[r]
            for st in order:
                size = 1 if len(step_actions(st)) == 1 else 3
                nodes_of.append(tuple(range(pos, pos + size)))
                ids.append(at)
                at += 1
                pos += size
            self.orders.append(ids)
        self._nodes_of = nodes_of
        size = len(prog.producer)
        # Static per node (node id = its position in the first program): what it waits for,
        # its lag and duration, its memory deltas; the inverse of ``producer``.
        self._need = list(prog.producer)
        self._lag_of = list(prog.lag)
        self._dur_of = list(prog.duration)
        self.first, self.last = list(prog.first), list(prog.last)
        movable = [False] * size
        for r in range(schedule.num_ranks):
            movable[self.first[r]:self.last[r] + 1] = [True] * (self.last[r] + 1 - self.first[r])
        self._consumers: list[list[int]] = [[] for _ in range(size)]
        for i, j in enumerate(self._need):
            if movable[i] and movable[j]:
                self._consumers[j].append(i)
        self._rank_at = [-1] * size
        for r in range(schedule.num_ranks):
            for i in range(self.first[r], self.last[r] + 1):
                self._rank_at[i] = r
        d0 = np.zeros(size)
        d1 = np.zeros(size)
        step_nodes = prog.step  # action (flat order) -> its node
        mem = np.array([sc.memory_deltas(s, k) for s in range(schedule.num_stages)
                        for k in "FIWB"]).reshape(-1, 2)[flat.stage * 4 + flat.kind]
        d0[step_nodes], d1[step_nodes] = mem[:, 0], mem[:, 1]
        real = np.zeros(size, dtype=bool)
        real[step_nodes] = True
        self._real = real.tolist()
        self._d0, self._d1 = d0, d1
        dur = np.asarray(prog.duration)
        self._positive = bool((dur[step_nodes] > 0).all())
        # Position space, what the kernel runs (changed by reorder).
        self._node_at = list(range(size))
        self._pos_of = list(range(size))
        self._producer = list(prog.producer)
        self._lag = list(prog.lag)
        self._producer_np = np.array(prog.producer, dtype=np.int64)  # (copies, kept in
        self._lag_np = np.array(prog.lag, dtype=np.float64)  # step: the starts' numpy max)
        self._duration = list(prog.duration)
        self._initial = prog.initial_end
        self._peaks: list[float | None] = [None] * schedule.num_ranks
        self._queued = bytearray(size)
        self._gather: tuple | None = None  # (id, the sequence, its nodes): ends_of's
        self._way: tuple | None = None  # the way back from the last re-time: (the orders
        # before it, whether it was stuck, what to put back: see _way_back_to)
        self.counts = {"re-timed": 0, "suffix runs": 0, "ends evaluated": 0, "restored": 0}
        self._full_run()

    # ---- the answers -------------------------------------------------------------
    @property
    def step_time(self) -> float:
        """The step time (``inf`` when the current orders deadlock)."""
        return self._time()

    def _time(self) -> float:
        if self._stuck:
            return _INF
        end = self._end
        return max((end[self.last[r]] for r in range(len(self.orders))
                    if self.last[r] >= self.first[r]), default=0.0)

    @property
    def deadlocked(self) -> bool:
        """Whether the current orders deadlock."""
        return self._stuck

    def end_of(self, step_id: int) -> float:
        """When step ``step_id`` ends (an Overlap: its backward part, the pair's end)."""
        return self._end[self._pos_of[self._nodes_of[step_id][-1]]]

    def ends_of(self, step_ids: Sequence[int]) -> tuple[float, ...]:
        """The ends of these steps, in this order (an Overlap: its end), gathered in C;
        the node list of a sequence asked for before is remembered."""
        key = id(step_ids)
        if self._gather is None or self._gather[0] != key:
            self._gather = (key, step_ids, [self._nodes_of[i][-1] for i in step_ids])
        nodes = self._gather[2]
        if len(nodes) < 2:
            return tuple(self._end[self._pos_of[x]] for x in nodes)
        return itemgetter(*map(self._pos_of.__getitem__, nodes))(self._end)

    def start_of(self, step_id: int) -> float:
        """When step ``step_id`` starts (an Overlap: its forward part, which waits for
        the pair's wait step: the pair's start)."""
        nodes = self._nodes_of[step_id]
        return self._start[self._pos_of[nodes[1] if len(nodes) > 1 else nodes[0]]]

    def peaks(self) -> list[float]:
        """Each rank's activation peak (the Timeline's ``peak_memory``: order only)."""
        for r, got in enumerate(self._peaks):
            if got is None:
                ids = self._node_at[self.first[r]:self.last[r] + 1]
                real = [x for x in ids if self._real[x]]  # not a pair's wait step
                self._peaks[r] = _peak(self._d0[real], self._d1[real])
        return list(self._peaks)

    def ends_sum(self) -> float:
        """The sum of every step's end (``inf`` when the orders deadlock): a search's
        tie-break on flat ground."""
        if self._stuck:
            return _INF
        end = self._end
        return sum(sum(end[lo:hi + 1]) for lo, hi in zip(self.first, self.last, strict=True))

    def fits(self, limits: float | Sequence[float] | None) -> bool:
        """Every rank's peak within its limit (one value for all, or one per rank; None:
        no limit), with the one tolerance of :func:`~pipebubble.costs.fits_limit`."""
        if limits is None:
            return True
        peaks = self.peaks()
        if isinstance(limits, int | float):
            limits = [limits] * len(peaks)
        return all(fits_limit(x, cap) for x, cap in zip(peaks, limits, strict=True))

    def schedule(self, name: str | None = None) -> Schedule:
        """The current orders as a Schedule (the base's stages, placement and chains)."""
        b = self.base
        return make_schedule(name or b.name, [[self.steps[i] for i in o] for o in self.orders],
                             b.num_stages, b.num_microbatches, placement=list(b.stage_to_rank),
                             chain_starts=b.chain_starts, **b.options)

    # ---- changing the orders -----------------------------------------------------
    def reorder(self, changes: Mapping[int, Sequence[int]]) -> float:
        """Give the ranks in ``changes`` these orders (each a permutation of the rank's step
        ids) and re-time incrementally; returns the new step time (``inf``: deadlock).

        The orders are not validated here (a search moves an action only where its rank
        allows it: after its own F, before its W, ...); :meth:`schedule` is a Schedule that
        the simulator validates."""
        edits = {}
        for r, new in changes.items():
            old = self.orders[r]
            if len(new) != len(old):
                raise ScheduleError(f"rank {r}: a new order must hold the same steps")
            new = list(new)
            lo = _first_difference(old, new)
            if lo == len(old):
                continue
            hi = _last_difference(old, new)
            if sorted(old[lo:hi + 1]) != sorted(new[lo:hi + 1]):
                raise ScheduleError(f"rank {r}: a new order must hold the same steps")
            edits[r] = (lo, hi, new)
        return self._edit(edits)

    def _edit(self, edits: Mapping[int, tuple[int, int, list[int]]]) -> float:
        """Change the orders (rank -> first and last changed index, new order) and re-time."""
        edits = {r: e for r, e in edits.items() if e[0] < e[1]}
        if not edits:
            return self.step_time
        return self._apply({r: (lo, hi, self.orders[r], new)
                            for r, (lo, hi, new) in edits.items()})

    def _apply(self, edits: Mapping[int, tuple[int, int, list[int], list[int]]],
               deadlock: bool | None = None) -> float:
        """Re-time after these edits (rank -> first and last changed index, the order the
        program holds, the new one); ``deadlock``: whether they close a cycle, if known.
        The edits that take the last re-time back (the orders before it, exactly) put the
        times it changed back instead (:meth:`_way_back_to`)."""
        way, self._way = self._way, None
        if way is not None and self._back(way, edits):
            return self._way_back_to(way, edits)
        segments = []  # (first, last) position of each changed stretch
        whole = self._stuck or not self._positive or len(self._end) < self.SMALL
        if not whole and not deadlock:
            _ = self._start  # the old starts, the re-time's keys: before the orders change
        before = {r: old for r, (_, _, old, _) in edits.items()}
        stuck = self._stuck
        for r, (lo, hi, old, new) in edits.items():
            segments.append(self._place(r, lo, hi, old, new))
            self.orders[r] = new
            self._peaks[r] = None
        self.counts["re-timed"] += 1
        if deadlock:
            self._stuck = True  # (the next re-time runs the kernel's loop)
            self._way = (before, stuck, None)
        elif whole:
            self._way = (before, stuck, (self._end, self._start_list))  # (replaced, kept)
            self._full_run()  # the kernel's loop: on a small program, faster than any book
        elif deadlock is None and self._cycle(segments):
            self._stuck = True
            self._way = (before, stuck, None)
        else:
            undo = self._propagate(segments)
            if undo is None:
                self._way = (before, stuck, (list(self._end), list(self._start)))
                self._suffix_run(segments)  # it reached far: the kernel's loop from there on
                self.counts["suffix runs"] += 1
            else:
                self._way = (before, stuck, undo)
        return self.step_time

    def _back(self, way: tuple, edits: Mapping[int, tuple]) -> bool:
        """Whether ``edits`` give each rank the order ``way`` remembers, and only those."""
        orders = way[0]
        return len(edits) == len(orders) and all(
            r in orders and e[-1] == orders[r] for r, e in edits.items())

    def _way_back_to(self, way: tuple, edits: Mapping[int, tuple]) -> float:
        """Take the last re-time back without re-timing: put back the times it changed
        (its undo list, or copies of the ends and starts before a run of the kernel's
        loop; a deadlock found without a re-time changed none), then the steps, whose
        times travel with them to where they stood."""
        _, stuck, saved = way
        if isinstance(saved, list):
            start, end = self._start_list, self._end
            for q, t, e in reversed(saved):
                start[q], end[q] = t, e
        elif saved is not None:
            self._end, self._start_list = saved
        for r, (lo, hi, old, new) in edits.items():
            self._place(r, lo, hi, old, new)
            self.orders[r] = new
            self._peaks[r] = None
        self._stuck = stuck
        self.counts["restored"] += 1
        return self.step_time

    def _place(self, r: int, lo: int, hi: int, old: Sequence[int],
               new: Sequence[int]) -> tuple[int, int]:
        """Write steps ``new[lo..hi]`` of rank r into the positions of ``old[lo..hi]``; their
        times travel with them (the old ones: the keys of the re-timing)."""
        nodes_of = self._nodes_of
        p0 = self._pos_of[nodes_of[old[lo]][0]]
        ids = [x for i in new[lo:hi + 1] for x in nodes_of[i]]
        p1 = p0 + len(ids) - 1
        pos_of, end, start = self._pos_of, self._end, self._start_list
        was = {x: pos_of[x] for x in ids}
        new_end = [end[was[x]] for x in ids]
        self._node_at[p0:p1 + 1] = ids
        end[p0:p1 + 1] = new_end
        if start is not None:  # (not yet computed after a full run: nothing to carry)
            start[p0:p1 + 1] = [start[was[x]] for x in ids]
        for q, x in enumerate(ids, p0):
            pos_of[x] = q
        need, producer, prod_np = self._need, self._producer, self._producer_np
        for q, x in enumerate(ids, p0):
            producer[q] = prod_np[q] = pos_of[need[x]]
            self._lag[q] = self._lag_np[q] = self._lag_of[x]
            self._duration[q] = self._dur_of[x]
            for c in self._consumers[x]:
                producer[pos_of[c]] = prod_np[pos_of[c]] = q
        return p0, p1

    def _cycle(self, segments: list[tuple[int, int]]) -> bool:
        """Whether the changed orders close a cycle (see the module docstring)."""
        start, end, last = self._start, self._end, self.last
        back = False
        top = (-_INF, -_INF)
        for p0, p1 in segments:
            r = self._rank_at[p0]
            hi = min(p1 + 1, last[r])
            for q in range(max(p0, self.first[r] + 1), hi + 1):
                if (start[q - 1], end[q - 1]) >= (start[q], end[q]):
                    back = True
            for q in range(p0, p1 + 1):
                key = (start[q], end[q])
                if key > top:
                    top = key
        if not back:
            return False
        # Depth-first search from the changed steps over steps no later than ``top``.
        rank_at, pos_of, node_at = self._rank_at, self._pos_of, self._node_at
        consumers = self._consumers
        color: dict[int, int] = {}  # 1: on the path, 2: done
        for p0, p1 in segments:
            for root in range(p0, p1 + 1):
                if root in color:
                    continue
                color[root] = 1
                stack = [(root, self._succ(root, rank_at, last, pos_of, node_at, consumers))]
                while stack:
                    q, it = stack[-1]
                    for nxt in it:
                        if (start[nxt], end[nxt]) > top:
                            continue
                        c = color.get(nxt)
                        if c == 1:
                            return True
                        if c is None:
                            color[nxt] = 1
                            stack.append((nxt, self._succ(nxt, rank_at, last, pos_of,
                                                          node_at, consumers)))
                            break
                    else:
                        color[q] = 2
                        stack.pop()
        return False

    @staticmethod
    def _succ(q, rank_at, last, pos_of, node_at, consumers):
        if q < last[rank_at[q]]:
            yield q + 1
        for c in consumers[node_at[q]]:
            yield pos_of[c]

    def _propagate(self, segments: list[tuple[int, int]]) -> list | None:
        """Dirty propagation from the changed stretches (see the module docstring): the
        undo list (step, its start and end before, in the order evaluated); None (undone)
        once it has evaluated more than ``FAR`` of the steps."""
        start, end = self._start, self._end
        producer, lag, duration = self._producer, self._lag, self._duration
        last, rank_at, pos_of, node_at = self.last, self._rank_at, self._pos_of, self._node_at
        consumers = self._consumers
        queued = self._queued
        heap = []
        for p0, p1 in segments:  # the stretch first, in its new order (its old starts
            k0 = min(start[p0:p1 + 1])  # travelled with its steps: no order of the new one)
            for q in range(p0, min(p1 + 1, last[rank_at[p0]]) + 1):
                heap.append((k0, q))
                queued[q] = 1
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        budget = first = int(len(end) * self.FAR) + self.FLOOR
        undo = []  # (step, old start, old end): put back if the change reaches too far
        while heap:
            _, q = pop(heap)
            queued[q] = 0
            budget -= 1
            if not budget:
                for _, q in heap:
                    queued[q] = 0
                for q, t, e in reversed(undo):
                    start[q], end[q] = t, e
                self.counts["ends evaluated"] += first
                return None
            undo.append((q, start[q], end[q]))
            t = end[q - 1]
            x = end[producer[q]] + lag[q]
            if x > t:
                t = x
            e = t + duration[q]
            start[q] = t
            if e != end[q]:
                end[q] = e
                if q < last[rank_at[q]] and not queued[q + 1]:
                    queued[q + 1] = 1
                    push(heap, (start[q + 1], q + 1))
                for c in consumers[node_at[q]]:
                    pc = pos_of[c]
                    if not queued[pc]:
                        queued[pc] = 1
                        push(heap, (start[pc], pc))
        self.counts["ends evaluated"] += first - budget
        return undo

    def _suffix_run(self, segments: list[tuple[int, int]]) -> None:
        """Re-time with the kernel's loop from the earliest changed start on: a step that
        started before every changed one keeps its time (all it waits for ended before
        it, and none of that changed), so each rank restarts at its first step that
        started at or after that time (at the latest, where its order changed)."""
        from bisect import bisect_left

        start, end = self._start, self._end
        t0 = min(min(start[p0:p1 + 1]) for p0, p1 in segments)
        cut = {self._rank_at[p0]: p0 for p0, _ in sorted(segments, reverse=True)}
        frontier = []
        inf = _INF
        for r in range(len(self.orders)):
            lo, hi = self.first[r], self.last[r] + 1
            q = bisect_left(start, t0, lo, cut.get(r, hi))  # sorted up to the change
            frontier.append(q)
            end[q:hi] = [inf] * (hi - q)
        prog = Program(self._producer, self._lag, self._duration, end, frontier, self.last,
                       None, self._num_pairs)
        import numpy as np

        ends = run(prog)
        self._end = end = list(ends)
        self._stuck = any(end[q] == inf for q in self.last if q >= 0)
        e = np.frombuffer(ends, dtype=np.float64)
        producer, lag = self._producer_np, self._lag_np
        for r, q0 in enumerate(frontier):  # (the loop's max, vectorised: the same doubles)
            hi = self.last[r] + 1
            if hi > q0:
                start[q0:hi] = np.maximum(e[q0 - 1:hi - 1],
                                          e[producer[q0:hi]] + lag[q0:hi]).tolist()

    def _full_run(self) -> None:
        """Time the current program with the kernel's loop (its starts: when asked)."""
        prog = Program(self._producer, self._lag, self._duration, self._initial,
                       self.first, self.last, None, self._num_pairs)
        end = run(prog)
        self._end = list(end)
        self._stuck = any(end[q] == _INF for q in self.last if q >= 0)
        self._start_list = None

    @property
    def _start(self) -> list[float]:
        """Every step's start (``max(end[i - 1], end[producer[i]] + lag[i])``), computed
        from the ends after a full run, kept up to date by the incremental re-time."""
        if self._start_list is None:
            import numpy as np

            end = np.array(self._end)
            start = np.zeros(len(end))
            producer, lag = self._producer_np, self._lag_np
            for r in range(len(self.orders)):  # (the same max, vectorised)
                q = np.arange(self.first[r], self.last[r] + 1)
                start[q] = np.maximum(end[q - 1], end[producer[q]] + lag[q])
            self._start_list = start.tolist()
        return self._start_list
