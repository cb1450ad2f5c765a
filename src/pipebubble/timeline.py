"""Timeline: the single record of what happened, simulated or measured, and its metrics.

Events are kept as columns (one list per field, rank-major: all of rank 0's events in time
order, then rank 1's, ...) so a million-action timeline stays cheap. ``events()`` yields
:class:`Event` tuples for code that wants rows.

Metrics (DESIGN.md):

- step time: last end minus first start over all ranks.
- per rank: busy (sum of durations), idle = step time - busy, bubble = idle / step time,
  span = the rank's last end - its first start.
- bubble fraction = total idle / (ranks x step time).
- lower bound = the busiest rank's busy time (no schedule can beat it).
- memory: each event adds ``mem_start`` at its start and ``mem_end`` at its end (F allocates
  activations, B/I/W free them), giving memory over time and its peak per rank.
- in-flight activations: microbatches whose F is done on a stage and whose I/B has not run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class Event(NamedTuple):
    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    mem_start: float = 0.0
    mem_end: float = 0.0
    overlapped: bool = False
    a2a_hidden: float = 0.0  # all-to-all inside the action hidden behind a pair's compute
    a2a_exposed: float = 0.0  # all-to-all inside the action that the rank waits for


@dataclass
class RankStats:
    """One rank's figures. ``a2a_hidden`` / ``a2a_exposed``: the rank's all-to-all time
    hidden in overlapped pairs / exposed (lone actions, and what outlasts a pair's compute),
    None when the timeline records no all-to-all."""

    rank: int
    busy: float
    idle: float
    bubble_fraction: float
    span: float
    peak_activations: int
    peak_memory: float
    a2a_hidden: float | None = None
    a2a_exposed: float | None = None

    def as_dict(self) -> dict:
        out = {
            "rank": self.rank,
            "busy": self.busy,
            "idle": self.idle,
            "bubble_fraction": self.bubble_fraction,
            "span": self.span,
            "peak_activations": self.peak_activations,
            "peak_memory": self.peak_memory,
        }
        if self.a2a_hidden is not None:
            out["a2a_hidden"] = self.a2a_hidden
            out["a2a_exposed"] = self.a2a_exposed
        return out


@dataclass
class Timeline:
    """Columns of events plus what they came from. Build with ``Timeline.from_events``."""

    schedule: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    # Each column a list, or (from the simulator) a memoryview of a numpy array: either
    # indexes as Python ints and floats. ``kind``: a list of letters, or (from the
    # simulator) one str of them, which indexes, slices and iterates as letters too.
    rank: Sequence[int]
    stage: Sequence[int]
    kind: Sequence[str]
    microbatch: Sequence[int]
    start: Sequence[float]
    end: Sequence[float]
    mem_start: Sequence[float]
    mem_end: Sequence[float]
    overlapped: Sequence[bool]
    source: str = "simulated"
    # Independent stage chains (DualPipe's two model copies: 2), each running
    # num_microbatches. Derived from ``chain_starts``; kept as an argument so that a caller
    # that knows only the count (evenly sized chains) can still say it.
    chains: int = 1
    offsets: list[int] = field(default_factory=list)  # rank r's events: offsets[r]:offsets[r+1]
    _stats: list[RankStats] | None = field(default=None, repr=False)
    _step: float | None = field(default=None, repr=False)
    _np: dict | None = field(default=None, repr=False)
    _kinds: frozenset[str] | None = field(default=None, repr=False)
    # First stage of each chain, as ``Schedule.chain_starts`` (DualPipe p=4: ``(0, 4)``).
    chain_starts: tuple[int, ...] = ()
    # Per event, the all-to-all inside it hidden behind an overlapped pair's compute and
    # exposed (``StageCosts.pair_parts``); None when nothing records all-to-all.
    a2a_hidden: Sequence[float] | None = None
    a2a_exposed: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if not self.offsets:
            self.offsets = _rank_offsets(self.rank, self.num_ranks)
        self.chain_starts = _chain_starts(self.chain_starts, self.chains, self.num_stages)
        self.chains = len(self.chain_starts)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_events(
        cls,
        events: Sequence[Event],
        *,
        schedule: str,
        num_ranks: int,
        num_stages: int,
        num_microbatches: int,
        stage_to_rank: Sequence[int],
        source: str = "measured",
        shift_to_zero: bool = True,
        chains: int = 1,
        chain_starts: Sequence[int] = (),
    ) -> Timeline:
        """Sort events by (rank, start) and, by default, shift time so the first start is 0.

        ``chain_starts`` (or, for evenly sized chains, their number ``chains``) says where
        independent stage chains begin, as ``Schedule.chain_starts``."""
        evs = sorted(events, key=lambda e: (e.rank, e.start, e.end))
        t0 = min((e.start for e in evs), default=0.0) if shift_to_zero else 0.0
        a2a = any(e.a2a_hidden or e.a2a_exposed for e in evs)
        return cls(
            schedule=schedule,
            num_ranks=num_ranks,
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            stage_to_rank=tuple(stage_to_rank),
            rank=[e.rank for e in evs],
            stage=[e.stage for e in evs],
            kind=[e.kind for e in evs],
            microbatch=[e.microbatch for e in evs],
            start=[e.start - t0 for e in evs],
            end=[e.end - t0 for e in evs],
            mem_start=[e.mem_start for e in evs],
            mem_end=[e.mem_end for e in evs],
            overlapped=[e.overlapped for e in evs],
            source=source,
            chains=chains,
            chain_starts=tuple(chain_starts),
            a2a_hidden=[e.a2a_hidden for e in evs] if a2a else None,
            a2a_exposed=[e.a2a_exposed for e in evs] if a2a else None,
        )

    def __len__(self) -> int:
        return len(self.start)

    def __repr__(self) -> str:
        """One short line (the columns would print every event):
        ``Timeline('1f1b', simulated, ranks=4, stages=4, microbatches=8, events=64,
        step_time=33)``."""
        return (f"Timeline({self.schedule!r}, {self.source}, ranks={self.num_ranks}, "
                f"stages={self.num_stages}, microbatches={self.num_microbatches * self.chains}, "
                f"events={len(self)}, step_time={self.step_time:.6g})")

    def events(self, rank: int | None = None) -> Iterator[Event]:
        lo, hi = (0, len(self)) if rank is None else (self.offsets[rank], self.offsets[rank + 1])
        hidden, exposed = self.a2a_hidden, self.a2a_exposed
        for i in range(lo, hi):
            yield Event(
                self.rank[i], self.stage[i], self.kind[i], self.microbatch[i], self.start[i],
                self.end[i], self.mem_start[i], self.mem_end[i], self.overlapped[i],
                hidden[i] if hidden is not None else 0.0,
                exposed[i] if exposed is not None else 0.0,
            )

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds its events have (``{"F", "B"}`` for 1F1B), found once."""
        if self._kinds is None:
            self._kinds = frozenset(self.kind)
        return self._kinds

    @property
    def has_a2a(self) -> bool:
        """Whether the events record all-to-all (hidden and exposed) time."""
        return self.a2a_hidden is not None and self.a2a_exposed is not None

    # ---- metrics --------------------------------------------------------------------
    @property
    def chunks(self) -> int:
        """Stages per rank per chain (``v``), as ``Schedule.chunks``: 2 for interleaved 1F1B
        with two chunks and for ZB-V (one chain of 2p stages), 1 for DualPipe (two chains
        of p stages: each rank holds one stage of each model copy)."""
        return max(1, self.num_stages // max(1, self.num_ranks * self.chains))

    @property
    def step_time(self) -> float:
        if self._step is None:
            self._step = (float(self._column("end").max() - self._column("start").min())
                          if len(self.start) else 0.0)
        return self._step

    def rank_stats(self) -> list[RankStats]:
        if self._stats is None:
            self._stats = [self._one_rank(r) for r in range(self.num_ranks)]
        return self._stats

    def _column(self, name: str) -> np.ndarray:
        """One column as a numpy array, built once and only when asked (the metrics are
        vectorised): ``start``, ``end``, ``m0``/``m1`` (memory at an event's start / end)
        and ``inflight`` (+1 for F, -1 for B and I). The simulator's columns are C arrays,
        which numpy reads without a copy."""
        if self._np is None:
            self._np = {}
        got = self._np.get(name)
        if got is None:
            if name == "inflight":
                got = _inflight(self.kind)
            else:
                source = {"start": self.start, "end": self.end, "m0": self.mem_start,
                          "m1": self.mem_end}[name]
                got = np.asarray(source, dtype=np.float64)
            self._np[name] = got
        return got

    def _arrays(self) -> dict[str, np.ndarray]:
        """Every column of :meth:`_column` as numpy arrays (built once)."""
        for name in ("start", "end", "m0", "m1", "inflight"):
            self._column(name)
        assert self._np is not None
        return self._np

    def _one_rank(self, r: int) -> RankStats:
        lo, hi = self.offsets[r], self.offsets[r + 1]
        step = self.step_time
        a = self._arrays()
        starts, ends = a["start"][lo:hi], a["end"][lo:hi]
        busy = float(ends.sum() - starts.sum())
        idle = max(0.0, step - busy)
        span = float(ends.max() - starts.min()) if hi > lo else 0.0
        # Memory changes at each event's start (m0) and end (m1), in time order.
        deltas = np.empty(2 * (hi - lo))
        deltas[0::2] = a["m0"][lo:hi]
        deltas[1::2] = a["m1"][lo:hi]
        peak = max(0.0, float(np.cumsum(deltas).max())) if hi > lo else 0.0
        top = max(0, int(np.cumsum(a["inflight"][lo:hi]).max())) if hi > lo else 0
        hidden = exposed = None
        if self.has_a2a:
            hidden = float(np.asarray(self.a2a_hidden[lo:hi], dtype=np.float64).sum())
            exposed = float(np.asarray(self.a2a_exposed[lo:hi], dtype=np.float64).sum())
        return RankStats(
            rank=r,
            busy=busy,
            idle=idle,
            bubble_fraction=idle / step if step > 0 else 0.0,
            span=span,
            peak_activations=top,
            peak_memory=peak,
            a2a_hidden=hidden,
            a2a_exposed=exposed,
        )

    @property
    def bubble_fraction(self) -> float:
        """Total idle / (ranks x step time)."""
        step = self.step_time
        if step <= 0:
            return 0.0
        return sum(s.idle for s in self.rank_stats()) / (self.num_ranks * step)

    @property
    def lower_bound(self) -> float:
        """The busiest rank's busy time: no order of these actions can finish sooner."""
        return max((s.busy for s in self.rank_stats()), default=0.0)

    def memory_curve(self, rank: int) -> tuple[list[float], list[float]]:
        """Activation memory of ``rank`` over time as a step function: (times, values)."""
        lo, hi = self.offsets[rank], self.offsets[rank + 1]
        times, values, cur = [0.0], [0.0], 0.0
        for i in range(lo, hi):
            cur += self.mem_start[i]
            times.append(self.start[i])
            values.append(cur)
            cur += self.mem_end[i]
            times.append(self.end[i])
            values.append(cur)
        return times, values

    def summary(self) -> dict:
        """The JSON contract (without ``events``): see README, "JSON output". With
        all-to-all, also ``a2a_hidden`` and ``a2a_exposed``: their sums over the ranks."""
        out = {
            "schedule": self.schedule,
            "ranks": self.num_ranks,
            "stages": self.num_stages,
            "microbatches": self.num_microbatches * self.chains,
            "step_time": self.step_time,
            "bubble_fraction": self.bubble_fraction,
            "lower_bound": self.lower_bound,
            "per_rank": [s.as_dict() for s in self.rank_stats()],
        }
        if self.has_a2a:
            stats = self.rank_stats()
            out["a2a_hidden"] = sum(s.a2a_hidden or 0.0 for s in stats)
            out["a2a_exposed"] = sum(s.a2a_exposed or 0.0 for s in stats)
        return out

    def events_json(self) -> list[dict]:
        comm = self.has_a2a
        out = []
        for e in self.events():
            row = {"rank": e.rank, "stage": e.stage, "kind": e.kind,
                   "microbatch": e.microbatch, "start": e.start, "end": e.end}
            if comm:
                row["a2a_hidden"] = e.a2a_hidden
                row["a2a_exposed"] = e.a2a_exposed
            out.append(row)
        return out


_INFLIGHT = np.zeros(128, dtype=np.int8)  # (cumsum of int8 counts in int64)
_INFLIGHT[ord("F")], _INFLIGHT[ord("B")], _INFLIGHT[ord("I")] = 1, -1, -1


def _inflight(kind: Sequence[str]) -> np.ndarray:
    """+1 per F, -1 per B or I, 0 for any other kind: the change in activations held
    (int8: numpy sums and cumsums small ints in int64).
    One-letter ASCII kinds (every simulated timeline's) are read as bytes, several times
    faster than a numpy string array; others by their first letter, as before."""
    if not len(kind):
        return np.zeros(0, dtype=np.int8)
    letters = "".join(kind)  # (a str of letters: itself)
    if len(letters) == len(kind) and letters.isascii() and (
            isinstance(kind, str) or "" not in kind):
        return _INFLIGHT[np.frombuffer(letters.encode("ascii"), dtype=np.uint8)]
    codes = np.array(kind, dtype="U1")
    return ((codes == "F").astype(np.int8) - (codes == "B") - (codes == "I")).astype(np.int8)


def _chain_starts(starts: Sequence[int], chains: int, num_stages: int) -> tuple[int, ...]:
    """``starts`` checked, or ``chains`` evenly sized chains' starts when none is given."""
    if starts:
        out = tuple(sorted({int(c) for c in starts}))
        if out[0] != 0 or out[-1] >= max(1, num_stages):
            raise ValueError(f"chain_starts must start at 0 and lie in 0..{num_stages - 1}, "
                             f"got {tuple(starts)}")
        return out
    if chains < 1 or (chains > 1 and num_stages % chains):
        raise ValueError(f"{num_stages} stages do not form {chains} equal chains; give "
                         "chain_starts")
    return tuple(range(0, max(1, num_stages), max(1, num_stages // chains)))[:chains]


def _rank_offsets(ranks: list[int], num_ranks: int) -> list[int]:
    """Offsets of each rank's block in rank-major columns; checks the columns are rank-major."""
    if num_ranks < 1:
        raise ValueError(f"a timeline needs num_ranks >= 1, got {num_ranks}")
    offsets = [0] * (num_ranks + 1)
    for r in ranks:
        if not 0 <= r < num_ranks:
            raise ValueError(f"event on rank {r}; valid ranks are 0..{num_ranks - 1}")
        offsets[r + 1] += 1
    for r in range(num_ranks):
        offsets[r + 1] += offsets[r]
    if any(ranks[i] > ranks[i + 1] for i in range(len(ranks) - 1)):
        raise ValueError("timeline columns must be rank-major; use Timeline.from_events")
    return offsets
