"""The simulator: (Schedule, CostModel) -> Timeline, and what is computed beside it.

- ``kernel.py``: :func:`simulate`, the fast event kernel, and :class:`Deadlock`.
- ``wire.py``: lowering to per-rank SEND/RECV programs and their orderings.
- ``formulas.py``: closed forms of each schedule family, used as cross-checks.
- ``dataparallel.py``: the 2D step time (data-parallel all-reduce after each rank's last action).
"""

from .kernel import Deadlock, simulate

__all__ = ["Deadlock", "simulate"]
