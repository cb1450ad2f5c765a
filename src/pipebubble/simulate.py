"""simulate(schedule, costs) -> Timeline: the simulated clock.

Each rank runs its steps in order. An action starts when its rank is free and its data
dependencies are done:

- ``F(s, m)`` after ``F(s-1, m)`` (the activation from the previous stage);
- ``I(s, m)`` or ``B(s, m)`` after ``F(s, m)`` and after ``I``/``B(s+1, m)`` (the gradient
  from the next stage);
- ``W(s, m)`` after ``I(s, m)``;

plus ``costs.comm`` when producer and consumer stages live on different ranks. That is a
longest path through a DAG whose edges are the rank orders and the data dependencies, so
the order in which ranks are visited changes nothing; we sweep ranks round-robin, each as
far as it can go, and every action is timed exactly once (cost linear in the actions).

A sweep in which no rank can advance while actions remain is a deadlock: the error names
the action every rank is stuck at and what it waits for. The simulator never hangs.

An Overlap (DualPipe's F&B pair) runs as one block of ``overlap x (F + B)``, starting when
both parts may start; it is recorded as its two parts, back to back, scaled to the block.
"""

from __future__ import annotations

from .costs import CostModel, StageCosts
from .schedule import KINDS, Overlap, Schedule, ScheduleError, step_actions
from .timeline import Timeline


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
    tmpl = _templates(sc, where, S, M)
    mem = {(s, k): sc.memory_deltas(s, k) for s in range(S) for k in "FIWB"}

    # Compile each rank's order into (template, microbatch) pairs. A template holds the
    # slot of the action's own result, its two dependency slots (offset by microbatch),
    # their communication lags, and its duration. Columns for the Timeline come out of
    # the same pass.
    plans: list[list[tuple]] = []
    mbs: list[list[int]] = []
    col_stage: list[int] = []
    col_kind: list[str] = []
    col_mb: list[int] = []
    col_ov: list[bool] = []
    offsets = [0]
    for r, order in enumerate(schedule.orders):
        if Overlap in map(type, order):
            plan, mb = _compile_with_overlaps(order, tmpl, r, S, M)
            acts = [a for step in order for a in step_actions(step)]
            col_ov.extend(x for step in order for x in
                          ((True, True) if type(step) is Overlap else (False,)))
        else:
            try:
                plan = [tmpl[s, k] for s, k, _ in order]
            except KeyError:
                _raise_bad(order, r, S, M)
            mb = [m for _, _, m in order]
            acts = order
            col_ov.extend([False] * len(order))
        for a in acts:
            if not (0 <= a[0] < S and 0 <= a[2] < M) or where[a[0]] != r:
                _raise_bad(acts, r, S, M, where)
        plans.append(plan)
        mbs.append(mb)
        col_stage.extend([a[0] for a in acts])
        col_kind.extend([a[1] for a in acts])
        col_mb.extend([a[2] for a in acts])
        offsets.append(offsets[-1] + len(acts))
    col_rank = [r for r in range(p) for _ in range(offsets[r + 1] - offsets[r])]
    mems = [mem[s, k] for s, k in zip(col_stage, col_kind, strict=True)]

    done = [-1.0] * (3 * S * M)
    free = [0.0] * p
    ptr = [0] * p
    starts: list[list[float]] = [[] for _ in range(p)]
    ends: list[list[float]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in plans)
    overlap = sc.overlap
    while remaining:
        progressed = 0
        for r in range(p):
            plan, mb = plans[r], mbs[r]
            i = i0 = ptr[r]
            n = len(plan)
            t = free[r]
            st_r, en_r = starts[r], ends[r]
            while i < n:
                out, da, la, db, lb, d, ov = plan[i]
                m = mb[i]
                st = t
                if da >= 0:
                    x = done[da + m]
                    if x < 0:
                        break
                    x += la
                    if x > st:
                        st = x
                if db >= 0:
                    x = done[db + m]
                    if x < 0:
                        break
                    x += lb
                    if x > st:
                        st = x
                if ov is None:
                    t = st + d
                    st_r.append(st)
                    en_r.append(t)
                    done[out + m] = t
                else:  # an overlapped pair: absolute slots, m == 0
                    out2, da2, la2, db2, lb2, d2, _ = ov
                    if da2 >= 0:
                        x = done[da2]
                        if x < 0:
                            break
                        if x + la2 > st:
                            st = x + la2
                    if db2 >= 0:
                        x = done[db2]
                        if x < 0:
                            break
                        if x + lb2 > st:
                            st = x + lb2
                    mid = st + d * overlap
                    t = mid + d2 * overlap
                    st_r.append(st)
                    en_r.append(mid)
                    st_r.append(mid)
                    en_r.append(t)
                    done[out] = mid
                    done[out2] = t
                i += 1
            if i != i0:
                progressed += i - i0
                ptr[r] = i
                free[r] = t
        if not progressed:
            raise _deadlock(schedule, ptr)
        remaining -= progressed

    return Timeline(
        schedule=schedule.name,
        num_ranks=p,
        num_stages=S,
        num_microbatches=M,
        stage_to_rank=tuple(where),
        rank=col_rank,
        stage=col_stage,
        kind=col_kind,
        microbatch=col_mb,
        start=[x for lst in starts for x in lst],
        end=[x for lst in ends for x in lst],
        mem_start=[a for a, _ in mems],
        mem_end=[b for _, b in mems],
        overlapped=col_ov,
        source="simulated",
        offsets=offsets,
    )


