"""pipebubble: plan, simulate, draw and run pipeline-parallel training schedules.

The schedule is data (``schedule.py``); the simulator (``simulate.py``) and the executors
(``runtime/``) consume it and both produce a ``Timeline`` (``timeline.py``).
"""

from .costs import CostModel
from .formulas import bubble_fraction
from .runtime.pipeline import Pipeline, PipelineStage
from .schedule import Action, Overlap, Schedule, ScheduleError, validate
from .schedules import get_schedule, schedule_names
from .simulate import Deadlock, simulate
from .timeline import Event, Timeline

__all__ = [
    "Action",
    "CostModel",
    "Deadlock",
    "Event",
    "Overlap",
    "Pipeline",
    "PipelineStage",
    "Schedule",
    "ScheduleError",
    "Timeline",
    "bubble_fraction",
    "get_schedule",
    "schedule_names",
    "simulate",
    "validate",
]

__version__ = "0.1.0"
