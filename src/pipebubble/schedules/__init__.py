"""Schedule generators and their registry.

Every generator is a pure function ``(ranks, microbatches, chunks, **options) -> Schedule``.
Families register themselves with :func:`register`; look them up by name, case-insensitive,
with :func:`get_schedule`.
"""

from .registry import (
    FIRST,
    SCHEDULES,
    STANDARD,
    ScheduleSpec,
    closed_form_bubble,
    get_schedule,
    lookup,
    register,
    schedule_names,
    search_info,
)

# Importing the family modules registers them: the built-in ones in this order (the order
# every listing shows), then any other module of this package, by name, so that a new
# family is one file here and nothing else (docs/new_family.md).
from . import gpipe, one_f_one_b  # noqa: E402,F401  isort: skip
from . import interleaved, looped_bfs, zero_bubble, zbv, dualpipe  # noqa: E402,F401  isort: skip
from . import v_half, v_min  # noqa: E402,F401  isort: skip


def _import_the_rest() -> None:
    """Import every other module of this package (a family registers on import)."""
    import importlib
    import pkgutil
    import sys

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        name = f"{__name__}.{info.name}"
        if not info.ispkg and name not in sys.modules:
            importlib.import_module(name)


_import_the_rest()

PLUGINS = "PIPEBUBBLE_SCHEDULES"
"""The environment variable naming modules (comma-separated import paths) that register
families kept outside this package; imported after the built-in ones, in every process a
run starts (the variable is inherited)."""


def _import_plugins() -> None:
    """Import the modules :data:`PLUGINS` names. One that cannot be imported is one line on
    stderr, and its families are then unknown names (a clear error where they are used)."""
    import importlib
    import os
    import sys

    for name in (n.strip() for n in os.environ.get(PLUGINS, "").split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  any failure of the user's module
            print(f"pipebubble: {PLUGINS} names {name!r}, which does not import: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


_import_plugins()

__all__ = [
    "FIRST",
    "SCHEDULES",
    "STANDARD",
    "ScheduleSpec",
    "closed_form_bubble",
    "get_schedule",
    "lookup",
    "register",
    "schedule_names",
    "search_info",
]

# The automatic scheduler (``schedules.auto``) registers the spec ``auto``: a search over
# orders for given costs, not a family, and registered last.
from .auto import auto_schedule  # noqa: E402  isort: skip

__all__ += ["auto_schedule"]
