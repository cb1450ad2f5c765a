"""simulate(schedule, costs) -> Timeline: the simulated clock.

Each rank runs its steps in order. An action starts when its rank is free and its data
dependencies are done:

- ``F(s, m)`` after ``F(s-1, m)`` (the activation from the previous stage);
- ``I(s, m)`` or ``B(s, m)`` after ``F(s, m)`` and after ``I``/``B(s+1, m)`` (the gradient
  from the next stage);
- ``W(s, m)`` after ``I(s, m)``;

(the first stage of a chain takes its input and the last one its loss: no dependency there;
DualPipe's two model copies are two chains, see ``Schedule.chain_starts``)

plus ``costs.comm`` when producer and consumer stages live on different ranks. That is a
longest path through a DAG whose edges are the rank orders and the data dependencies, so
the order in which ranks are visited changes nothing; we sweep ranks round-robin, each as
far as it can go, and every action is timed exactly once (cost linear in the actions).

How it stays fast (a million actions in about a second of CPython): every action is compiled
to a shared per-(stage, kind) template plus its microbatch. ``done[slot]`` holds the end
time of what a slot stands for (F(s, m) done; the input gradient of (s, m) ready; W done),
``inf`` until then, so "not ready yet" is one comparison; a missing dependency points at a
block of slots that are always 0.

A sweep in which no rank can advance while actions remain is a deadlock: the error names
the action every rank is stuck at and what it waits for. The simulator never hangs.

An Overlap (DualPipe's F&B pair) runs as one block of ``overlap x (F + B)``, starting when
both parts may start; it is recorded as its two parts, back to back, each scaled by
``overlap``. (Its forward part carries the backward part's gradient dependency, so the
block never starts before both are ready.)
"""

from __future__ import annotations

from array import array
from operator import itemgetter

from ..costs import CostModel, StageCosts
from ..ir.schedule import KINDS, Overlap, Schedule, ScheduleError
from ..timeline import Timeline


class Deadlock(ScheduleError):
    """No rank can advance. ``stuck`` maps rank -> (stuck action, what it waits for)."""

    def __init__(self, stuck: dict[int, tuple[str, str]]):
        self.stuck = stuck
        detail = "; ".join(f"rank {r} stuck at {a} waiting for {w}" for r, (a, w) in stuck.items())
        super().__init__(f"deadlock: {detail}")


