"""V-Min (Qi et al. 2024, *Pipeline Parallelism with Controllable Memory*): the V placement
at about a third of 1F1B's activation memory.

Built from a building block (``building_block.py``) whose consecutive stages are one unit
apart, forward and backward (dF = dI = 1; for p a multiple of 3 the turn of the V is 3
units, forward and backward, so no two passes of a rank collide). Each stage's activation
then lives about ``2(2p - 1 - 2r) + ...`` units and a rank holds ``2 floor((p + 4)/3)``
chunk activations at most: **peak ``floor((p + 4)/3) x M_B`` per rank** (against ZB-V's
``p x M_B``) when W frees what I kept (``M_W = M_B``).

The repeated block is then *reordered at both ends* (``building_block.reorder``, the
paper's last step), and V-Half's block is tried too (it fits V-Min's memory only for small
p: it wins at p = 3); the shortest order that holds no more than V-Min's plain block, for
every ``M_W``, is kept.

Step time with unit chunk passes (F = I = W = 1 per chunk, no comm), found by simulating
every p <= 16 and m >= 2p (``tests/test_vshape.py``), with ``k`` the peak in chunk
activations: the paper's bound ``6m + 6p - 1 - 3k`` exactly when ``p mod 3 == 1`` and for
p = 3; 1 unit above it when ``p mod 3 == 0`` (p >= 6); 4 units above when ``p mod 3 == 2``,
as the published construction (reordering reaches 3 there, but only by holding more than
the plain block when ``M_W < M_B``, so it is not kept). V-Min's fixed pattern keeps a
repeating bubble when F, I, W differ.

V-Min, p=2, m=2 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2)::

    rank 0: 0F0 3F0 3I0 3W0 0F1 0I0 0W0 3F1 3I1 3W1 0I1 0W1
    rank 1: 1F0 2F0 2I0 1I0 1F1 2F1 2W0 1W0 2I1 1I1 2W1 1W1
"""

from __future__ import annotations

from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import v_half_memory, v_min_closed_form, v_min_memory
from .building_block import build
from .registry import ScheduleSpec, register
from .v_half import v_half_offsets


def v_min_offsets(p: int) -> tuple[int, ...]:
    """(dF0, dF1, dI0, dI1, turn_f, turn_i, top) of V-Min's block for ``p`` ranks."""
    return (1, 1, 1, 1, 3, 3, 1) if p % 3 == 0 else (1, 1, 1, 1, 1, 1, 1)


def v_min(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    # Where V-Half holds no more than V-Min (p = 2, 3, 5), its block is tried too.
    blocks = [v_min_offsets(ranks)]
    if v_half_memory(ranks) == v_min_memory(ranks):
        blocks.append(v_half_offsets(ranks))
    orders = build(ranks, microbatches, blocks, 2 * v_min_memory(ranks))
    return make_schedule("v-min", orders, 2 * ranks, microbatches, placement="v")


register(
    ScheduleSpec(
        "v-min",
        v_min,
        "V placement (2 chunks), split backward: floor((p+4)/3) M_B per rank, a third of "
        "1F1B's (Qi et al. 2024, Controllable Memory)",
        chunks=2,
        min_chunks=2,
        fixed_chunks=True,
        split_backward=True,
        aliases=("vmin",),
        closed_form=v_min_closed_form,
        closed_form_basis="step",
    )
)
