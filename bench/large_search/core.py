"""The evaluation core with answers from the tails: :class:`TailsCompiled`.

:class:`~pipebubble.sim.program.Compiled` (the product's core) re-times every change. This
subclass adds what paid only on programs of 4,096 steps and more, so no product path reaches
it (``auto``'s local search stops at 300 actions): for one stretch of one rank reordered (a
swap of neighbours; one action moved up to :attr:`TailsCompiled.WINDOW` places), on a
program without Overlap pairs, :meth:`~TailsCompiled.swap`, :meth:`~TailsCompiled.move` and
:meth:`~TailsCompiled.reorder` first ask the critical-path analysis of ``critical.py``
(beside this file): the ends kept by the core (heads), the longest path from each step to
the end of the step (tails, one backward run of the kernel's loop, then kept up to date
backwards from each kept change, where tails change), give the new step time of the stretch
in a few dozen operations, or say that only a re-time can tell (a critical step moved and
the step may get shorter). A deadlock of a swap of neighbours is found there too, exactly.

The move is then *pending*: :attr:`~TailsCompiled.step_time`,
:attr:`~TailsCompiled.deadlocked`, :meth:`~TailsCompiled.peaks`, :meth:`~TailsCompiled.fits`
and :meth:`~TailsCompiled.schedule` answer without re-timing it (the peaks: the rank's
memory walk in its new order, exactly); the same move taken back cancels it at no cost;
anything else first re-times it (*settles* it): another move (the pending one was kept),
:meth:`~TailsCompiled.settle`, or a read of the times (``end_of``, ``ends_of``,
``start_of``). A caller that reads the times after every move gains nothing from the tails,
so after such a read they are rebuilt only every :attr:`~TailsCompiled.BACKOFF` re-times,
then twice as rarely, until a move is taken back again. ``counts`` counts what happened.

The one difference: a step time answered from the tails sums the same durations as the
kernel in another order, so it may differ from a full run in its last bits (within ``2 x``
:func:`critical.tolerance`, about ``3e-11`` of the step time on 50,000 actions; a test keeps
it there). A deadlock, the peaks, and every time once settled are the simulator's to the
last bit.

>>> from pipebubble import CostModel, get_schedule
>>> c = TailsCompiled(get_schedule("zb-h1", ranks=2, microbatches=4), CostModel(comm=0.5),
...                   tails_from=0)  # (small: answered from the tails only when asked to)
>>> c.step_time, c.swap(0, 1, 2), c.swap(0, 1, 2)  # 0F1 0I0 traded, then back
(15.0, 17.0, 15.0)
>>> c.counts["lazy"], c.counts["cancelled"], c.counts["re-timed"]
(1, 1, 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipebubble.costs import CostModel, StageCosts
from pipebubble.ir.schedule import Schedule, ScheduleError
from pipebubble.sim.program import Compiled, _peak

from .critical import Tails, Window, tolerance

_INF = float("inf")


class TailsCompiled(Compiled):
    """:class:`~pipebubble.sim.program.Compiled` plus answers from the tails (the module
    docstring). ``tails_from``: the size (steps) from which moves are answered from the
    tails (default :attr:`TAILS_FROM`)."""

    WINDOW = 16  # steps: a changed stretch up to this long may be answered from the tails
    BACKOFF = 8  # re-times before the tails are tried again after a read settled a move
    TAILS_FROM = 4096  # steps: below this, no answers from the tails (measured: on small
    # programs a full re-time is cheap and keeping the tails costs more than they save)

    def __init__(self, schedule: Schedule, costs: CostModel | StageCosts | None = None,
                 tails_from: int | None = None):
        super().__init__(schedule, costs)
        self._pending: tuple | None = None  # (rank, lo, hi, old order, answer, old peak)
        self._tails: Tails | None = None  # of the program as re-timed (None: not built)
        tails_from = self.TAILS_FROM if tails_from is None else tails_from
        self._window = None if (self._num_pairs or len(self._need) < tails_from
                                or any(len(c) > 1 for c in self._consumers)) \
            else Window(self._need, self._lag_of, self._dur_of, self._consumers,
                        self._rank_at, self.last)
        self._lazy = True  # whether to refresh stale tails (False after a read settled)
        self._backoff, self._waited = self.BACKOFF, 0
        self.counts.update({"lazy": 0, "cancelled": 0, "settled": 0, "tails evaluated": 0,
                            "tails re-runs": 0, "tails deferred": 0})
        self._version, self._top = 0, None  # (the ends' version; _seed_top's cache)

    # ---- the answers, a pending move included ------------------------------------
    @property
    def step_time(self) -> float:
        """The step time; of a pending move, the answer from the tails (equal to a full
        run's to within :attr:`rounding`)."""
        if self._pending is not None:
            return self._pending[4]
        return self._time()

    @property
    def pending(self) -> bool:
        """Whether the last move was answered from the tails and is not yet re-timed (the
        same move taken back then cancels it at no cost)."""
        return self._pending is not None

    @property
    def rounding(self) -> float:
        """How far :attr:`step_time` may be from a full run's: 0 once settled; of a pending
        move, ``2 x`` :func:`critical.tolerance` (the module docstring)."""
        if self._pending is None or self._pending[4] == _INF:
            return 0.0
        return 2 * tolerance(len(self._end), self._pending[4])

    @property
    def deadlocked(self) -> bool:
        if self._pending is not None:
            return self._pending[4] == _INF
        return self._stuck

    def end_of(self, step_id: int) -> float:
        if self._pending is not None:
            self._settle(read=True)
        return super().end_of(step_id)

    def ends_of(self, step_ids: Sequence[int]) -> tuple[float, ...]:
        if self._pending is not None:
            self._settle(read=True)
        return super().ends_of(step_ids)

    def start_of(self, step_id: int) -> float:
        if self._pending is not None:
            self._settle(read=True)
        return super().start_of(step_id)

    def peaks(self) -> list[float]:
        pend = self._pending
        if pend is not None and self._peaks[pend[0]] is None:  # the rank's new order
            r = pend[0]  # (no pairs: a step is one node)
            real = [x for i in self.orders[r] for x in self._nodes_of[i][:1] if self._real[x]]
            self._peaks[r] = _peak(self._d0[real], self._d1[real])
        return super().peaks()

    def ends_sum(self) -> float:
        if self._pending is not None:
            self._settle(read=False)
        return super().ends_sum()

    def critical(self, within: float = 0.0) -> list[tuple[int, int]]:
        """The (rank, index) of every step on a longest path, or within ``within`` of one
        (its end + tail at least the step time - ``within`` - the rounding allowance of
        :func:`critical.tolerance`), rank after rank; re-times a pending move first and
        brings the tails up to date (builds them the first time). Empty when the orders
        deadlock.

        >>> from pipebubble import CostModel, get_schedule
        >>> c = TailsCompiled(get_schedule("1f1b", ranks=2, microbatches=2), CostModel())
        >>> c.critical()  # rank 0: F F B B end at 1, 2, 6, 9; the second B starts at 7
        [(0, 0), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
        """
        import numpy as np

        if self._pending is not None:
            self._settle(read=False)
        if self._stuck:
            return []
        if self._num_pairs or any(len(c) > 1 for c in self._consumers):
            raise ScheduleError("critical(): not for programs with Overlap pairs")
        if self._tails is None:
            self._tails = Tails(self._producer, self._lag, self._duration, self._initial,
                                self.first, self.last)
        elif self._tails.dirty:
            self._update_tails()
        step = self._time()
        floor = step - within - tolerance(len(self._end), step)
        out = []
        end = np.asarray(self._end)
        for r in range(len(self.orders)):
            q = np.arange(self.first[r], self.last[r] + 1)
            hit = np.flatnonzero(end[q] + self._tails.tails(q) >= floor)
            out += [(r, int(k)) for k in hit]
        return out

    # ---- changing the orders -----------------------------------------------------
    def move(self, rank: int, k: int, to: int) -> float:
        """Take the ``k``-th step of ``rank`` out and put it back at position ``to`` (of
        the shortened order); return the new step time (from the tails, the move left
        pending, where they tell; else re-timed)."""
        order = list(self.orders[rank])
        order.insert(to, order.pop(k))
        return self._edit({rank: (min(k, to), max(k, to), order)})

    def swap(self, rank: int, k: int, k2: int) -> float:
        """Trade the ``k``-th and ``k2``-th steps of ``rank``; return the new step time (as
        :meth:`move`)."""
        order = list(self.orders[rank])
        order[k], order[k2] = order[k2], order[k]
        return self._edit({rank: (min(k, k2), max(k, k2), order)})

    def settle(self) -> float:
        """Re-time a pending move now (a move a search keeps); returns the step time. The
        reads (``end_of``, ``ends_of``, ``start_of``) do this themselves."""
        if self._pending is not None:
            self._settle(read=False)
        return self.step_time

    def _edit(self, edits: Mapping[int, tuple[int, int, list[int]]]) -> float:
        """Cancel the pending move if this takes it back, else settle it; then answer this
        one from the tails where that is exact (it stays pending), or re-time."""
        edits = {r: e for r, e in edits.items() if e[0] < e[1]}
        if not edits:
            return self.step_time
        pend = self._pending
        if pend is not None:
            r, lo, hi, old, _, peak = pend
            if list(edits) == [r]:
                lo2, hi2, new = edits[r]
                a, b = min(lo, lo2), max(hi, hi2)
                if new[a:b + 1] == old[a:b + 1]:  # the same move taken back: nothing to do
                    self.orders[r], self._peaks[r], self._pending = old, peak, None
                    self.counts["cancelled"] += 1
                    self._lazy, self._backoff = True, self.BACKOFF
                    return self.step_time
            self._settle(read=False)
        way = self._way
        if not (way is not None and self._back(way, edits)) and len(edits) == 1 \
                and self._window is not None and not self._stuck:
            ((r, (lo, hi, new)),) = edits.items()
            if hi - lo < self.WINDOW and self._tails_ready(self.first[r] + lo):
                p0 = self.first[r] + lo  # (no pairs: one node per step)
                step = self._time()
                got = self._window.step_time(
                    self._tails, self._end, self._pos_of, self._node_at, r, p0,
                    [self._nodes_of[i][0] for i in new[lo:hi + 1]], step,
                    tolerance(len(self._end), step))
                if got is not None:
                    self._pending = (r, lo, hi, self.orders[r], got, self._peaks[r])
                    self.orders[r], self._peaks[r] = new, None
                    self.counts["lazy"] += 1
                    return got
        return self._apply({r: (lo, hi, self.orders[r], new)
                            for r, (lo, hi, new) in edits.items()})

    def _settle(self, read: bool) -> None:
        """Re-time the pending move (its answer says whether it deadlocks). ``read``: a
        read asked for the times, a hint that the caller reads them after every move, so
        the tails are not rebuilt for the next few (:attr:`BACKOFF`)."""
        r, lo, hi, old, answer, _ = self._pending
        self._pending = None
        self.counts["settled"] += 1
        if read:
            self._lazy = False
        peak = self._peaks[r]  # (of the new order, if asked for while pending)
        self._apply({r: (lo, hi, old, self.orders[r])}, deadlock=answer == _INF)
        self._peaks[r] = peak

    def refresh_tails(self) -> None:
        """Bring the tails up to date now (the next move answered from them would do it
        first; a search that times its kept moves calls this to charge it to them)."""
        if self._pending is None and not self._stuck and self._window is not None:
            self._tails_ready()

    # ---- keeping the tails in step with the core's re-times -----------------------
    def _apply(self, edits: Mapping[int, tuple[int, int, list[int], list[int]]],
               deadlock: bool | None = None) -> float:
        self._version += 1  # (the ends change)
        back = self._way is not None and self._back(self._way, edits)
        if not back and self._stuck and self._tails is not None:
            self._tails = None  # (its seeds, left unmarked in a deadlock, wait in vain)
        step = super()._apply(edits, deadlock)
        if not back and self._tails is not None and not self._stuck:
            self._mark(edits)  # (in a deadlock: kept unmarked for the way back; anything
        return step  # else drops them)

    def _way_back_to(self, way: tuple, edits: Mapping[int, tuple]) -> float:
        step = super()._way_back_to(way, edits)
        if self._tails is not None:
            if self._stuck:
                self._tails = None
            else:
                self._mark(edits)
        return step

    def _mark(self, edits: Mapping[int, tuple]) -> None:
        """What the changed steps wait for may have other tails: mark it (no pairs where
        there are tails, so rank r's index k is position ``first[r] + k``)."""
        for r, (_, hi, _, _) in edits.items():
            self._tails.mark(self._end, self._end[self.first[r] + hi])

    def _place(self, r: int, lo: int, hi: int, old: Sequence[int],
               new: Sequence[int]) -> tuple[int, int]:
        was = None
        if self._tails is not None:  # where each placed node stood (its reach travels)
            was = {x: self._pos_of[x] for i in new[lo:hi + 1] for x in self._nodes_of[i]}
        p0, p1 = super()._place(r, lo, hi, old, new)
        if self._tails is not None:
            self._tails.place(p0, p1, self._node_at, self._pos_of, self._need, self._lag_of,
                              self._dur_of, self._consumers, self._rank_at, was)
        return p0, p1

    def _tails_ready(self, p0: int | None = None) -> bool:
        """Whether the tails are up to date, bringing them up to date (backwards from what
        changed, or all the first time) if that is likely to pay; with ``p0``, the first
        position of a stretch to answer: whether the tails it reads are up to date.

        Those are the tails of the stretch's steps and of what waits for them, all ending
        at or after ``end[p0]``. A kept change may have changed only the tails of what
        its steps (the seeds) wait for, which end no later than they do: so where every
        seed ends before ``end[p0]``, the tails the stretch reads hold, and the update
        waits for a stretch that needs it (on demand: a search that tries later moves
        after earlier ones updates them once a pass)."""
        t = self._tails
        if t is not None and not t.dirty:
            return True
        if t is not None and p0 is not None and t.seeds and self._end[p0] > self._seed_top():
            self.counts["tails deferred"] += 1
            return True
        if not self._lazy:
            self._waited += 1
            if self._waited < self._backoff:
                return False
            self._waited, self._backoff = 0, min(2 * self._backoff, 4096)
        if t is None:
            self._tails = Tails(self._producer, self._lag, self._duration, self._initial,
                                self.first, self.last)
        else:
            self._update_tails()
        return True

    def _seed_top(self) -> float:
        """The latest end of a step whose tails' inputs changed since the last update."""
        t = self._tails
        key = (self._version, len(t.seeds))
        if self._top is None or self._top[0] != key:
            end, mirror = self._end, t.mirror
            self._top = (key, max(end[mirror[m]] for m in t.seeds))
        return self._top[1]

    def _update_tails(self) -> None:
        """:meth:`Tails.update`, counted."""
        t = self._tails
        before = t.evaluated
        if not t.update():
            self.counts["tails re-runs"] += 1
        self.counts["tails evaluated"] += t.evaluated - before
