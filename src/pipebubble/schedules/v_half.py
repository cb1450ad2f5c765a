"""V-Half (Qi et al. 2024, *Pipeline Parallelism with Controllable Memory*): the V placement
at half of 1F1B's activation memory.

Built from a building block (``building_block.py``), the paper's (``delta0 = 2``,
``delta1 = 1``, as the authors' code builds it): chunk-0 forwards two units apart and their
input gradients one, chunk-1 forwards one apart and their input gradients two (three units
per stage in all, against V-Min's two and ZB-V's six), the turn of the V 1 unit (forward)
and 2 (backward), and the top of the V (the last stage's F to its I) 1 unit for odd p, 4 for
even p. A rank holds at most ``2 floor((p + 2)/2)`` chunk activations: **peak
``floor((p + 2)/2) x M_B`` per rank** when W frees what I kept (``M_W = M_B``), and no more
for any smaller ``M_W``.

Why 4 at the top for even p: the step-time bound ``6m + 6p - 1 - 3k`` (``k`` the peak in
chunk activations; ``sim/formulas.py`` proves it) is tight on rank p - 1, the turn of the V,
and only if at its last forward that rank holds ``k`` activations that all still wait for
their I (the cool-down then has 2k passes to fill). A rank's stages' F-to-I times add up
to ``6(p - 1) + 2 top + turn_f + turn_i`` for every rank (so the memory stays), and rank
p - 1's are ``L = 3(p - 1) + top`` (stage p) and ``L + turn_f + turn_i``. Top 4 makes
``L = 3p + 1``, past a multiple of the 6-unit period: ``p/2 + 1`` activations of each of
its stages wait for their I, ``p + 2`` in all (``tests/test_vshape.py`` counts them).

The mirrored block (chunk-0 forwards one apart, chunk-1 two, turn 2/1;
:func:`v_half_mirrored_offsets`) reaches the same unit bound but is slower under real
costs: at the turn its two input gradients sit in adjacent units, so the W of the first
waits behind the second; with the controllable-memory paper's Table 8 costs (p = 16,
m = 48) its step is 0.65 % longer. (The block this file had before that, turn 4/5 with top
1, misses the bound by one unit for even p.)

The repeated block is then *reordered at both ends* (``building_block.reorder_ends``, the
paper's last step): warm-up forwards go earlier where the rank's memory allows, and in the
cool-down every I goes before the Ws that only free memory, while the steady state stays
the block's own (a list-scheduled reorder can settle into another steady state that repeats
a bubble under comm > 0 and W < F: 0.21 span bubble at Table 8's p = 16, m = 128, against
0.079 now and the authors' 0.078). No rank then holds more than the plain block, whatever
``M_W``.

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
from .building_block import build_periodic
from .registry import ScheduleSpec, register


def v_half_offsets(p: int) -> tuple[int, ...]:
    """(dF0, dF1, dI0, dI1, turn_f, turn_i, top) of V-Half's block for ``p`` ranks.

    >>> v_half_offsets(5), v_half_offsets(6)
    ((2, 1, 1, 2, 1, 2, 1), (2, 1, 1, 2, 1, 2, 4))
    """
    return (2, 1, 1, 2, 1, 2, 1 if p % 2 else 4)


def v_half_published_offsets(p: int) -> tuple[int, ...]:
    """The paper's block, as the authors' code (``zbv_greedy.py``) builds it: the same as
    :func:`v_half_offsets`."""
    return v_half_offsets(p)


def v_half_mirrored_offsets(p: int) -> tuple[int, ...]:
    """The block V-Half had before: the paper's mirrored (chunk-0 forwards one unit apart,
    chunk-1 two, turn 2/1); the same unit step, slower under real costs (see above)."""
    return (1, 2, 2, 1, 2, 1, 1 if p % 2 else 4)


def v_half(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    orders = build_periodic(ranks, microbatches, [v_half_offsets(ranks)],
                            2 * v_half_memory(ranks))
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
        placement="v",
        split_only=True,
        memory_sweep=3,
    )
)
