"""GPipe-LIFO, a toy schedule family: all forwards, then the backwards last microbatch first.

Rank r runs ``rF0 .. rF(m-1)`` then ``rB(m-1) .. rB0``. The last rank starts the backward of
the microbatch it has just finished, so no rank waits longer than under GPipe: with uniform
costs the step is (m + p - 1)(F + B) and the bubble (p - 1)/(m + p - 1), GPipe's own, with
GPipe's memory (every microbatch held before the first backward).

This one file is the whole family: drop it into ``src/pipebubble/schedules/`` (every module
there registers on import), or keep it anywhere importable and name it in
``PIPEBUBBLE_SCHEDULES`` (docs/new_family.md).
"""

from __future__ import annotations

from pipebubble.ir.schedule import Action, Schedule, make_schedule
from pipebubble.schedules.registry import ScheduleSpec, register
from pipebubble.sim.formulas import gpipe_closed_form


def gpipe_lifo(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Every rank: the m forwards in order, then the m backwards in reverse."""
    m = microbatches
    orders = [[Action(r, "F", j) for j in range(m)]
              + [Action(r, "B", j) for j in reversed(range(m))] for r in range(ranks)]
    return make_schedule("gpipe-lifo", orders, ranks, m)


register(ScheduleSpec(
    "gpipe-lifo",
    gpipe_lifo,
    "all forwards, then the backwards last microbatch first (a toy: GPipe's bubble)",
    aliases=("lifo",),
    closed_form=gpipe_closed_form,  # (p - 1)/(m + p - 1) with uniform costs, else None
    formula="bubble (p−1)(F+B): fraction (p−1)/(m+p−1)",
    placement="loop",  # stage s on rank s mod p (one stage per rank)
    chains=1,  # one model copy
    split_backward=False,  # fused backward (B), no I/W split
    torch_class=None,  # no torch class: torchtitan runs it from its CSV
    megatron=None,  # Megatron-LM does not pipeline it
    color="#117733",
))