def _templates(sc: StageCosts, where: tuple[int, ...], S: int, M: int) -> dict:
    """(stage, kind) -> (own slot, dep slot, lag, dep slot, lag, duration, None); slots are
    offset by the microbatch at run time. Slot ``s*M + m`` is F(s, m) done; ``S*M + s*M + m``
    is I/B(s, m) done (the input gradient is ready); ``2*S*M + s*M + m`` is W(s, m) done."""
    SM, comm = S * M, sc.comm
    out: dict = {}
    for s in range(S):
        r = where[s]
        up = comm if s > 0 and where[s - 1] != r else 0.0
        down = comm if s < S - 1 and where[s + 1] != r else 0.0
        out[s, "F"] = (s * M, (s - 1) * M if s > 0 else -1, up, -1, 0.0,
                       sc.duration(s, "F"), None)
        for k in ("B", "I"):
            out[s, k] = (SM + s * M, s * M, 0.0, SM + (s + 1) * M if s < S - 1 else -1, down,
                         sc.duration(s, k), None)
        out[s, "W"] = (2 * SM + s * M, SM + s * M, 0.0, -1, 0.0, sc.duration(s, "W"), None)
    return out


def _compile_with_overlaps(order, tmpl, r, S, M):
    plan, mb = [], []
    for step in order:
        if type(step) is Overlap:
            parts = []
            for a in (step.forward, step.backward):
                if (a[0], a[1]) not in tmpl or not 0 <= a[2] < M:
                    _raise_bad([a], r, S, M)
                out, da, la, db, lb, d, _ = tmpl[a[0], a[1]]
                m = a[2]
                parts.append((out + m if out >= 0 else out, da + m if da >= 0 else -1, la,
                              db + m if db >= 0 else -1, lb, d, None))
            plan.append(parts[0][:6] + (parts[1],))
            mb.append(0)
        else:
            if (step[0], step[1]) not in tmpl:
                _raise_bad([step], r, S, M)
            plan.append(tmpl[step[0], step[1]])
            mb.append(step[2])
    return plan, mb


def _raise_bad(acts, r, S, M, where=None):
    for a in acts:
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
    stuck: dict[int, tuple[str, str]] = {}
    S = schedule.num_stages
    for r, order in enumerate(schedule.orders):
        if ptr[r] >= len(order):
            continue
        step = order[ptr[r]]
        a = step.forward if isinstance(step, Overlap) else step
        s, k, m = a
        if k == "F":
            waits = f"{s - 1}F{m}" if s > 0 else "nothing"
        elif k in ("B", "I"):
            waits = f"{s}F{m}" + (f" and {s + 1}I/B{m}" if s < S - 1 else "")
        else:
            waits = f"{s}I{m}"
        stuck[r] = (str(step), waits)
    return Deadlock(stuck)
