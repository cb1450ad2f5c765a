"""Build an order on a few microbatches and repeat its steady state: big m at small cost.

A schedule built from a repeated pattern (a building block, or any generator whose middle
settles into a period) runs, on every rank, the same actions microbatch after microbatch
between its warm-up and its cool-down. :func:`extend` takes such an order for ``m0``
microbatches and returns it for ``m`` > ``m0``: on each rank it finds a *cut* where the
next period equals the previous one with every microbatch one higher, inserts ``m - m0``
more periods there and shifts what follows by ``m - m0``. Each stage keeps its F, I and W
in microbatch order, and since the inserted part is the steady state itself, every rank's
relation to its neighbours is the same as in the middle of the ``m0`` order: with unit
passes the step grows by exactly one period per microbatch.

It returns None when some rank has no cut (no steady state to repeat); callers then build
the order for ``m`` directly. Callers also validate: a cut is local to its rank.

>>> from pipebubble.ir.schedule import Action
>>> row = [Action(0, "F", j) for j in range(4)]
>>> [a.microbatch for a in extend([row], 4, 6, [1])[0]]
[0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import itemgetter

from ..ir.schedule import Action

_new = tuple.__new__


def _shift(a: Action, d: int) -> Action:
    """``a`` ``d`` microbatches later (made as a tuple: millions of them for large m)."""
    return _new(Action, (a[0], a[1], a[2] + d))


def find_cut(row: list[Action], length: int) -> int | None:
    """An index c near the middle of ``row`` with ``row[c:c+length]`` the previous
    ``length`` actions one microbatch later (and each (stage, kind) once in them)."""
    n = len(row)
    if n < 2 * length:
        return None
    middle = n // 2
    for off in range(0, n):
        for c in (middle - off, middle + off):
            if c < length or c + length > n:
                continue
            seg = row[c - length:c]
            if len({(a.stage, a.kind) for a in seg}) != length:
                continue
            if all(row[c + i] == _shift(seg[i], 1) for i in range(length)):
                return c
        if middle - off < length and middle + off + length > n:
            break
    return None


def extend(orders: list[list[Action]], m0: int, m: int, per_rank: list[int],
           packed: bool = False) -> list[list[Action]] | None:
    """``orders`` (for ``m0`` microbatches) with ``m - m0`` periods inserted on every
    rank; ``per_rank[r]`` is rank r's actions per microbatch (3 x its stages). None if a
    rank has no cut. With ``packed``, a grown row of lone Actions comes as a
    :class:`~pipebubble.ir.orders.RankOrder` (the same actions, laid out by numpy)."""
    extra = m - m0
    if extra <= 0:
        return orders if extra == 0 else None
    out = []
    for row, length in zip(orders, per_rank, strict=True):
        if not row:
            out.append(row)
            continue
        c = find_cut(row, length)
        if c is None:
            return None
        if packed and set(map(type, row)) == {Action}:
            out.append(_packed(row, c, length, extra))
            continue
        seg = row[c - length:c]
        grown = list(row[:c])
        # period d holds seg shifted by d: one column per action of seg (built in C by
        # map and zip), laid out period by period
        cols = [list(map(_new, repeat(Action), zip(repeat(a[0]), repeat(a[1]),
                                                   range(a[2] + 1, a[2] + extra + 1))))
                for a in seg]
        grown.extend(chain.from_iterable(zip(*cols, strict=True)))
        grown.extend([_new(Action, (s, k, j + extra)) for s, k, j in row[c:]])
        out.append(grown)
    return out


def _packed(row, c: int, length: int, extra: int):
    """:func:`extend`'s grown row as a RankOrder: ``row[:c]``, then ``extra`` copies of
    the period ``row[c - length:c]`` (copy d with every microbatch d higher), then
    ``row[c:]`` shifted by ``extra``."""
    import numpy as np

    from ..ir.orders import CODE, RankOrder

    stage = np.fromiter(map(itemgetter(0), row), dtype=np.int64, count=len(row))
    kind = np.fromiter(map(CODE.__getitem__, map(itemgetter(1), row)), dtype=np.int8,
                       count=len(row))
    mb = np.fromiter(map(itemgetter(2), row), dtype=np.int64, count=len(row))
    lo = c - length
    shifts = np.arange(1, extra + 1, dtype=np.int64)[:, None]
    return RankOrder(
        np.concatenate([stage[:c], np.tile(stage[lo:c], extra), stage[c:]]),
        np.concatenate([kind[:c], np.tile(kind[lo:c], extra), kind[c:]]),
        np.concatenate([mb[:c], (mb[lo:c][None, :] + shifts).ravel(), mb[c:] + extra]))
