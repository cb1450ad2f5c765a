"""Closed forms for bubbles, step times and activation memory (DESIGN.md lists sources).

With F and B the per-rank forward and full-backward time, p ranks, m microbatches, no comm:

>>> round(bubble_fraction(4, 8), 4)   # the lesson's 27.27%
0.2727
>>> round(bubble_fraction(4, 64), 4)  # 4.48%
0.0448
"""

from __future__ import annotations

import math

from ..costs import StageCosts
from ..errors import UserError


def _check(num_stages: int, num_microbatches: int) -> None:
    if num_stages < 1:
        raise UserError(f"num_stages must be >= 1, got {num_stages}")
    if num_microbatches < 1:
        raise UserError(f"num_microbatches must be >= 1, got {num_microbatches}")


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """GPipe / 1F1B bubble fraction (N - 1) / (M + N - 1)."""
    _check(num_stages, num_microbatches)
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def gpipe_step_time(
    num_stages: int, num_microbatches: int, f: float = 1.0, b: float = 2.0
) -> float:
    """GPipe and 1F1B step time (M + N - 1)(F + B) with uniform per-stage costs."""
    _check(num_stages, num_microbatches)
    return (num_microbatches + num_stages - 1) * (f + b)


def is_uniform(costs: StageCosts) -> bool:
    """All stages cost the same, do some work, and communication is free: the closed forms'
    assumption. With F = B = 0 every fraction is 0/0 (the step takes no time): undefined,
    so no closed form applies (the simulator reports a bubble of 0)."""
    return (
        costs.comm == 0
        and len(set(costs.f)) == 1
        and len(set(costs.b)) == 1
        and len(set(costs.w)) == 1
        and costs.f[0] + costs.b[0] > 0
    )


def gpipe_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """GPipe and 1F1B: (p - 1)/(m + p - 1) when stages are uniform and comm is free."""
    if not is_uniform(costs):
        return None
    return bubble_fraction(ranks, microbatches)


# ---- the schedules beyond GPipe/1F1B ----------------------------------------------------
#
# Each ``*_closed_form(ranks, microbatches, chunks, costs)`` returns the published bubble
# fraction, or None where the publication's conditions do not hold. ``costs`` holds per-stage
# times; with ``v`` chunks per rank a chunk's time is a rank-share's time divided by v, so
# ``F = v * costs.f[0]`` is one rank-share's forward. The conditions below were found by
# simulating every combination of p <= 6, m <= 4p and F, I, W in {0.5, 1, 1.5, 2, 3}; the
# tests in ``tests/test_schedule_families.py`` repeat that check.


