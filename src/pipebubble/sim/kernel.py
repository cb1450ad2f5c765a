"""simulate(schedule, costs) -> Timeline: the fast kernel.

It computes exactly what ``sim/reference.py`` computes (read that first: the simulator as
DESIGN.md states it, in a page of plain Python), on a million actions in about a second of
CPython. A hypothesis test keeps the two equal on random schedules, Overlap pairs and
several chains included.

How it stays fast:

1. **Compile once per (stage, kind), validate on the way.** ``ir/check.py`` lays every
   action out in flat arrays and checks :func:`~pipebubble.ir.schedule.validate`'s rules on
   them at once (one pass; a failure gets validate's own message). Each signal of
   ``ir/deps.py`` (F(s, m) done, the input gradient of (s, m) ready, W(s, m) done) owns a
   *slot* in one array ``done`` of end times, ``inf`` until the signal exists. The rule
   (:func:`~pipebubble.ir.deps.needs`, :func:`~pipebubble.ir.deps.produces`) is applied once
   per (stage, kind) to build a :class:`Template` with named fields; an action is its
   template plus its microbatch. A missing dependency points at a slot that is always 0.
2. **A tight loop per rank.** A rank runs its actions in order while their slots are
   filled: ``start = max(clock, done[dep_a + m] + lag_a, done[dep_b + m] + lag_b)``.
   "Not ready yet" is one comparison with ``inf``.
3. **Wake ranks, do not poll them.** A rank that finds a slot empty waits on the rank that
   fills it and goes back in the queue when that rank has run. No blocked rank is visited
   in vain, so the cost is linear in actions *and* in ranks (p = 16000 with one microbatch
   costs 4x p = 4000, not 16x). The order in which ranks run changes nothing: the result is
   the longest path through the DAG of rank orders and dependencies.

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
from collections.abc import Sequence
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


class Template(NamedTuple):
    """How one (stage, kind) runs, for microbatch 0 (add the microbatch to every slot for
    the others). The action may start at ``max(clock, done[dep_a] + lag_a, done[dep_b] +
    lag_b)``, takes ``duration`` and then writes its end time to ``done[out]``. ``lag`` is
    ``costs.comm`` when the dependency crosses ranks, else 0. ``rank_a`` and ``rank_b`` run
    the actions that fill ``dep_a`` and ``dep_b`` (-1: no dependency)."""

    out: int
    dep_a: int
    lag_a: float
    dep_b: int
    lag_b: float
    duration: float
    rank_a: int
    rank_b: int


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
    kinds = [KINDS[c] for c in range(4) if (flat.kind == c).any()]
    templates = compile_templates(schedule, sc, kinds)
    plan = [templates[row] for row in (flat.stage * 4 + flat.kind).tolist()]
    if flat.pair.any():
        _compile_overlaps(plan, flat, sc.overlap)
    microbatches = flat.microbatch.tolist()
    starts = run(schedule, flat, plan, microbatches)
    return _timeline(schedule, flat, sc, plan, starts)


def compile_templates(schedule: Schedule, sc: StageCosts,
                      kinds: Sequence[str] = KINDS) -> list[Template | None]:
    """One :class:`Template` per (stage, kind), at index ``stage x 4 + kind code``, from the
    dependency rule of ``ir/deps.py`` (None for the kinds not asked for)."""
    S, M = schedule.num_stages, schedule.num_microbatches
    where = schedule.stage_to_rank
    none = 3 * S * M  # slots none .. none + M - 1 stay 0.0: "no dependency"
    templates: list[Template | None] = [None] * (4 * S)
    for s in range(S):
        for kind in kinds:
            action = Action(s, kind, 0)
            deps = [(_slot(sig, S, M), sc.comm if where[sig.stage] != where[s] else 0.0,
                     where[sig.stage]) for sig in needs(action, schedule)]  # local first
            (dep_a, lag_a, rank_a), (dep_b, lag_b, rank_b) = (deps + [(none, 0.0, -1)] * 2)[:2]
            templates[4 * s + KINDS.index(kind)] = Template(
                _slot(produces(action), S, M), dep_a, lag_a, dep_b, lag_b, sc.duration(s, kind),
                rank_a, rank_b)
    return templates


def _slot(sig, S: int, M: int) -> int:
    """The slot of signal ``sig`` for microbatch 0 (add the microbatch for the others)."""
    return (SLOT_BASE[sig.kind] * S + sig.stage) * M + sig.microbatch


def _compile_overlaps(plan: list[Template], flat: FlatActions, overlap: float) -> None:
    """Overlap pairs: the forward part (index i) also waits for the backward part's (i + 1)
    gradient from the next stage (its slot re-based to the forward's microbatch), and both
    durations scale by ``overlap``."""
    mb = flat.microbatch
    for i in flat.pair.nonzero()[0][::2].tolist():
        if flat.kind[i] != F or flat.kind[i + 1] not in (I, B):
            raise ScheduleError("an Overlap pairs a forward with a backward (F then B or I)")
        fwd, bwd = plan[i], plan[i + 1]
        shift = int(mb[i + 1] - mb[i])
        plan[i] = fwd._replace(dep_b=bwd.dep_b + shift, lag_b=bwd.lag_b, rank_b=bwd.rank_b,
                               duration=fwd.duration * overlap)
        plan[i + 1] = bwd._replace(duration=bwd.duration * overlap)


def run(schedule: Schedule, flat: FlatActions, plan: list[Template],
        microbatches: list[int]) -> array:
    """The clock: run ranks from a queue, each as far as its slots allow; wake the ranks
    waiting on a rank after it ran; raise Deadlock when the queue empties too early.
    Rank r's actions are ``plan[offsets[r]:offsets[r + 1]]`` (``flat.offsets``); returns
    every action's start time."""
    p, M = schedule.num_ranks, schedule.num_microbatches
    SM = schedule.num_stages * M
    inf = _INF
    # C doubles, not float objects: the float each action computes is freed at once and
    # reused, which keeps memory traffic low; numpy reads them without a copy.
    done = array("d", [inf]) * (3 * SM) + array("d", bytes(8 * M))
    starts = array("d", bytes(8 * len(plan)))
    nxt = flat.offsets[:-1]  # rank r's next action, an index into plan
    last = flat.offsets[1:]  # one past rank r's last action
    clock = [0.0] * p
    waiting: list[list[int]] = [[] for _ in range(p)]  # waiting[q]: ranks waiting on rank q
    queue = deque(range(p))
    while queue:
        r = queue.popleft()
        i0, t = nxt[r], clock[r]
        for i in range(i0, last[r]):
            out, dep_a, lag_a, dep_b, lag_b, duration, rank_a, rank_b = plan[i]
            m = microbatches[i]
            x = done[dep_a + m] + lag_a
            y = done[dep_b + m] + lag_b
            if y > x:
                x = y
            if x > t:
                if x == inf:  # a slot is empty: wait on the rank that fills it
                    waiting[rank_a if done[dep_a + m] == inf else rank_b].append(r)
                    break
                t = x
            starts[i] = t
            t += duration
            done[out + m] = t
        else:
            i = last[r]
        nxt[r] = i
        clock[r] = t
        woken = waiting[r]
        if woken and i > i0:  # r ran: its waiters try again (or wait again)
            queue.extend(woken)
            woken.clear()
    if nxt != last:
        raise _deadlock(schedule, flat, nxt)
    return starts


def _deadlock(schedule: Schedule, flat: FlatActions, nxt: list[int]) -> Deadlock:
    """Name each unfinished rank's stuck action and what it waits for."""
    stuck: dict[int, tuple[str, str]] = {}
    for r in range(schedule.num_ranks):
        i = nxt[r]
        if i < flat.offsets[r + 1]:
            action = Action(int(flat.stage[i]), KINDS[flat.kind[i]], int(flat.microbatch[i]))
            stuck[r] = (str(action), describe_wait(action, schedule))
    return Deadlock(stuck)


def _timeline(schedule: Schedule, flat: FlatActions, sc: StageCosts, plan: list[Template],
              starts: array) -> Timeline:
    """Columns of the Timeline: numpy gathers and C arrays (no Python object per action
    except the kind letters, which are shared)."""
    import numpy as np

    row = flat.stage * 4 + flat.kind
    start = np.frombuffer(starts, dtype=np.float64)
    duration = np.array([t.duration for t in plan]) if flat.pair.any() else \
        np.array([sc.duration(s, k) for s in range(schedule.num_stages) for k in KINDS])[row]
    end = start + duration  # the loop's own t += duration, vectorised
    mem = np.array([sc.memory_deltas(s, k) for s in range(schedule.num_stages)
                    for k in KINDS]).reshape(-1, 2)[row]
    p, offsets = schedule.num_ranks, flat.offsets
    kinds = np.array([str(k) for k in KINDS], dtype=object)
    return Timeline(
        schedule=schedule.name,
        num_ranks=p,
        num_stages=schedule.num_stages,
        num_microbatches=schedule.num_microbatches,
        stage_to_rank=tuple(schedule.stage_to_rank),
        chains=schedule.chains,
        chain_starts=schedule.chain_starts,
        rank=_ints(np.repeat(np.arange(p), np.diff(offsets))),
        stage=_ints(flat.stage),
        kind=kinds[flat.kind].tolist(),
        microbatch=_ints(flat.microbatch),
        start=starts,
        end=_doubles(end),
        mem_start=_doubles(mem[:, 0]),
        mem_end=_doubles(mem[:, 1]),
        overlapped=(flat.pair > 0).tolist(),
        source="simulated",
        offsets=list(offsets),
    )


def _doubles(values: np.ndarray) -> array:
    """C doubles that index as Python floats (numpy reads them back without a copy)."""
    out = array("d")
    out.frombytes(values.tobytes())  # float64
    return out


def _ints(values: np.ndarray) -> array:
    """C 64-bit integers that index as Python ints."""
    out = array("q")
    out.frombytes(values.tobytes())  # int64
    return out
