"""Closed forms for bubbles, step times and activation memory (DESIGN.md lists sources).

With F and B the per-rank forward and full-backward time, p ranks, m microbatches, no comm:

>>> round(bubble_fraction(4, 8), 4)   # the lesson's 27.27%
0.2727
>>> round(bubble_fraction(4, 64), 4)  # 4.48%
0.0448
"""

from __future__ import annotations

from .costs import StageCosts


def _check(num_stages: int, num_microbatches: int) -> None:
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")


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


def gpipe_bubble_time(num_stages: int, f: float = 1.0, b: float = 2.0) -> float:
    """Idle time per rank for GPipe and 1F1B: (N - 1)(F + B)."""
    return (num_stages - 1) * (f + b)


def is_uniform(costs: StageCosts) -> bool:
    """All stages cost the same and communication is free: the closed forms' assumption."""
    return (
        costs.comm == 0
        and len(set(costs.f)) == 1
        and len(set(costs.b)) == 1
        and len(set(costs.w)) == 1
    )


def gpipe_closed_form(
    ranks: int, microbatches: int, chunks: int, costs: StageCosts
) -> float | None:
    """GPipe and 1F1B: (p - 1)/(m + p - 1) when stages are uniform and comm is free."""
    if not is_uniform(costs):
        return None
    return bubble_fraction(ranks, microbatches)
