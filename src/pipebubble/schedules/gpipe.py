"""GPipe (Huang et al. 2019): all forwards, then all backwards.

Rank r runs ``rF0 .. rF(m-1)`` then ``rB0 .. rB(m-1)``. Simple, but each rank holds the
activations of all m microbatches before the first backward frees one.
Step time with uniform costs: (m + p - 1)(F + B); bubble (p - 1)/(m + p - 1).
"""

from __future__ import annotations

from ..ir.orders import RankOrder
from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import gpipe_closed_form
from .registry import ScheduleSpec, register


def gpipe(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    import numpy as np

    m = microbatches
    mbs = np.concatenate([np.arange(m), np.arange(m)])
    orders = [RankOrder.build(r, "F" * m + "B" * m, mbs) for r in range(ranks)]
    return make_schedule("gpipe", orders, ranks, microbatches)


register(
    ScheduleSpec(
        "gpipe",
        gpipe,
        "all forwards, then all backwards (Huang et al. 2019)",
        closed_form=gpipe_closed_form,
        formula="bubble (p−1)(F+B): fraction (p−1)/(m+p−1)",
        torch_class="ScheduleGPipe",
        color="#0077BB",
    )
)
