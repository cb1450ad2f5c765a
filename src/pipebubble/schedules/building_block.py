"""The building-block construction of Qi et al. 2024, *Pipeline Parallelism with
Controllable Memory* (NeurIPS 2024), for the V placement.

A *building block* is where one microbatch's passes sit in time, with every pass (F, I, W
of one chunk) one time unit: stage s's forward at ``tF[s]``, its input gradient at
``tI[s]``, its weight gradient at ``tW[s]``. Repeating the block every ``T = 6`` units (each
rank runs six passes per microbatch: F, I, W of two chunks) gives a schedule without two
passes of a rank colliding as long as each rank's six start times differ modulo 6. A
stage's activation lives from its F to the end of its W (the lifespan ``l``), so a rank
holds about ``sum over its stages of ceil(l / 6)`` chunk activations in the steady state:
short offsets between consecutive stages mean short lifespans and little memory.

The block is set by the *offsets* between consecutive stages: ``dF0``/``dF1`` between the
forwards of consecutive chunk-0/chunk-1 stages, ``dI0``/``dI1`` between their input
gradients, ``turn_f`` between the forwards of stages p-1 and p (both on rank p-1, the turn of
the V), ``turn_i`` between their input gradients, and ``top`` between the forward and the
input gradient of the last stage (on rank 0). Each W goes in the first free slot after its
I. The per-rank order is the repeated block sorted by time; the simulator then *squeezes*
it (every action as early as its order allows), which shortens warm-up and cool-down.

>>> tF, tI, tW = block(2, (1, 1, 1, 1, 1, 1, 1))
>>> tF, tI, tW
([0, 1, 2, 3], [7, 6, 5, 4], [8, 10, 9, 5])
"""

from __future__ import annotations

from ..ir.schedule import Action, ScheduleError

PERIOD = 6


def block(p: int, offsets: tuple[int, ...], period: int = PERIOD
          ) -> tuple[list[int], list[int], list[int]]:
    """(tF, tI, tW) of one microbatch for ``p`` ranks; ``offsets`` = (dF0, dF1, dI0, dI1,
    turn_f, turn_i, top). Raises ScheduleError if two passes of a rank collide modulo
    ``period`` (6: no idle slot in the steady state; more: a microbatch every ``period``
    units, fewer activations in flight, for memory limits below the 6-unit block's)."""
    d_f0, d_f1, d_i0, d_i1, turn_f, turn_i, top = offsets
    S = 2 * p
    rank = [s if s < p else S - 1 - s for s in range(S)]
    t_f = [0] * S
    for s in range(1, S):
        t_f[s] = t_f[s - 1] + (turn_f if s == p else d_f0 if s < p else d_f1)
    t_i = [0] * S
    t_i[S - 1] = t_f[S - 1] + top
    for s in range(S - 2, -1, -1):
        t_i[s] = t_i[s + 1] + (turn_i if s == p - 1 else d_i0 if s < p - 1 else d_i1)
    taken: list[set[int]] = [set() for _ in range(p)]
    for s in range(S):
        for t in (t_f[s], t_i[s]):
            if t % period in taken[rank[s]]:
                raise ScheduleError(f"building block {offsets} collides on rank {rank[s]} "
                                    f"for p={p}")
            taken[rank[s]].add(t % period)
    t_w = [0] * S
    for s in sorted(range(S), key=lambda s: t_i[s]):
        t = t_i[s] + 1
        while t % period in taken[rank[s]]:
            t += 1
        taken[rank[s]].add(t % period)
        t_w[s] = t
    return t_f, t_i, t_w


def repeat(p: int, microbatches: int, times: tuple[list[int], list[int], list[int]],
           period: int = PERIOD) -> list[list[Action]]:
    """Per-rank orders: the block repeated every ``period`` units, sorted by time."""
    t_f, t_i, t_w = times
    S = 2 * p
    timed: list[list[tuple[int, Action]]] = [[] for _ in range(p)]
    for s in range(S):
        r = s if s < p else S - 1 - s
        for j in range(microbatches):
            base = period * j
            timed[r].append((t_f[s] + base, Action(s, "F", j)))
            timed[r].append((t_i[s] + base, Action(s, "I", j)))
            timed[r].append((t_w[s] + base, Action(s, "W", j)))
    return [[a for _, a in sorted(events)] for events in timed]
