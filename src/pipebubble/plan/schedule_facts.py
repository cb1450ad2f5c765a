"""The schedules of one search and what the planner reads off them, each once per search.

:class:`ScheduleFacts` generates a family's schedule for a configuration (or remembers why
it has none), and answers from a schedule's orders alone: how many microbatches each stage
holds at once (:func:`~pipebubble.plan.families.held_per_stage`), whether it splits the
backward into I and W and whether it also has fused ones (B). It also builds order-free
schedules (a placement and no actions), which is all a cut's price needs, so bounds can be
taken before a schedule is generated. Everything here depends on the schedule only, never
on a point's sharding: it lives in the search's
:class:`~pipebubble.plan.search_cache.SearchCache`.

>>> from pipebubble.plan.dims import ParallelDims
>>> from pipebubble.plan.plans import Config
>>> facts = ScheduleFacts()
>>> c = Config(ParallelDims(pp=2), 1, 4, "1f1b", 1, "none", 0.0)
>>> facts.held(facts.schedule(c))  # 1F1B: stage 0 holds 2 microbatches, stage 1 one
[2, 1]
>>> facts.split(facts.schedule(c)), facts.generated(c)
(False, True)
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from ..errors import marked
from ..ir.schedule import (
    Overlap,
    PackedOrder,
    Schedule,
    ScheduleError,
    make_schedule,
)
from ..schedules import get_schedule, lookup
from .families import _held_both, by_stage
from .plans import Config
from .search_cache import SearchCache

_KIND = itemgetter(1)  # an Action's kind; an Overlap's second field is its backward Action


def _has_fused(order) -> bool:
    """Whether a rank's order runs a fused backward (B), an overlapped block's included;
    the scans of kinds and types run in C, the per-step one only where blocks overlap."""
    if "B" in map(_KIND, order):
        return True
    return Overlap in map(type, order) and any(
        a.kind == "B" for st in order if type(st) is Overlap for a in st)


def _in_order(sched: Schedule) -> bool:
    """Whether every stage runs its forwards in microbatch order, and its I's (each stage's
    actions as its rank runs them: :func:`~pipebubble.plan.families.by_stage`)."""
    stage, kind, mb = by_stage(sched)
    for code in (0, 1):  # F, I
        at = kind == code
        st, m = stage[at].astype(np.int64), mb[at].astype(np.int64)
        if not bool(np.all((np.diff(st) != 0) | (np.diff(m) > 0))):
            return False
    return True


class ScheduleFacts:
    """Schedules and their order-only facts, kept in ``cache`` (module doc)."""

    def __init__(self, cache: SearchCache | None = None):
        self.cache = SearchCache() if cache is None else cache
        self._schedules = self.cache.schedules
        self._held, self._split, self._shapes = self.cache.held, self.cache.split, self.cache.shapes
        self._in_order = self.cache.in_order
        self.why_not: dict[str, str] = self.cache.why_not

    def schedule(self, c: Config) -> Schedule | None:
        """The family's schedule of ``c`` (generated once per search), None if it has none
        (why: :attr:`why_not`, per family and pp)."""
        key = (c.schedule, c.pp, c.microbatches, c.chunks)
        if key not in self._schedules:
            try:
                self._schedules[key] = get_schedule(c.schedule, c.pp, c.microbatches, c.chunks)
            except ScheduleError as exc:
                self._schedules[key] = None
                self.why_not.setdefault(f"{c.schedule} pp={c.pp}", marked(exc))
        return self._schedules[key]

    def generated(self, c: Config) -> bool:
        """Whether ``c``'s schedule was asked for already (generated, or found to be none)."""
        return (c.schedule, c.pp, c.microbatches, c.chunks) in self._schedules

    def held(self, sched: Schedule, until: tuple[str, ...] = ("B", "W")) -> list[int]:
        """:func:`~pipebubble.plan.families.held_per_stage`, both kinds once per schedule."""
        got = self._held.get(id(sched))
        if got is None or got[0] is not sched:  # an id is reused once its object is gone
            got = self._held[id(sched)] = (sched, _held_both(sched))
        return got[1][0 if until == ("B", "W") else 1]

    def split(self, sched: Schedule) -> bool:
        """Whether the schedule splits W from the backward (once per schedule)."""
        return self.kinds(sched)[0]

    def kinds(self, sched: Schedule) -> tuple[bool, bool]:
        """(whether it has split backwards, whether it also has fused ones, B)."""
        got = self._split.get(id(sched))
        if got is None or got[0] is not sched:  # an id is reused once its object is gone
            split = sched.uses_split_backward()
            orders = sched.orders
            if split and all(isinstance(o, PackedOrder) for o in orders):
                fused = bool((np.concatenate([o.kind for o in orders]) == 3).any())  # B = 3
            else:
                fused = split and any(map(_has_fused, orders))
            got = self._split[id(sched)] = (sched, split, fused)
        return got[1], got[2]

    def trip_counts(self, sched: Schedule) -> list[int] | None:
        """Of an order the round-trip bound reads (:func:`~pipebubble.schedules.auto.bounds.
        bound` with ``held``): each stage's microbatches held at once until their I
        (:meth:`held` until B/I), when the order has one chain, splits every backward (I
        and W, no B: the bound's own actions) and runs each stage's forwards and I's in
        microbatch order (what the bound's argument needs; every family here does, but it
        is checked, once per schedule); else None."""
        got = self._in_order.get(id(sched))
        if got is None or got[0] is not sched:  # an id is reused once its object is gone
            split, fused = self.kinds(sched)
            ok = sched.chains == 1 and split and not fused and _in_order(sched)
            got = self._in_order[id(sched)] = (sched, ok)
        return self.held(sched, ("B", "I")) if got[1] else None

    def shape(self, c: Config, placement: str) -> Schedule:
        """A schedule with ``c``'s ranks, stages, microbatches and ``placement`` and no
        orders: what a cut's price needs of it (once per search)."""
        key = (c.pp, c.microbatches, c.pp * c.chunks, placement)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = make_schedule("shape", [()] * c.pp, c.pp * c.chunks,
                                                      c.microbatches, placement=placement)
        return shape

    def auto_shape(self, c: Config) -> Schedule:
        """An order-free schedule of auto's placement for ``c`` (what a price needs)."""
        key = ("auto shape", c.pp, c.chunks, c.microbatches)
        got = self._shapes.get(key)
        if got is None:
            got = self._shapes[key] = make_schedule(
                c.schedule, [()] * c.pp, c.pp * c.chunks, c.microbatches,
                placement=lookup(c.schedule).placement_at(c.chunks))
        return got
