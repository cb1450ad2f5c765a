"""simulate(schedule, costs) -> Timeline: the fast kernel.

It computes exactly what ``sim/reference.py`` computes (read that first: forty lines that
follow DESIGN.md), on a million actions in about a second of CPython. A hypothesis test
keeps the two equal on random schedules, Overlap pairs and several chains included.

How it stays fast:

1. **Compile with numpy, validate on the way.** ``ir/check.py`` lays every action out in
   flat arrays and checks :func:`~pipebubble.ir.schedule.validate`'s rules on them at once.
   Each signal (``ir/deps.py``: F(s, m) done, the input gradient of (s, m) ready, W(s, m)
   done) gets a *slot*, an index into one list ``done`` of end times, ``inf`` until the
   signal exists. The rule of ``ir/deps.py`` (:func:`~pipebubble.ir.deps.needs`,
   :func:`~pipebubble.ir.deps.produces`) is applied once per (stage, kind) to build a
   template; adding the microbatch gives every action its :class:`Compiled` fields in a few
   vectorised operations. A missing dependency points at a slot that is always 0.
2. **A tight loop per rank.** A rank runs its compiled actions in order while their slots
   are filled: ``start = max(clock, done[dep_a] + lag_a, done[dep_b] + lag_b)``. "Not ready
   yet" is one comparison with ``inf``.
3. **Wake ranks, do not poll them.** A rank that finds a slot empty waits on the rank that
   will fill it (the rank of the slot's stage) and is put back in the queue when that rank
   has run. Every action is timed exactly once and no blocked rank is visited in vain, so
   the cost is linear in actions *and* in ranks (p = 16000 with one microbatch is as cheap
   per action as p = 4). The order in which ranks run changes nothing: the result is the
   longest path through the DAG of rank orders and dependencies.

When the queue is empty and actions remain, nothing can advance: a deadlock. The error
names the action each unfinished rank is stuck at and what it waits for
(:func:`~pipebubble.ir.deps.describe_wait`). The simulator never hangs.

An Overlap (DualPipe's F&B pair) runs as one block of ``overlap x (F + B)``: its forward
part also waits for its backward part's gradient, so the block starts when both parts may
start, and the parts are recorded back to back, each scaled by ``overlap``.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import chain
from typing import TYPE_CHECKING, NamedTuple

from ..costs import CostModel, StageCosts
from ..ir.check import B, F, FlatActions, I, flat_actions
from ..ir.deps import describe_wait, needs, produces
from ..ir.schedule import KINDS, Action, Schedule, ScheduleError
from ..timeline import Timeline

if TYPE_CHECKING:
    import numpy as np

_INF = float("inf")
SLOT_BASE = {"F": 0, "I": 1, "W": 2}  # a signal's slot: (base x S + stage) x M + microbatch


class Deadlock(ScheduleError):
    """No rank can advance. ``stuck`` maps rank -> (stuck action, what it waits for)."""

    def __init__(self, stuck: dict[int, tuple[str, str]]):
        self.stuck = stuck
        detail = "; ".join(f"rank {r} stuck at {a} waiting for {w}" for r, (a, w) in stuck.items())
        super().__init__(f"deadlock: {detail}")


class Compiled(NamedTuple):
    """One action as the loop reads it (columns of arrays, one entry per action): it may
    start at ``max(clock, done[dep_a] + lag_a, done[dep_b] + lag_b)``, takes ``duration``
    and then writes its end time to ``done[out]``."""

    out: np.ndarray
    dep_a: np.ndarray
    lag_a: np.ndarray
    dep_b: np.ndarray
    lag_b: np.ndarray
    duration: np.ndarray
    mem_start: np.ndarray  # activation memory added at the start (F: M_B)
    mem_end: np.ndarray    # added at the end (B: -M_B)


def simulate(schedule: Schedule, costs: CostModel | StageCosts | None = None) -> Timeline:
    """Time every action of ``schedule`` under ``costs`` and return the Timeline.

    Raises ScheduleError for an invalid schedule (the message :func:`validate` gives) and
    :class:`Deadlock` when ranks wait for each other.

    >>> from pipebubble.schedules import get_schedule
    >>> simulate(get_schedule("1f1b", ranks=4, microbatches=8)).step_time  # (8+4-1)*(1+2)
    33.0
    """
    if costs is None:
        costs = CostModel()
    sc = costs if isinstance(costs, StageCosts) else costs.resolve(
        schedule.num_stages, schedule.chunks
    )
    if len(sc.f) != schedule.num_stages:
        raise ScheduleError(
            f"costs are for {len(sc.f)} stages but the schedule has {schedule.num_stages}"
        )
    flat = flat_actions(schedule)
    plan = compile_actions(schedule, flat, sc)
    starts = run(schedule, flat, plan)
    return _timeline(schedule, flat, plan, starts)


def compile_actions(schedule: Schedule, flat: FlatActions, sc: StageCosts) -> Compiled:
    """Every action's :class:`Compiled` fields, from per-(stage, kind) templates."""
    import numpy as np

    S, M = schedule.num_stages, schedule.num_microbatches
    where = schedule.stage_to_rank
    none = 3 * S * M  # slots none .. none + M - 1 stay 0.0: "no dependency"
    rows = S * 4  # template row of (stage, kind code)
    out, dep_a, dep_b = (np.full(rows, none, dtype=np.int64) for _ in range(3))
    lag_a, lag_b, duration, mem0, mem1 = (np.zeros(rows) for _ in range(5))
    for s in range(S):
        for code, kind in enumerate(KINDS):
            row = s * 4 + code
            action = Action(s, kind, 0)
            out[row] = _slot(produces(action), S, M)
            deps = needs(action, schedule)
            for j, sig in enumerate(deps):  # at most two: local first, then the neighbour
                lag = sc.comm if where[sig.stage] != where[s] else 0.0  # crosses ranks
                (dep_a if j == 0 else dep_b)[row] = _slot(sig, S, M)
                (lag_a if j == 0 else lag_b)[row] = lag
            duration[row] = sc.duration(s, kind)
            mem0[row], mem1[row] = sc.memory_deltas(s, kind)
    row = flat.stage * 4 + flat.kind
    mb = flat.microbatch
    plan = Compiled(out[row] + mb, dep_a[row] + mb, lag_a[row], dep_b[row] + mb, lag_b[row],
                    duration[row], mem0[row], mem1[row])
    if flat.pair.any():
        _compile_overlaps(plan, flat, sc.overlap)
    return plan


