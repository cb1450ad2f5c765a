"""Validation in one vectorised pass: a schedule's actions as flat arrays, checked at once.

:func:`flat_actions` lays every rank's actions end to end (rank 0's, then rank 1's, ...;
an Overlap contributes its forward then its backward) as numpy arrays, and checks the rules
of :func:`~pipebubble.ir.schedule.validate` on them with a handful of array operations
instead of one dictionary lookup per action. The simulator compiles from these same arrays,
so validating and compiling a schedule is one pass over its actions.

The rules, with ``key = kind x S x M + stage x M + microbatch`` numbering every possible
action once (a table of each key's flat index, -1 where none, answers them all):

- kinds known, stages in 0..S-1, microbatches in 0..M-1, every stage on its own rank;
- no key twice (no duplicate);
- for every (stage, microbatch): one F; one B or one I, never both; a W exactly when an I;
- in the rank's order, F before its B or I, and I before its W (same stage: same rank).

When a rule fails, the readable one-action-at-a-time scan (``schedule._scan``) runs to
name the first offending action with the same message :func:`validate` always gave.
"""

from __future__ import annotations

import weakref
from operator import itemgetter
from typing import TYPE_CHECKING, NamedTuple

from . import schedule as _schedule
from .orders import CODE, RankOrder
from .schedule import Overlap, Schedule, ScheduleError, _scan

if TYPE_CHECKING:
    import numpy as np

F, I, W, B = (CODE[k] for k in "FIWB")  # noqa: E741


class FlatActions(NamedTuple):
    """Every action of a schedule, rank-major. Rank r's are ``offsets[r]:offsets[r + 1]``.
    ``pair`` is 0 for a lone action, 1 for the forward part of an Overlap, 2 for its
    backward part (which follows at the next index)."""

    offsets: list[int]
    stage: np.ndarray
    kind: np.ndarray
    microbatch: np.ndarray
    pair: np.ndarray
    rank: np.ndarray  # the rank of each action


class LiveKept:
    """Values kept for live objects (schedules, whose orders are immutable), by identity:
    at most ``size`` of them, the least recently asked for dropped first; each dropped when
    its object is collected (a weak reference), so a newer object given a collected one's
    id is never answered for it. An object that cannot be referred to weakly is not kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: dict[int, tuple[weakref.ref, object]] = {}

    def get(self, obj: object):
        """The value kept for ``obj`` (now the most recently asked for), or None."""
        key = id(obj)
        got = self._kept.get(key)
        if got is None or got[0]() is not obj:
            return None
        if next(reversed(self._kept)) != key:
            self._kept[key] = self._kept.pop(key)
        return got[1]

    def put(self, obj: object, value: object) -> bool:
        """Keep ``value`` for ``obj`` (the newest); False if ``obj`` cannot be kept."""
        key = id(obj)
        try:
            ref = weakref.ref(obj, lambda r, key=key: self._forget(key, r))
        except TypeError:
            return False
        self._kept.pop(key, None)
        self._kept[key] = (ref, value)
        while len(self._kept) > self.size:
            self._kept.pop(next(iter(self._kept)), None)
        return True

    def _forget(self, key: int, ref: weakref.ref) -> None:
        """``key``'s object is gone: drop its value (unless the id went to a newer one)."""
        got = self._kept.get(key)
        if got is not None and got[0] is ref:
            del self._kept[key]

    def clear(self) -> None:
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


KEEP_FLAT = 32  # schedules whose checked flat actions are kept (a planner simulates one
# schedule under many costs; validate() then simulate() reads one twice)
_kept = LiveKept(KEEP_FLAT)  # the schedule -> its checked arrays
KEEP_CHECKED = 4096  # schedules known valid (no arrays): a schedule whose arrays were
# dropped is laid out again but not checked again (its orders are immutable)
_checked = LiveKept(KEEP_CHECKED)


def flat_actions(schedule: Schedule) -> FlatActions:
    """The schedule's actions as checked flat arrays; raise ScheduleError like validate().
    The arrays of the :data:`KEEP_FLAT` schedules asked for last are kept (its orders are
    immutable), each while the schedule lives."""
    got = _kept.get(schedule)
    if got is not None:
        return got
    flat = _flatten(schedule)
    # (checked once: the arrays of a schedule whose arrays were dropped are laid out again,
    # a fraction of the check's cost)
    if flat is None or (_checked.get(schedule) is None and not _valid(schedule, flat)):
        _scan(schedule)  # names the first bad action
        raise ScheduleError(f"schedule {schedule.name!r} is invalid")  # _scan always raises
    if _kept.put(schedule, flat):
        _checked.put(schedule, True)
    return flat