def simulate(schedule: Schedule, costs: CostModel | StageCosts | None = None) -> Timeline:
    """Time every action of ``schedule`` under ``costs`` and return the Timeline.

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
    p, S, M = schedule.num_ranks, schedule.num_stages, schedule.num_microbatches
    where = schedule.stage_to_rank
    templates = _templates(sc, where, S, M, schedule.chain_starts)

    plans: list[list[tuple]] = []
    mbs: list[list[int]] = []
    col_ov: list[bool] = []
    for r, order in enumerate(schedule.orders):
        mine = templates[r]
        if Overlap in map(type, order):
            plan, mb, ov = _compile_with_overlaps(order, mine, sc.overlap, r, S, M)
            col_ov.extend(ov)
        else:
            try:
                plan = [mine[s, k] for s, k, _ in order]
            except (KeyError, ValueError, TypeError):
                _raise_bad(order, r, S, M, where)
            mb = [m for _, _, m in order]
            if mb and (min(mb) < 0 or max(mb) >= M):
                _raise_bad(order, r, S, M, where)
            col_ov.extend([False] * len(order))
        plans.append(plan)
        mbs.append(mb)

    starts, ends = _run(plans, mbs, p, S, M, schedule)

    col_rank: list[int] = []
    col_stage: list[int] = []
    col_kind: list[str] = []
    col_mb: list[int] = []
    col_m0: list[float] = []
    col_m1: list[float] = []
    offsets = [0]
    for r in range(p):
        plan = plans[r]
        col_rank.extend([r] * len(plan))
        col_stage.extend(map(_STAGE, plan))
        col_kind.extend(map(_KIND, plan))
        col_m0.extend(map(_MEM0, plan))
        col_m1.extend(map(_MEM1, plan))
        col_mb.extend(mbs[r])
        offsets.append(offsets[-1] + len(plan))
    return Timeline(
        schedule=schedule.name,
        num_ranks=p,
        num_stages=S,
        num_microbatches=M,
        stage_to_rank=tuple(where),
        chains=schedule.chains,
        rank=col_rank,
        stage=col_stage,
        kind=col_kind,
        microbatch=col_mb,
        start=_concat(starts),
        end=_concat(ends),
        mem_start=col_m0,
        mem_end=col_m1,
        overlapped=col_ov,
        source="simulated",
        offsets=offsets,
    )


_INF = float("inf")


def _concat(parts: list[array]) -> array:
    out = array("d")
    for part in parts:
        out.extend(part)
    return out

_STAGE, _KIND, _MEM0, _MEM1 = (itemgetter(i) for i in range(6, 10))


def _run(plans: list[list[tuple]], mbs: list[list[int]], p: int, S: int, M: int,
         schedule: Schedule) -> tuple[list[array], list[array]]:
    """The clock: sweep ranks, each as far as its dependencies allow; raise on deadlock."""
    inf = _INF
    done = [inf] * (3 * S * M) + [0.0] * M  # the last M slots: "no dependency", ready at 0
    # C doubles, not float objects: cheap to store, and numpy reads them without a copy.
    starts = [array("d", bytes(8 * len(plan))) for plan in plans]
    ends = [array("d", bytes(8 * len(plan))) for plan in plans]
    remaining = sum(len(plan) for plan in plans)
    # One list per rank: plan, microbatches, starts, ends, length, next index, clock.
    # The last field is the slot the rank last blocked on: while it is not done, the rank
    # is skipped without decoding its next action.
    ready = len(done) - 1
    ranks = [[plans[r], mbs[r], starts[r], ends[r], len(plans[r]), 0, 0.0, ready]
             for r in range(p)]
    while remaining:
        progressed = 0
        for state in ranks:
            if done[state[7]] == inf:
                continue
            plan, mb, st_r, en_r, n, i0, t, _ = state
            i = i0
            while i < n:
                out, da, la, db, lb, d, _, _, _, _ = plan[i]
                m = mb[i]
                x = done[da + m] + la
                y = done[db + m] + lb
                if y > x:
                    x = y
                if x > t:
                    if x == inf:
                        state[7] = da + m if done[da + m] == inf else db + m
                        break
                    t = x
                st_r[i] = t
                t += d
                en_r[i] = t
                done[out + m] = t
                i += 1
            if i != i0:
                progressed += i - i0
                state[5] = i
                state[6] = t
        if not progressed:
            raise _deadlock(schedule, [state[5] for state in ranks])
        remaining -= progressed
    return starts, ends


def _templates(sc: StageCosts, where: tuple[int, ...], S: int, M: int,
               starts: tuple[int, ...] = (0,)) -> list[dict]:
    """Per rank: (stage, kind) -> (own slot, dep slot, lag, dep slot, lag, duration, stage,
    kind, memory added at start, memory added at end). Slots are bases, offset by the
    microbatch at run time: ``s*M`` is F(s) done, ``S*M + s*M`` the input gradient of s
    ready (I or B done), ``2*S*M + s*M`` W done, ``3*S*M`` "no dependency"."""
    SM, comm = S * M, sc.comm
    none = 3 * SM
    out: list[dict] = [{} for _ in range(max(where, default=-1) + 1)]
    for s in range(S):
        r = where[s]
        first, last = s in starts, s == S - 1 or (s + 1) in starts
        up = comm if not first and where[s - 1] != r else 0.0
        down = comm if not last and where[s + 1] != r else 0.0
        mem = {k: sc.memory_deltas(s, k) for k in KINDS}
        t = out[r]
        t[s, "F"] = (s * M, none if first else (s - 1) * M, up, none, 0.0,
                     sc.duration(s, "F"), s, "F", *mem["F"])
        for k in ("B", "I"):
            t[s, k] = (SM + s * M, s * M, 0.0, none if last else SM + (s + 1) * M, down,
                       sc.duration(s, k), s, k, *mem[k])
        t[s, "W"] = (2 * SM + s * M, SM + s * M, 0.0, none, 0.0, sc.duration(s, "W"), s, "W",
                     *mem["W"])
    return out


def _compile_with_overlaps(order, mine, overlap, r, S, M):
    """Compile a rank's order holding Overlap steps: each pair becomes its two parts with
    durations scaled by ``overlap``; the forward part also waits for the backward part's
    input gradient (its slot re-based to the forward's microbatch), so the block starts
    only when both parts may start."""
    plan, mb, ov = [], [], []
    for step in order:
        if type(step) is Overlap:
            fa, ba = step
            for a in (fa, ba):
                if (a[0], a[1]) not in mine or not 0 <= a[2] < M:
                    _raise_bad([a], r, S, M)
            tf, tb = mine[fa[0], fa[1]], mine[ba[0], ba[1]]
            shift = ba[2] - fa[2]
            plan.append((tf[0], tf[1], tf[2], tb[3] + shift, tb[4], tf[5] * overlap) + tf[6:])
            plan.append(tb[:5] + (tb[5] * overlap,) + tb[6:])
            mb.extend((fa[2], ba[2]))
            ov.extend((True, True))
        else:
            if (step[0], step[1]) not in mine or not 0 <= step[2] < M:
                _raise_bad([step], r, S, M)
            plan.append(mine[step[0], step[1]])
            mb.append(step[2])
            ov.append(False)
    return plan, mb, ov


def _raise_bad(acts, r, S, M, where=None):
    for a in acts:
        if isinstance(a, Overlap):
            _raise_bad(list(a), r, S, M, where)
            continue
        if a[1] not in KINDS:
            raise ScheduleError(
                f"rank {r}, action {a}: unknown kind {a[1]!r}; valid are F, I, W, B"
            )
        if not 0 <= a[0] < S:
            raise ScheduleError(f"rank {r}, action {a}: stage out of range 0..{S - 1}")
        if not 0 <= a[2] < M:
            raise ScheduleError(f"rank {r}, action {a}: microbatch out of range 0..{M - 1}")
        if where is not None and where[a[0]] != r:
            raise ScheduleError(f"rank {r}, action {a}: stage {a[0]} lives on rank {where[a[0]]}")
    raise ScheduleError(f"rank {r}: invalid action")


def _deadlock(schedule: Schedule, ptr: list[int]) -> Deadlock:
    """Name each unfinished rank's stuck action (ptr counts actions, overlaps count two)."""
    stuck: dict[int, tuple[str, str]] = {}
    for r in range(schedule.num_ranks):
        acts = list(schedule.actions(r))
        if ptr[r] >= len(acts):
            continue
        s, k, m = acts[ptr[r]]
        if k == "F":
            waits = "nothing" if schedule.first_stage(s) else f"{s - 1}F{m}"
        elif k in ("B", "I"):
            waits = f"{s}F{m}" + ("" if schedule.last_stage(s) else f" and {s + 1}I/B{m}")
        else:
            waits = f"{s}I{m}"
        stuck[r] = (str(acts[ptr[r]]), waits)
    return Deadlock(stuck)
