"""V-Min (Qi et al. 2024, *Pipeline Parallelism with Controllable Memory*): the V placement
at about a third of 1F1B's activation memory.

Built from a building block (``building_block.py``) whose consecutive stages are one unit
apart, forward and backward (dF = dI = 1, the turn of the V 1 unit too), with the top of
the V (the last stage's F to its I) 1, 3 or 5 units for p mod 3 = 1, 0, 2. A rank holds at
most ``2 floor((p + 4)/3)`` chunk activations: **peak ``floor((p + 4)/3) x M_B`` per rank**
(against ZB-V's ``p x M_B``) when W frees what I kept (``M_W = M_B``), and no more for any
smaller ``M_W``.

Why those tops: the step-time bound ``6m + 6p - 1 - 3k`` (``k`` the peak in chunk
activations; ``sim/formulas.py`` proves it) is tight on rank p - 1, the turn of the V, and
only if at its last forward that rank holds ``k`` activations that all still wait for their
I. Its stages' F-to-I times are ``L = 2(p - 1) + top`` (stage p) and ``L + 2``; the top
stretches them just past a multiple of the 6-unit period, so that ``k/2`` activations of
each stage wait there. The published block (top 1, and turn 3/3 when p mod 3 = 0) falls
one activation short of ``k`` when p mod 3 = 0 (one unit above the bound) and two when
p mod 3 = 2 (four units above, as published). The longer top costs memory only where
``M_W < M_B``, and only when p mod 3 = 2: there, a schedule at the bound holds ``k``
activations before their I on rank p - 1, so it holds ``k/2 x M_B`` whatever W keeps,
where the published block holds ``M_B/2`` less at ``M_W = M_B/2`` (one ``M_B`` less at
``M_W = 0``). :func:`v_min_published` builds that block; ``auto`` tries it too.

The repeated block is then *reordered at both ends* (``building_block.reorder_ends``, the
paper's last step, which keeps the block's steady state): warm-up forwards go earlier
where the rank's memory allows, and in the cool-down every I goes before the Ws that only
free memory. It is kept when it is shorter;
no rank then holds more than the plain block, whatever ``M_W``.

Step time with unit chunk passes (F = I = W = 1 per chunk, no comm), ``k = 2 floor((p +
4)/3)``: **the bound ``6m + 6p - 1 - 3k`` exactly, for every p >= 3 (every p mod 3) and
every m > k/2** (the m for which it is a bound: with fewer microbatches a rank can run all
its forwards before its first I), simulated for every p <= 24 (``tests/test_vshape.py`` up
to p = 12, ``bench/bench_vshape.py`` beyond); for p = 2, ``6m + 1`` (m >= 2), the least any
order can take. V-Min's fixed pattern keeps a repeating bubble when F, I, W differ.

V-Min, p=2, m=2 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2)::

    rank 0: 0F0 0F1 3F0 3I0 3F1 3I1 0I0 3W0 0I1 0W0 3W1 0W1
    rank 1: 1F0 2F0 1F1 2F1 2I0 1I0 2I1 1I1 2W0 1W0 2W1 1W1
"""

from __future__ import annotations

from ..ir.schedule import Schedule, make_schedule
from ..sim.formulas import v_min_closed_form, v_min_memory
from .building_block import build_periodic
from .registry import ScheduleSpec, register


def v_min_offsets(p: int) -> tuple[int, ...]:
    """(dF0, dF1, dI0, dI1, turn_f, turn_i, top) of V-Min's block for ``p`` ranks.

    >>> [v_min_offsets(p)[-1] for p in (6, 7, 8)]
    [3, 1, 5]
    """
    return (1, 1, 1, 1, 1, 1, (3, 1, 5)[p % 3])


def v_min_published_offsets(p: int) -> tuple[int, ...]:
    """The published V-Min block: all offsets 1, the turn 3/3 when p mod 3 = 0."""
    return (1, 1, 1, 1, 3, 3, 1) if p % 3 == 0 else (1, 1, 1, 1, 1, 1, 1)


def v_min(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    orders = build_periodic(ranks, microbatches, [v_min_offsets(ranks)],
                            2 * v_min_memory(ranks))
    return make_schedule("v-min", orders, 2 * ranks, microbatches, placement="v")


def v_min_published(ranks: int, microbatches: int) -> Schedule:
    """V-Min from the published block, reordered the same way: 1 unit slower than
    :func:`v_min` when p mod 3 = 0 and 4 when p mod 3 = 2 (2 at p = 2), the same
    order when p mod 3 = 1; when p mod 3 = 2 it holds ``M_B/2`` less per rank at
    ``M_W = M_B/2`` (``M_B`` less at ``M_W = 0``), the same at ``M_W = M_B``."""
    orders = build_periodic(ranks, microbatches, [v_min_published_offsets(ranks)],
                            2 * v_min_memory(ranks))
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
        placement="v",
        split_only=True,
        memory_sweep=2,
    )
)
