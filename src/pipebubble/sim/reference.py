"""The simulator as DESIGN.md defines it, in plain Python: read this one first.

``simulate_reference(schedule, costs)`` computes the same Timeline as the fast kernel
(``sim/kernel.py``, which a test keeps equal to this on random schedules), one step at a time:

1. Each rank runs its steps in order; ``free[r]`` is when rank ``r`` finishes its last one.
2. A step may start once every signal it needs exists (``ir/deps.py``: the forward of the
   previous stage, the gradient of the next one, ...). It starts at the latest of: its rank
   being free, and each needed signal's time, plus ``costs.comm`` when the signal comes from
   another rank (``Dep.crosses``).
3. An action takes ``costs.duration(stage, kind)`` and, when it ends, produces its signal.
4. An Overlap (DualPipe's F&B pair) is one block: it waits for what both parts need and
   takes ``overlap x max(C, A)`` (``StageCosts.pair_duration``: ``A`` the two halves'
   all-to-all, ``C`` the rest of their time; without all-to-all ``overlap x (F + B)``),
   recorded as its two parts back to back (``StageCosts.pair_parts``), each with the
   all-to-all it hides and exposes. Both its outputs (the forward's activation, the
   backward's gradient) are ready when the block ends: real DualPipe runs the two parts at
   once on overlapped streams. A lone action exposes its all-to-all.
5. Memory (DESIGN.md, "Memory model"): each action adds ``memory_deltas(stage, kind)``, the
   first at its start (F: + M_B) and the second at its end (B: - M_B; I: - (M_B - M_W);
   W: - M_W). The Timeline sums them over time per rank.

We sweep the ranks again and again, each as far as it can go. A sweep where no rank moves
while steps remain is a deadlock, reported with what each stuck rank waits for.

>>> from pipebubble.schedules import get_schedule
>>> simulate_reference(get_schedule("1f1b", ranks=4, microbatches=8)).step_time
33.0
"""

from __future__ import annotations

from ..costs import CostModel, StageCosts
from ..ir.deps import describe_wait, producers, produces
from ..ir.schedule import Overlap, Schedule, ScheduleError, step_actions, validate
from ..timeline import Event, Timeline
from .kernel import Deadlock


def simulate_reference(schedule: Schedule,
                       costs: CostModel | StageCosts | None = None) -> Timeline:
    """Time every action of ``schedule`` under ``costs``, the readable way."""
    validate(schedule)
    costs = costs or CostModel()
    sc = costs if isinstance(costs, StageCosts) else costs.resolve(schedule.num_stages,
                                                                   schedule.chunks)
    if len(sc.f) != schedule.num_stages:
        raise ScheduleError(
            f"costs are for {len(sc.f)} stages but the schedule has {schedule.num_stages}"
        )
    orders = [list(order) for order in schedule.orders]
    ready: dict = {}                     # signal -> when it was produced
    free = [0.0] * schedule.num_ranks    # when each rank is free
    nxt = [0] * schedule.num_ranks       # index of each rank's next step
    events: list[Event] = []
    while any(nxt[r] < len(orders[r]) for r in range(schedule.num_ranks)):
        moved = False
        for r, order in enumerate(orders):
            while nxt[r] < len(order):
                step = order[nxt[r]]
                deps = producers(step, schedule)
                if any(dep.signal not in ready for dep in deps):
                    break  # this rank waits; try the next one
                start = max([free[r]] + [ready[dep.signal] + (sc.comm if dep.crosses else 0.0)
                                         for dep in deps])
                pair = isinstance(step, Overlap)
                parts = (sc.pair_parts(step.forward.stage, step.backward.stage,
                                       step.backward.kind) if pair
                         else (sc.lone_part(step.stage, step.kind),))
                for action, part in zip(step_actions(step), parts, strict=True):
                    s, k, m = action  # an Overlap's parts run back to back
                    end = start + part.duration
                    grow, shrink = sc.memory_deltas(s, k)
                    events.append(Event(r, s, str(k), m, start, end, grow, shrink, pair,
                                        part.hidden, part.exposed))
                    start = end
                for action in step_actions(step):  # all of a step's outputs: at its end
                    ready[produces(action)] = start
                free[r] = start
                nxt[r] += 1
                moved = True
        if not moved:
            stuck = {}
            for r, order in enumerate(orders):
                if nxt[r] < len(order):
                    first = step_actions(order[nxt[r]])[0]
                    stuck[r] = (str(first), describe_wait(first, schedule))
            raise Deadlock(stuck)
    return Timeline.from_events(
        events, schedule=schedule.name, num_ranks=schedule.num_ranks,
        num_stages=schedule.num_stages, num_microbatches=schedule.num_microbatches,
        stage_to_rank=schedule.stage_to_rank, source="simulated", shift_to_zero=False,
        chains=schedule.chains, chain_starts=schedule.chain_starts,
    )
