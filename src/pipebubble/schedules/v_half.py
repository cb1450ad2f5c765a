"""V-Half (Qi et al. 2024, *Pipeline Parallelism with Controllable Memory*): the V placement
at half of 1F1B's activation memory.

Built from a building block (``building_block.py``): chunk-0 forwards one unit apart and
their input gradients two, chunk-1 forwards two apart and their input gradients one (three
units per stage in all, against V-Min's two and ZB-V's six), the turn of the V 2 units
(forward) and 1 (backward), and the top of the V (the last stage's F to its I) 1 unit for
odd p, 4 for even p. A rank holds at most ``2 floor((p + 2)/2)`` chunk activations:
**peak ``floor((p + 2)/2) x M_B`` per rank** when W frees what I kept (``M_W = M_B``), and
no more for any smaller ``M_W``.

Why 4 at the top for even p: the step-time bound ``6m + 6p - 1 - 3k`` (``k`` the peak in
chunk activations; ``sim/formulas.py`` proves it) is tight on rank p - 1, the turn of the V,
and only if at its last forward that rank holds ``k`` activations that all still wait for
their I (the cool-down then has 2k passes to fill). A rank's stages' F-to-I times add up
to ``6(p - 1) + 2 top + turn_f + turn_i`` for every rank (so the memory stays), and rank
p - 1's are ``L = 3(p - 1) + top`` (stage p) and ``L + turn_f + turn_i``. The block this
file had before (turn 4/5, top 1, after the paper's turn of 4 for even p) gives stage p
``L = 3p - 2``: rank p - 1 then holds ``p + 2`` activations, one of them already past its I,
which costs one unit. Turn 2/1 and top 4 keep the sum and make ``L = 3p + 1``, past a
multiple of the 6-unit period: ``p/2 + 1`` activations of each of its stages wait for their
I, ``p + 2`` in all (``tests/test_vshape.py`` counts them).

The repeated block is then *reordered at both ends* (``building_block.reorder``, the
paper's last step): warm-up forwards go earlier where the rank's memory allows, and in the
cool-down every I goes before the Ws that only free memory. It is kept when it is shorter;
no rank then holds more than the plain block, whatever ``M_W``.

Step time with unit chunk passes (F = I = W = 1 per chunk, no comm), ``k = 2 floor((p +
2)/2)``: **the bound ``6m + 6p - 1 - 3k`` exactly, for every p >= 3 and every m > k/2**
(the m for which it is a bound: with fewer microbatches a rank can run all its forwards
before its first I), simulated for every p <= 24 (``tests/test_vshape.py`` up to p = 12,
``bench/bench_vshape.py`` beyond); for p = 2, ``6m + 1`` (m >= 2), the least any order can
take (rank 1 starts at 1 and runs 6m passes; the bound, 6m - 1, is below it).

V-Half, p=2, m=2 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2)::

    rank 0: 0F0 0F1 3F0 3I0 3W0 3F1 0I0 3I1 0W0 3W1 0I1 0W1
    rank 1: 1F0 2F0 1F1 2F1 2I0 1I0 2W0 1W0 2I1 1I1 2W1 1W1
"""

from __future__ import annotations

from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import v_half_closed_form, v_half_memory
from .building_block import build
from .registry import ScheduleSpec, register


def v_half_offsets(p: int) -> tuple[int, ...]:
    """(dF0, dF1, dI0, dI1, turn_f, turn_i, top) of V-Half's block for ``p`` ranks.

    >>> v_half_offsets(5), v_half_offsets(6)
    ((1, 2, 2, 1, 2, 1, 1), (1, 2, 2, 1, 2, 1, 4))
    """
    return (1, 2, 2, 1, 2, 1, 1 if p % 2 else 4)


def v_half_published_offsets(p: int) -> tuple[int, ...]:
    """The block V-Half had before (turn 4/5 for even p, top 1): one unit above the bound
    for even p >= 4 (``tests/test_vshape.py`` keeps the comparison)."""
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
