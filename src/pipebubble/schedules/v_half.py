"""V-Half (Qi et al. 2024, *Pipeline Parallelism with Controllable Memory*): the V placement
at half of 1F1B's activation memory.

Built from a building block (``building_block.py``): chunk-0 forwards one unit apart and
their input gradients two, chunk-1 forwards two apart and their input gradients one (three
units per stage in all, against V-Min's two and ZB-V's six), the turn of the V 2/1 units
(odd p) or 4/5 (even p). A rank holds at most ``2 floor((p + 2)/2)`` chunk activations:
**peak ``floor((p + 2)/2) x M_B`` per rank** when W frees what I kept (``M_W = M_B``).

The repeated block is then *reordered at both ends* (``building_block.reorder``, the
paper's last step): warm-up forwards go earlier where the rank's memory allows, and in the
cool-down every I goes before the Ws that only free memory. It is kept when it is shorter;
no rank then holds more than the plain block, whatever ``M_W``.

Step time with unit chunk passes (F = I = W = 1 per chunk, no comm), found by simulating
every p <= 16 and m >= 2p (``tests/test_vshape.py``), with ``k`` the peak in chunk
activations: the paper's bound ``6m + 6p - 1 - 3k`` exactly for odd p; one unit above it
for even p >= 4 (the paper reaches it there too); ``6m + 1`` for p = 2, where the bound
(``6m - 1``) is below what any order can do.

V-Half, p=2, m=2 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2)::

    rank 0: 0F0 0F1 3F0 3I0 3W0 3F1 3I1 0I0 3W1 0I1 0W0 0W1
    rank 1: 1F0 2F0 1F1 2I0 2W0 2F1 1I0 1W0 2I1 1I1 2W1 1W1
"""

from __future__ import annotations

from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import v_half_closed_form, v_half_memory
from .building_block import build
from .registry import ScheduleSpec, register


def v_half_offsets(p: int) -> tuple[int, ...]:
    """(dF0, dF1, dI0, dI1, turn_f, turn_i, top) of V-Half's block for ``p`` ranks."""
    return (1, 2, 2, 1, 4, 5, 1) if p % 2 == 0 else (1, 2, 2, 1, 2, 1, 1)


def v_half(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    orders = build(ranks, microbatches, [v_half_offsets(ranks)], 2 * v_half_memory(ranks))
    return make_schedule("v-half", orders, 2 * ranks, microbatches, placement="v")


register(
    ScheduleSpec(
        "v-half",
        v_half,
        "V placement (2 chunks), split backward: floor((p+2)/2) M_B per rank, half of "
        "1F1B's (Qi et al. 2024, Controllable Memory)",
        chunks=2,
        min_chunks=2,
        fixed_chunks=True,
        split_backward=True,
        aliases=("vhalf",),
        closed_form=v_half_closed_form,
        closed_form_basis="step",
    )
)
