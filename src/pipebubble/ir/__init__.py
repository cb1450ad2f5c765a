"""The schedule IR: actions, per-rank orders, placement, validation, and the dependency rule.

- ``schedule.py``: :class:`Kind` (F, I, W, B), :class:`Action` (``2F5``), :class:`Overlap`,
  :class:`Schedule`, placements, :func:`validate`.
- ``deps.py``: THE rule "which actions does this action wait for" (used by everything).
- ``orders.py``: :class:`RankOrder`, a rank's order as arrays that read as Actions.
- ``check.py``: :func:`validate`'s rules in one vectorised pass (what the simulator compiles
  from).
"""

from . import check  # noqa: F401  (plugs the vectorised pass into validate())
from .deps import (
    Dep,
    Handover,
    Signal,
    describe_wait,
    handovers,
    message,
    needs,
    producers,
    produces,
    signal_sources,
)
from .schedule import Action, Kind, Overlap, Schedule, ScheduleError, Step, validate

__all__ = [
    "Action",
    "Dep",
    "Handover",
    "Kind",
    "Overlap",
    "Schedule",
    "ScheduleError",
    "Signal",
    "Step",
    "describe_wait",
    "handovers",
    "message",
    "needs",
    "producers",
    "produces",
    "signal_sources",
    "validate",
]
