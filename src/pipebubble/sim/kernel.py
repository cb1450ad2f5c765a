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
   filled: ``start = max(clock, done[dep + m] + lag)``, one dependency per action (the one
   on the neighbouring stage: the same-stage one is met by the rank's own order).
   "Not ready yet" is one comparison with ``inf``.
3. **Wake ranks, do not poll them.** A rank that finds a slot empty waits on the rank that
   fills it and goes back in the queue when that rank has run. No blocked rank is visited
   in vain, so the cost is linear in actions *and* in ranks (p = 16000 with one microbatch
   costs 4x p = 4000, not 16x). The order in which ranks run changes nothing: the result is
   the longest path through the DAG of rank orders and dependencies.

When the queue is empty and actions remain, nothing can advance: a deadlock. The error
names the action each unfinished rank is stuck at and what it waits for
(:func:`~pipebubble.ir.deps.describe_wait`). The simulator never hangs.

An Overlap (DualPipe's F&B pair) runs as one block of ``overlap x (F + B)``: a wait of no
duration for its backward part's gradient goes first, so the block starts when both parts
may start, and the parts are recorded back to back, each scaled by ``overlap``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
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
    """How one (stage, kind) runs, for microbatch 0 (add the microbatch to the slots for the
    others): the action may start at ``max(clock, done[dep] + lag)``, takes ``duration`` and
    then writes its end time to ``done[out]``. ``lag`` is ``costs.comm`` when the dependency
    crosses ranks, else 0; ``rank`` runs the action that fills ``dep`` (-1: none).

    One dependency is enough: of what ``ir/deps.py`` lists, the one on the *same* stage (B or
    I after its F, W after its I) is always met by the rank's own order, which validation
    guarantees; what remains is the neighbouring stage's signal, if any."""

    out: int
    dep: int
    lag: float
    duration: float
    rank: int


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
    microbatches = flat.microbatch.tolist()
    if flat.pair.any():
        steps = _with_overlap_waits(schedule, flat, plan, microbatches, sc.overlap)
    else:
        steps = Steps(plan, microbatches, flat.offsets, None)
    starts = run(schedule, flat, steps)
    return _timeline(schedule, flat, sc, steps, starts)


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
            dep, lag, rank = none, 0.0, -1
            for sig in needs(action, schedule):
                if sig.stage != s:  # the neighbour's signal (same-stage ones: see Template)
                    dep, rank = _slot(sig, S, M), where[sig.stage]
                    lag = sc.comm if rank != where[s] else 0.0
            templates[4 * s + KINDS.index(kind)] = Template(
                _slot(produces(action), S, M), dep, lag, sc.duration(s, kind), rank)
    return templates


def _slot(sig, S: int, M: int) -> int:
    """The slot of signal ``sig`` for microbatch 0 (add the microbatch for the others)."""
    return (SLOT_BASE[sig.kind] * S + sig.stage) * M + sig.microbatch


class Steps(NamedTuple):
    """What the clock runs: ``plan[i]`` with microbatch ``microbatches[i]``; rank r's steps
    are ``offsets[r]:offsets[r + 1]``. ``actions`` lists the indices that are actions (None:
    all are); the others are the waits :func:`_with_overlap_waits` adds."""

    plan: list[Template]
    microbatches: list[int]
    offsets: list[int]
    actions: list[int] | None


def _with_overlap_waits(schedule: Schedule, flat: FlatActions, plan: list[Template],
                        microbatches: list[int], overlap: float) -> Steps:
    """An Overlap pair is one block: it starts when both parts may start. Before each pair
    goes a *wait*, a step of no duration whose dependency is the backward part's (the
    gradient from the next stage), writing to a scratch slot nobody reads; the forward
    part then waits for its own. Both parts' durations scale by ``overlap``."""
    S, M = schedule.num_stages, schedule.num_microbatches
    scratch = 3 * S * M + M  # slots past "no dependency": written, never read
    steps: list[Template] = []
    mbs: list[int] = []
    actions: list[int] = []
    offsets = [0]
    pair, kind = flat.pair.tolist(), flat.kind.tolist()
    made: dict[tuple[Template, Template], tuple[Template, Template, Template]] = {}
    for r in range(schedule.num_ranks):
        i, end = flat.offsets[r], flat.offsets[r + 1]
        while i < end:
            if pair[i] == 1:
                if kind[i] != F or kind[i + 1] not in (I, B):
                    raise ScheduleError("an Overlap pairs a forward with a backward "
                                        "(F then B or I)")
                fwd, bwd = plan[i], plan[i + 1]
                if (fwd, bwd) not in made:  # one set of templates per (stage, kind) pair
                    made[fwd, bwd] = (
                        Template(scratch, bwd.dep, bwd.lag, 0.0, bwd.rank),
                        fwd._replace(duration=fwd.duration * overlap),
                        bwd._replace(duration=bwd.duration * overlap))
                steps += made[fwd, bwd]
                mbs += (microbatches[i + 1], microbatches[i], microbatches[i + 1])
                actions += (len(steps) - 2, len(steps) - 1)
                i += 2
            else:
                actions.append(len(steps))
                steps.append(plan[i])
                mbs.append(microbatches[i])
                i += 1
        offsets.append(len(steps))
    return Steps(steps, mbs, offsets, actions)


def run(schedule: Schedule, flat: FlatActions, steps: Steps) -> array:
    """The clock: run ranks from a queue, each as far as its slots allow; wake the ranks
    waiting on a rank after it ran; raise Deadlock when the queue empties too early.
    Returns the start time of every step."""
    plan, microbatches, offsets = steps.plan, steps.microbatches, steps.offsets
    p, M = schedule.num_ranks, schedule.num_microbatches
    SM = schedule.num_stages * M
    inf = _INF
    # C doubles, not float objects: the float each action computes is freed at once and
    # reused, which keeps memory traffic low; numpy reads them without a copy.
    done = array("d", [inf]) * (3 * SM) + array("d", bytes(8 * 2 * M))
    starts = array("d", bytes(8 * len(plan)))
    nxt = offsets[:-1]  # rank r's next step, an index into plan
    last = offsets[1:]  # one past rank r's last step
    clock = [0.0] * p
    waiting: list[list[int]] = [[] for _ in range(p)]  # waiting[q]: ranks waiting on rank q
    queue = deque(range(p))
    while queue:
        r = queue.popleft()
        i0, t = nxt[r], clock[r]
        for i in range(i0, last[r]):
            out, dep, lag, duration, rank = plan[i]
            m = microbatches[i]
            x = done[dep + m] + lag
            if x > t:
                if x == inf:  # its slot is empty: wait on the rank that fills it
                    waiting[rank].append(r)
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
        raise _deadlock(schedule, flat, steps, nxt)
    return starts


def _deadlock(schedule: Schedule, flat: FlatActions, steps: Steps,
              nxt: list[int]) -> Deadlock:
    """Name each unfinished rank's stuck action (a wait: the pair's forward part that
    follows it) and what it waits for."""
    stuck: dict[int, tuple[str, str]] = {}
    for r in range(schedule.num_ranks):
        i = nxt[r]
        if i < steps.offsets[r + 1]:
            if steps.actions is not None:  # the step's index among the actions
                i = bisect_left(steps.actions, i)
            action = Action(int(flat.stage[i]), KINDS[flat.kind[i]], int(flat.microbatch[i]))
            stuck[r] = (str(action), describe_wait(action, schedule))
    return Deadlock(stuck)


def _timeline(schedule: Schedule, flat: FlatActions, sc: StageCosts, steps: Steps,
              starts: array) -> Timeline:
    """Columns of the Timeline: numpy gathers and C arrays (no Python object per action
    except the kind letters, which are shared)."""
    import numpy as np

    row = flat.stage * 4 + flat.kind
    start = np.frombuffer(starts, dtype=np.float64)
    if steps.actions is None:
        duration = np.array([sc.duration(s, k) for s in range(schedule.num_stages)
                             for k in KINDS])[row]
    else:  # Overlap parts are scaled; the waits are no actions
        start = start[steps.actions]
        starts = _doubles(start)
        duration = np.array([steps.plan[i].duration for i in steps.actions])
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
