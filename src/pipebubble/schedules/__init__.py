"""Schedule generators and their registry.

Every generator is a pure function ``(ranks, microbatches, chunks, **options) -> Schedule``.
Families register themselves with :func:`register`; look them up by name, case-insensitive,
with :func:`get_schedule`.
"""

from .registry import (
    SCHEDULES,
    ScheduleSpec,
    closed_form_bubble,
    get_schedule,
    lookup,
    register,
    schedule_names,
)

# Importing the family modules registers them.
from . import gpipe, one_f_one_b  # noqa: E402,F401  isort: skip
from . import interleaved, looped_bfs, zero_bubble, zbv, dualpipe  # noqa: E402,F401  isort: skip
from . import v_half, v_min  # noqa: E402,F401  isort: skip

__all__ = [
    "SCHEDULES",
    "ScheduleSpec",
    "closed_form_bubble",
    "get_schedule",
    "lookup",
    "register",
    "schedule_names",
]

# The automatic scheduler is not a family (it needs costs): ``schedules.auto``.
from .auto import auto_schedule  # noqa: E402  isort: skip

__all__ += ["auto_schedule"]