def _flatten(schedule: Schedule) -> FlatActions | None:
    """Rank orders -> flat arrays; None if a kind is unknown (the scan names it)."""
    import numpy as np

    joined = _joined(schedule.orders)
    if joined is not None:
        return joined
    stages, kinds, mbs, pairs, offsets = [], [], [], [], [0]
    for order in schedule.orders:
        if isinstance(order, RankOrder):
            stages.append(order.stage)
            kinds.append(order.kind)
            mbs.append(order.microbatch)
            n = len(order.stage)
            pairs.append(np.zeros(n, dtype=np.int8) if order.pair is None else order.pair)
            offsets.append(offsets[-1] + n)
            continue
        paired = [type(step) is Overlap for step in order]
        any_pair = True in paired
        acts = [a for step, p in zip(order, paired, strict=True)
                for a in (step if p else (step,))] if any_pair else order
        try:  # columns by itemgetter: several times faster than zip(*acts) on long orders
            if acts and set(map(len, acts)) != {3}:
                return None
            s, k, m = (list(map(itemgetter(i), acts)) for i in range(3))
            codes = list(map(CODE.__getitem__, k))
        except (KeyError, TypeError, IndexError):
            return None
        pair = np.zeros(len(acts), dtype=np.int8)
        if any_pair:  # 1 at each pair's forward part, 2 at its backward part (next)
            fwd = np.cumsum(np.array(paired, dtype=np.int64) + 1)[np.array(paired)] - 2
            pair[fwd], pair[fwd + 1] = 1, 2
        stages.append(np.array(s, dtype=np.int64))
        kinds.append(np.array(codes, dtype=np.int8))
        mbs.append(np.array(m, dtype=np.int64))
        pairs.append(pair)
        offsets.append(offsets[-1] + len(acts))
    cat = np.concatenate
    rank = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    if not stages:
        empty = np.zeros(0, dtype=np.int64)
        return FlatActions(offsets, empty, empty.astype(np.int8), empty, empty.astype(np.int8),
                           rank)
    return FlatActions(offsets, cat(stages), cat(kinds), cat(mbs), cat(pairs), rank)


def _joined(orders: tuple) -> FlatActions | None:
    """The flat arrays of orders that are views of them, end to end (what
    :meth:`RankOrder.split <pipebubble.ir.orders.RankOrder.split>` makes), without a copy;
    None for any other orders."""
    import numpy as np

    if not orders or not all(isinstance(o, RankOrder) for o in orders):
        return None
    offsets = [0]
    for o in orders:
        offsets.append(offsets[-1] + len(o.stage))
    columns = []
    for name, dtype in (("stage", np.int64), ("kind", np.int8), ("microbatch", np.int64)):
        whole = _whole([getattr(o, name) for o in orders], dtype)
        if whole is None:
            return None
        columns.append(whole)
    if all(o.pair is None for o in orders):
        pair = np.zeros(offsets[-1], dtype=np.int8)
    else:
        pair = _whole([o.pair for o in orders], np.int8)
        if pair is None:
            return None
    rank = np.repeat(np.arange(len(orders)), np.diff(offsets))
    return FlatActions(offsets, *columns, pair, rank)


def _whole(parts: list, dtype: type) -> np.ndarray | None:
    """The one 1-D array of ``dtype`` whose consecutive slices ``parts`` are, first to
    last and covering all of it; None if they are not."""
    import numpy as np

    base = parts[0].base if isinstance(parts[0], np.ndarray) else None
    if (not isinstance(base, np.ndarray) or base.dtype != dtype or base.ndim != 1
            or not base.flags.c_contiguous):
        return None
    at, size = base.__array_interface__["data"][0], base.itemsize
    for part in parts:
        if (not isinstance(part, np.ndarray) or part.base is not base
                or part.__array_interface__["data"][0] != at or part.strides != (size,)):
            return None
        at += len(part) * size
    return base if at == base.__array_interface__["data"][0] + base.nbytes else None


def _valid(schedule: Schedule, flat: FlatActions) -> bool:
    """All of validate()'s rules at once (see the module docstring)."""
    import numpy as np

    p, S, M = schedule.num_ranks, schedule.num_stages, schedule.num_microbatches
    where = schedule.stage_to_rank
    if len(where) != S or any(not 0 <= r < p for r in where):
        return False
    n, SM = len(flat.stage), S * M
    if not 2 * SM <= n <= 3 * SM:  # each (stage, mb) runs F and B, or F, I and W
        return False
    stage, kind, mb = flat.stage, flat.kind, flat.microbatch
    if n and (stage.min() < 0 or stage.max() >= S or mb.min() < 0 or mb.max() >= M
              or kind.min() < 0 or kind.max() > 3):
        return False
    if not (np.asarray(where)[stage] == flat.rank).all():
        return False
    key = kind.astype(np.int64) * SM + stage * M + mb
    # pos[key]: the flat index of that action, -1 where none. A key held twice keeps one
    # of its indices, so the other reads back different: a duplicate.
    index = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    pos = np.full(4 * SM, -1, dtype=index.dtype)
    pos[key] = index
    if not (pos[key] == index).all():
        return False
    pos_f, pos_i, pos_w, pos_b = (pos[c * SM:(c + 1) * SM] for c in (F, I, W, B))
    has_i = pos_i >= 0
    if not ((pos_f >= 0).all() and (has_i != (pos_b >= 0)).all()
            and (has_i == (pos_w >= 0)).all()):
        return False
    # F before its B or I (exactly one of them is there: the other reads -1), I before its
    # W (where neither is there, both read -1).
    return bool((pos_f < np.maximum(pos_b, pos_i)).all() and (pos_i <= pos_w).all())


_schedule.VECTORISED.append(flat_actions)  # validate() runs this pass from now on
