"""Compact rank orders: a rank's actions as three integer arrays that read as Actions.

A million-action schedule held as a million ``Action`` tuples costs seconds to build and
hundreds of megabytes. :class:`RankOrder` keeps one rank's order as three numpy arrays
(stage, kind code, microbatch) and still *behaves as* the tuple of Actions it stands for:
``len``, indexing, slicing, iteration, ``==`` with a tuple, ``hash`` and ``repr`` are those
of that tuple. Generators build orders this way; the simulator and :func:`validate` read the
arrays directly without creating an Action per step. An order holding Overlap pairs (DualPipe)
adds a ``pair`` array: 1 at a pair's forward part, 2 at its backward part (the next entry),
0 for a lone action; it then reads as the tuple of steps, a pair as one Overlap.

Kind codes follow ``KINDS`` (F=0, I=1, W=2, B=3).

>>> o = RankOrder.build([1, 1, 1], "FFB", [0, 1, 0])
>>> o
(1F0, 1F1, 1B0)
>>> o[2], o == (Action(1, "F", 0), Action(1, "F", 1), Action(1, "B", 0))
(1B0, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache, partial
from typing import TYPE_CHECKING

from .schedule import KINDS, Action, Overlap, PackedOrder, ScheduleError, Step

if TYPE_CHECKING:
    import numpy as np

CODE = {k: i for i, k in enumerate(KINDS)}  # "F" -> 0, "I" -> 1, "W" -> 2, "B" -> 3
_new_action = partial(tuple.__new__, Action)  # Action from a (stage, kind, microbatch) tuple


class RankOrder(PackedOrder):
    """One rank's actions in order, stored as ``stage``, ``kind`` (codes) and ``microbatch``
    arrays of equal length, one entry per action, and ``pair`` (None when the order holds
    no Overlap; else int8 codes: 1 forward part, 2 backward part, 0 lone; all 0 reads as
    None does, which :meth:`split` leaves on a rank without pairs). ``len`` and
    indexing count steps (a pair is one step), as on the tuple it stands for. Immutable by
    convention: never write into the arrays."""

    __slots__ = ("stage", "kind", "microbatch", "pair", "_len", "_steps")

    def __init__(self, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray,
                 pair: np.ndarray | None = None):
        self.stage, self.kind, self.microbatch, self.pair = stage, kind, microbatch, pair
        self._len = len(stage) if pair is None else len(stage) - int((pair == 1).sum())
        self._steps: tuple[Step, ...] | None = None  # the steps, made on first indexing

    @classmethod
    def build(cls, stage: Iterable[int] | int, kinds: str | Iterable[int],
              microbatch: Iterable[int]) -> RankOrder:
        """From per-step stages (or one stage for all steps), kinds (a string of letters or
        an array of codes) and microbatches."""
        import numpy as np

        mb = np.asarray(microbatch, dtype=np.int64).ravel()
        if isinstance(kinds, str):
            kind = _tables()[0][np.frombuffer(kinds.encode(), dtype=np.uint8)]
            if (kind < 0).any():
                raise ScheduleError(f"unknown kind in {kinds[:40]!r}; valid are F, I, W, B")
        else:
            kind = np.asarray(kinds, dtype=np.int8).ravel()
            if len(kind) and (kind.min() < 0 or kind.max() > 3):
                raise ScheduleError("kind codes must be 0..3 (F, I, W, B)")
        if isinstance(stage, int | np.integer):
            st = np.full(len(mb), int(stage), dtype=np.int64)
        else:
            st = np.asarray(stage, dtype=np.int64).ravel()
        if not len(st) == len(kind) == len(mb):
            raise ValueError(f"stage, kind and microbatch lengths differ: "
                             f"{len(st)}, {len(kind)}, {len(mb)}")
        return cls(st, kind, mb)

    @classmethod
    def with_pairs(cls, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray,
                   pair: np.ndarray) -> RankOrder:
        """An order with Overlap pairs: ``pair`` 1 marks a pair's forward part, which must
        be a forward followed by a backward (B or I) marked 2; 0 a lone action."""
        import numpy as np

        pair = np.asarray(pair, dtype=np.int8)
        fwd = np.flatnonzero(pair == 1)
        ok = (len(pair) == len(stage) and not ((pair < 0) | (pair > 2)).any()
              and np.array_equal(np.flatnonzero(pair == 2), fwd + 1))
        if ok and len(fwd):
            ok = bool((kind[fwd] == CODE["F"]).all()
                      and ((kind[fwd + 1] == CODE["B"]) | (kind[fwd + 1] == CODE["I"])).all())
        if not ok:
            raise ScheduleError("an Overlap pairs a forward with a backward (F then B or I)")
        return cls(stage, kind, microbatch, pair if len(fwd) else None)

    @classmethod
    def split(cls, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray,
              offsets: list[int], pair: np.ndarray | None = None) -> list[RankOrder]:
        """Every rank's order as views of flat columns (int64 stages, int8 kind codes,
        int64 microbatches, int8 pair codes or None): rank r's actions are ``offsets[r]``
        to ``offsets[r + 1]``. A generator that writes all ranks' actions into one set of
        arrays hands them over this way, and ``ir/check.py`` then reads the flat columns
        as they are (no copy of a million actions).

        >>> import numpy as np
        >>> RankOrder.split(np.array([0, 0, 1, 1]), np.array([0, 3, 0, 3], dtype=np.int8),
        ...                 np.zeros(4, dtype=np.int64), [0, 2, 4])
        [(0F0, 0B0), (1F0, 1B0)]
        """
        if pair is not None:  # each pair's two parts on one rank, as with_pairs checks them
            import numpy as np

            starts = np.asarray(offsets[:-1])
            starts = starts[starts < len(pair)]
            if (pair[starts] == 2).any():
                raise ScheduleError("an Overlap pairs a forward with a backward (F then B "
                                    "or I)")
            cls.with_pairs(stage, kind, microbatch, pair)  # the checks, on all at once
        orders = []
        for lo, hi in zip(offsets[:-1], offsets[1:], strict=True):
            part = None if pair is None else pair[lo:hi]
            orders.append(cls(stage[lo:hi], kind[lo:hi], microbatch[lo:hi], part))
        return orders

    def num_actions(self) -> int:
        """Actions in the order: a pair counts as its two."""
        return len(self.stage)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Step]:
        if self._steps is not None:
            return iter(self._steps)
        kinds = _tables()[1][self.kind].tolist()
        actions = map(_new_action, zip(self.stage.tolist(), kinds, self.microbatch.tolist(),
                                       strict=True))
        if self.pair is None:
            return actions
        return _group(actions, self.pair.tolist())

    def __getitem__(self, index):
        """Indexing makes (once) and keeps the tuple of Actions: code that walks an order by
        index runs as fast as on a plain tuple."""
        if self._steps is None:
            self._steps = tuple(iter(self))
        return self._steps[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankOrder):
            import numpy as np

            pairs = [o.pair if o.pair is not None else 0 for o in (self, other)]
            return (len(self.stage) == len(other.stage) and len(self) == len(other)
                    and bool((self.stage == other.stage).all())
                    and bool((self.kind == other.kind).all())
                    and bool((self.microbatch == other.microbatch).all())
                    and bool(np.all(pairs[0] == pairs[1])))
        if isinstance(other, tuple | list):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __reduce__(self):  # pickles as the arrays
        return RankOrder, (self.stage, self.kind, self.microbatch, self.pair)


def _group(actions: Iterator[Action], pair: list[int]) -> Iterator[Step]:
    """Steps from actions: a forward part (pair code 1) and the next action as one Overlap."""
    for code in pair:
        if code == 1:
            yield Overlap(next(actions), next(actions))
        elif code == 0:
            yield next(actions)


@cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(kind letter byte -> code, -1 if not a kind; code -> Kind member), built on first use
    so that importing this module does not import numpy."""
    import numpy as np

    letters = np.full(256, -1, dtype=np.int8)
    for k, c in CODE.items():
        letters[ord(k)] = c
    return letters, np.array(KINDS, dtype=object)


def interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a[0], b[0], a[1], b[1], ...`` for arrays of equal length (1F1B's steady state).

    >>> import numpy as np
    >>> interleave(np.array([2, 3]), np.array([0, 1])).tolist()
    [2, 0, 3, 1]
    """
    import numpy as np

    return np.stack([a, b], axis=1).ravel()
