"""The schedule IR: actions, per-rank orders, placement, validation, and the dependency rule.

- ``schedule.py``: :class:`Kind` (F, I, W, B), :class:`Action` (``2F5``), :class:`Overlap`,
  :class:`Schedule`, placements, :func:`validate`.
- ``deps.py``: THE rule "which actions does this action wait for" (used by everything).
"""

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
    "validate",
]