def _slot(sig, S: int, M: int) -> int:
    """The slot of signal ``sig`` for microbatch 0 (add the microbatch for the others)."""
    return (SLOT_BASE[sig.kind] * S + sig.stage) * M + sig.microbatch


def _compile_overlaps(plan: Compiled, flat: FlatActions, overlap: float) -> None:
    """Overlap pairs: the forward part (index i) also waits for the backward part's (i + 1)
    gradient from the next stage, and both durations scale by ``overlap``."""
    import numpy as np

    fwd = np.flatnonzero(flat.pair == 1)
    bwd = fwd + 1
    if (flat.kind[fwd] != F).any() or not np.isin(flat.kind[bwd], (I, B)).all():
        raise ScheduleError("an Overlap pairs a forward with a backward (F then B or I)")
    plan.dep_b[fwd] = plan.dep_b[bwd]
    plan.lag_b[fwd] = plan.lag_b[bwd]
    plan.duration[fwd] *= overlap
    plan.duration[bwd] *= overlap


class _Rank:
    """A rank's progress: its compiled actions still to run, the one it is blocked on
    (``pending``), its clock and the start times so far."""

    __slots__ = ("todo", "pending", "clock", "starts")

    def __init__(self, todo):
        self.todo = todo
        self.pending: tuple | None = None
        self.clock = 0.0
        self.starts: list[float] = []


