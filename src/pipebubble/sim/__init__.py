"""The simulator: (Schedule, CostModel) -> Timeline, and what is computed beside it.

- ``reference.py``: :func:`simulate_reference`, the simulator as DESIGN.md states it, in
  plain Python (read this first).
- ``kernel.py``: :func:`simulate`, the fast kernel (same results; a test keeps them equal),
  and :class:`Deadlock`.
- ``program.py``: :class:`Compiled`, the evaluation core every search asks: a schedule
  compiled once for its step time, per-rank peaks, ``fits(limit)`` (one tolerance) and
  incremental re-timing of changed orders.
- ``wire.py``: lowering to per-rank SEND/RECV programs and their orderings.
- ``formulas.py``: closed forms of each schedule family, used as cross-checks.
- ``dataparallel.py``: the 2D step time (data-parallel all-reduce after each rank's last action).
"""

from .kernel import Deadlock, simulate
from .reference import simulate_reference

__all__ = ["Deadlock", "simulate", "simulate_reference"]