def _le(a: float, b: float) -> bool:
    return a <= b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _eq(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _rank_share(costs: StageCosts, chunks: int) -> tuple[float, float, float] | None:
    """(F, I, W) of one rank-share when every stage costs the same and comm is free."""
    if not is_uniform(costs) or any(costs.recompute):
        return None
    f, b, w = costs.f[0] * chunks, costs.b[0] * chunks, costs.w[0] * chunks
    return f, b - w, w


def interleaved_bubble_fraction(ranks: int, microbatches: int, chunks: int) -> float:
    """Interleaved 1F1B and looped BFS with v chunks per rank (Narayanan et al. 2021):
    bubble time (p - 1)(F + B)/v per rank, so the fraction is (p - 1)/(v m + p - 1).

    >>> round(interleaved_bubble_fraction(4, 8, 2), 4)   # 3 / 19
    0.1579
    """
    _check(ranks, microbatches)
    return (ranks - 1) / (chunks * microbatches + ranks - 1)


def interleaved_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """Holds for m >= p (every m the generator accepts; see ``schedules/interleaved.py``)."""
    if _rank_share(costs, chunks) is None or microbatches < ranks:
        return None
    return interleaved_bubble_fraction(ranks, microbatches, chunks)


def zb_h1_bubble_time(ranks: int, f: float, i: float, w: float) -> float:
    """ZB-H1 (Qi et al. 2024): idle time per rank (p - 1)(F + I - W)."""
    return (ranks - 1) * (f + i - w)


def zb_h2_bubble_time(ranks: int, f: float, i: float, w: float) -> float:
    """ZB-H2 (Qi et al. 2024): idle time (p - 1)(F + I - 2W) within rank 0's span (first F to
    last action; the paper drops the optimizer barrier between steps)."""
    return (ranks - 1) * (f + i - 2 * w)


def zb_h1_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """Fraction (p-1)(F+I-W) / (m(F+B) + (p-1)(F+I-W)); holds iff m >= p, W <= F, W <= I."""
    share = _rank_share(costs, chunks)
    if share is None:
        return None
    f, i, w = share
    if microbatches < ranks or not (_le(w, f) and _le(w, i)):
        return None
    idle = zb_h1_bubble_time(ranks, f, i, w)
    total = microbatches * (f + i + w) + idle
    return idle / total if total > 0 else 0.0


def zb_h2_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """Over rank 0's span: (p-1)(F+I-2W) / (m(F+B) + (p-1)(F+I-2W)); holds iff
    m >= 2p - 1, W <= F and F + I >= 2W."""
    share = _rank_share(costs, chunks)
    if share is None:
        return None
    f, i, w = share
    if microbatches < 2 * ranks - 1 or not (_le(w, f) and _le(2 * w, f + i)):
        return None
    idle = zb_h2_bubble_time(ranks, f, i, w)
    total = microbatches * (f + i + w) + idle
    return idle / total if total > 0 else 0.0


def zbv_closed_form(ranks: int, microbatches: int, chunks: int, costs: StageCosts) -> float | None:
    """ZB-V (Qi et al. 2024, section 6): zero bubble within every rank's span when
    F = I = W and m >= 2p - 1; the paper gives no formula for other costs."""
    share = _rank_share(costs, chunks)
    if share is None:
        return None
    f, i, w = share
    if microbatches < 2 * ranks - 1 or not (_eq(f, i) and _eq(i, w)):
        return None
    return 0.0


def dualpipe_bubble_time(half_stages: int, fb: float, b: float, w: float) -> float:
    """DualPipe / DualPipeV (DeepSeek, DualPipe README): (PP/2 - 1)(F&B + B - 3W), with PP the
    number of pipeline stages and F, B, W, F&B the times of one chunk (one stage).
    ``half_stages`` is PP/2: the number of ranks for DualPipeV (PP = 2p stages)."""
    return (half_stages - 1) * (fb + b - 3 * w)


def dualpipev_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """DualPipeV on p ranks (PP = 2p stages, chunk times F/2, B/2, W/2): every rank idles
    (p - 1)(F&B + B - 3W) when F = I, W <= I, m >= 2p and overlap = 1 (with overlap < 1
    the ranks do different numbers of overlapped pairs, so only the idlest rank matches, and
    only while F&B >= B: see ``tests/test_dualpipe.py``, DualPipe is two DualPipeVs). With
    all-to-all hidden in the pairs, F&B < F + B likewise: no fraction then."""
    share = _rank_share(costs, chunks)
    if share is None or costs.overlap != 1.0 or costs.has_a2a:
        return None
    f, i, w = costs.f[0], costs.b[0] - costs.w[0], costs.w[0]  # one chunk
    if microbatches < 2 * ranks or not (_eq(f, i) and _le(w, i)):
        return None
    b = i + w
    idle = dualpipe_bubble_time(ranks, costs.overlap * (f + b), b, w)
    total = microbatches * 2 * (f + b) + idle
    return idle / total if total > 0 else 0.0


def dualpipe_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """DualPipe on p ranks (p even) with M microbatches in total (M/2 from each end): every
    rank runs M stages' F and B and idles (p/2 - 1)(F&B + B - 3W), PP = p, with F, B, W the
    times of one stage (one of a rank's two stages, one per model copy). Found by simulation
    (``tests/test_dualpipe.py``): holds on every rank when F = I, W <= I, M >= 2p and
    overlap = 1, and for p = 2 always (no bubble). With overlap < 1 it holds only on the
    idlest rank, and only while F&B >= B, so no fraction is given then, nor with all-to-all
    (a pair then hides some of it: F&B < F + B, as with overlap < 1)."""
    if _rank_share(costs, chunks) is None or costs.overlap != 1.0 or costs.has_a2a:
        return None
    p, total = ranks, microbatches
    if p % 2 or total % 2 or total < 2 * p:
        return None
    f, i, w = costs.f[0], costs.b[0] - costs.w[0], costs.w[0]  # one stage
    if p > 2 and not (_eq(f, i) and _le(w, i)):
        return None
    b = i + w
    idle = dualpipe_bubble_time(p // 2, f + b, b, w)
    busy = total * (f + b)
    return idle / (busy + idle) if busy + idle > 0 else 0.0


# ---- memory-controlled V schedules (Qi et al. 2024, Controllable Memory) ----------------


def v_min_memory(ranks: int) -> int:
    """V-Min's peak activation memory per rank, in M_B (rank-shares): floor((p + 4)/3)."""
    return (ranks + 4) // 3


def v_half_memory(ranks: int) -> int:
    """V-Half's peak activation memory per rank, in M_B (rank-shares): floor((p + 2)/2)."""
    return (ranks + 2) // 2


def v_shape_bound(ranks: int, microbatches: int, chunk_activations: int) -> int:
    """The least step time, in chunk passes, of a V schedule holding at most ``k`` chunk
    activations per rank with F = I = W = 1 per chunk and no comm (Qi et al. 2024,
    Controllable Memory): ``6m + 6p - 1 - 3k``, a lower bound whenever ``2m > k``.

    Proof, on rank p - 1 (stages p - 1 and p, the turn of the V). Its first I cannot start
    before ``3p - 1`` (microbatch 0's forwards through all 2p stages, then the I of stages
    2p - 1 .. p); before that it runs only forwards, at most ``k`` (no W frees anything
    yet), and it cannot start before ``p - 1``: ``3p - 1 - k`` idle units before its first
    I. Let ``tau`` be the start of its last forward, F(p, m-1): that microbatch then needs
    p - 1 more forwards, 2p I's down to stage 0 and W(0): the step is at least
    ``tau + 3p + 1``, and after ``tau`` the rank only runs the I and W of activations it
    holds at ``tau``, at most ``2k`` passes: ``3p - 2k`` idle units after ``tau``. If
    ``2m > k`` the rank cannot run all 2m forwards before its first I, so the two stretches
    do not overlap, and the step is at least ``6m + (3p - 1 - k) + (3p - 2k)``. Equality
    needs, among other things, ``k`` activations that all wait for their I at ``tau``.

    >>> v_shape_bound(4, 8, 6)
    53
    """
    return 6 * microbatches + 6 * ranks - 1 - 3 * chunk_activations


def v_min_excess(ranks: int) -> int:
    """Units V-Min's step lies above :func:`v_shape_bound` (``schedules/v_min.py``), with
    F = I = W per chunk, no comm and m > floor((p+4)/3) (where the bound holds): 0, for
    every p >= 3 (the published block is 1 above when p mod 3 = 0 and 4 above when
    p mod 3 = 2); 2 for p = 2, where every order takes at least 6m + 1 (rank 1 starts at 1
    and runs 6m passes) and the bound is 6m - 1.

    >>> [v_min_excess(p) for p in (2, 3, 4, 5, 6, 7, 8, 9)]
    [2, 0, 0, 0, 0, 0, 0, 0]
    """
    return 2 if ranks == 2 else 0


def v_half_excess(ranks: int) -> int:
    """Units V-Half's step lies above :func:`v_shape_bound` (``schedules/v_half.py``), with
    F = I = W per chunk, no comm and m > floor((p+2)/2) (where the bound holds): 0 for
    every p >= 3, and 2 for p = 2 (where the bound, 6m - 1, is below the 6m + 1 every order
    needs: rank 1 cannot start before 1 and runs 6m passes).

    >>> [v_half_excess(p) for p in (2, 3, 4, 5, 6)]
    [2, 0, 0, 0, 0]
    """
    return 2 if ranks == 2 else 0


def _v_closed_form(ranks: int, microbatches: int, chunks: int, costs: StageCosts,
                   memory: int, excess: int) -> float | None:
    share = _rank_share(costs, chunks)
    if share is None or chunks != 2:
        return None
    f, i, w = share
    if not (_eq(f, i) and _eq(i, w)) or f == 0:
        return None
    if ranks == 1:
        return 0.0
    if microbatches <= memory:  # 2m <= k: the bound does not hold (see v_shape_bound)
        return None
    step = v_shape_bound(ranks, microbatches, 2 * memory) + excess
    return (step - 6 * microbatches) / step


def v_min_closed_form(ranks: int, microbatches: int, chunks: int,
                      costs: StageCosts) -> float | None:
    """V-Min's bubble over the step when F = I = W, uniform stages, no comm and
    m > floor((p+4)/3) (2m > k, where the bound holds): (step - 6m)/step with
    step = 6m + 6p - 1 - 3k + excess (k = 2 floor((p+4)/3); excess 0, or 2 at p = 2)."""
    return _v_closed_form(ranks, microbatches, chunks, costs, v_min_memory(ranks),
                          v_min_excess(ranks))


def v_half_closed_form(ranks: int, microbatches: int, chunks: int,
                       costs: StageCosts) -> float | None:
    """V-Half's bubble over the step when F = I = W, uniform stages, no comm and
    m > floor((p+2)/2) (2m > k, where the bound holds): (step - 6m)/step with
    step = 6m + 6p - 1 - 3k + excess (k = 2 floor((p+2)/2); excess 0, or 2 at p = 2)."""
    return _v_closed_form(ranks, microbatches, chunks, costs, v_half_memory(ranks),
                          v_half_excess(ranks))