def run(schedule: Schedule, flat: FlatActions, plan: Compiled) -> list[float]:
    """The clock: run ranks from a queue, each as far as its slots allow; wake the ranks
    waiting on a rank after it ran; raise Deadlock when the queue empties too early.
    Returns every action's start time (rank-major, like ``flat``)."""
    S, M = schedule.num_stages, schedule.num_microbatches
    p, SM, where = schedule.num_ranks, S * M, schedule.stage_to_rank
    inf = _INF
    done = [inf] * (3 * SM) + [0.0] * M
    columns = [c.tolist() for c in plan[:6]]
    ranks = []
    for r in range(p):
        lo, hi = flat.offsets[r], flat.offsets[r + 1]
        ranks.append(_Rank(zip(*(c[lo:hi] for c in columns), strict=True)))
    waiting: list[list[tuple[int, int]]] = [[] for _ in range(p)]  # on rank q: (rank, slot)
    queue = deque(range(p))
    remaining = len(flat.stage)
    while queue:
        r = queue.popleft()
        rank = ranks[r]
        t, put = rank.clock, rank.starts.append
        n0 = len(rank.starts)
        todo = rank.todo
        if rank.pending is not None:
            todo, rank.pending = chain((rank.pending,), todo), None
        for out, dep_a, lag_a, dep_b, lag_b, duration in todo:
            x = done[dep_a] + lag_a
            y = done[dep_b] + lag_b
            if y > x:
                x = y
            if x > t:
                if x == inf:  # a slot is empty: wait on the rank that fills it
                    rank.pending = (out, dep_a, lag_a, dep_b, lag_b, duration)
                    slot = dep_a if done[dep_a] == inf else dep_b
                    waiting[where[slot % SM // M]].append((r, slot))
                    break
                t = x
            put(t)
            t += duration
            done[out] = t
        ran = len(rank.starts) - n0
        rank.clock = t
        remaining -= ran
        if ran and waiting[r]:
            still = []
            for w, slot in waiting[r]:
                if done[slot] == inf:
                    still.append((w, slot))
                else:
                    queue.append(w)
            waiting[r] = still
    if remaining:
        raise _deadlock(schedule, flat, [len(rank.starts) for rank in ranks])
    return [t for rank in ranks for t in rank.starts]


def _deadlock(schedule: Schedule, flat: FlatActions, ran: list[int]) -> Deadlock:
    """Name each unfinished rank's stuck action and what it waits for."""
    stuck: dict[int, tuple[str, str]] = {}
    for r in range(schedule.num_ranks):
        i = flat.offsets[r] + ran[r]
        if i < flat.offsets[r + 1]:
            action = Action(int(flat.stage[i]), KINDS[flat.kind[i]], int(flat.microbatch[i]))
            stuck[r] = (str(action), describe_wait(action, schedule))
    return Deadlock(stuck)


def _timeline(schedule: Schedule, flat: FlatActions, plan: Compiled,
              starts: list[float]) -> Timeline:
    import numpy as np

    start = np.array(starts, dtype=np.float64)
    end = start + plan.duration  # the loop's own t += duration, vectorised
    p, offsets = schedule.num_ranks, flat.offsets
    rank: list[int] = []
    for r in range(p):
        rank += [r] * (offsets[r + 1] - offsets[r])
    kinds = np.array([str(k) for k in KINDS], dtype=object)
    return Timeline(
        schedule=schedule.name,
        num_ranks=p,
        num_stages=schedule.num_stages,
        num_microbatches=schedule.num_microbatches,
        stage_to_rank=tuple(schedule.stage_to_rank),
        chains=schedule.chains,
        rank=rank,
        stage=flat.stage.tolist(),
        kind=kinds[flat.kind].tolist(),
        microbatch=flat.microbatch.tolist(),
        start=_doubles(start),
        end=_doubles(end),
        mem_start=plan.mem_start.tolist(),
        mem_end=plan.mem_end.tolist(),
        overlapped=(flat.pair > 0).tolist(),
        source="simulated",
        offsets=list(offsets),
    )


def _doubles(values: np.ndarray) -> array:
    """C doubles that index as Python floats (numpy reads them back without a copy)."""
    out = array("d")
    out.frombytes(values.tobytes())
    return out
