"""pipebubble: plan, simulate, draw and run pipeline-parallel training schedules.

A schedule is data (:mod:`pipebubble.ir`); the simulator (:mod:`pipebubble.sim`) and the
executors (:mod:`pipebubble.runtime`) consume it, and both produce a :class:`Timeline`.

Importing this package loads neither torch nor matplotlib: the lesson's ``Pipeline`` and
``PipelineStage`` (which need torch) are loaded the first time they are asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .costs import CostModel
from .ir.schedule import Action, Overlap, Schedule, ScheduleError, validate
from .schedules import auto_schedule, get_schedule, schedule_names
from .sim import Deadlock, simulate
from .sim.formulas import bubble_fraction
from .timeline import Event, Timeline

if TYPE_CHECKING:
    from .models.loader import load_model
    from .models.spec import ModelSpec
    from .runtime.pipeline import Pipeline, PipelineStage
    from .runtime.torch_engine import torch_schedule

__all__ = [
    "Action",
    "CostModel",
    "Deadlock",
    "Event",
    "ModelSpec",
    "Overlap",
    "Pipeline",
    "PipelineStage",
    "Schedule",
    "ScheduleError",
    "Timeline",
    "auto_schedule",
    "bubble_fraction",
    "get_schedule",
    "load_model",
    "schedule_names",
    "simulate",
    "torch_schedule",
    "validate",
]

__version__ = "0.1.0"

_LAZY = {"Pipeline": "runtime.pipeline", "PipelineStage": "runtime.pipeline",
         "ModelSpec": "models.spec", "load_model": "models.loader",
         "torch_schedule": "runtime.torch_engine"}


def __getattr__(name: str):  # PEP 562: torch is imported only when the lesson's classes are used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
