"""What ``--png``, ``--svg``, ``--memory`` and ``--trace`` write, for every command.

``write(timelines, title, png=..., svg=..., trace=..., memory=...)`` is called by
``commands.common.write_figures`` with the values of the flags:

- one timeline: its Gantt chart (with ``--memory``, the memory curves stacked under it);
- several (``compare``'s schedules, or a prediction and a measurement): one figure with the
  timelines stacked on one time axis (with ``--memory``, each with its memory under it);
- ``--trace``: one Chrome/Perfetto trace holding every timeline (see ``trace.py``).

Labels are the schedule names when those differ, else the sources (``simulated`` /
``measured``), so ``[predicted, measured]`` of one schedule reads as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..timeline import Timeline
from .plots import default_labels, gantt_figure, save, timelines_figure
from .trace import write_trace


def figure(timelines: Sequence[Timeline], title: str | None = None, memory: bool = False,
           labels: Sequence[str] | None = None):
    """The one figure the flags draw for these timelines."""
    if not timelines:
        raise ValueError("nothing to draw: no timelines")
    if len(timelines) == 1:
        return gantt_figure(timelines[0], title=title, memory=memory)
    return timelines_figure(timelines, labels=labels, title=title, memory=memory)


def write(timelines: Sequence[Timeline], title: str, *, png: str | Path | None = None,
          svg: str | Path | None = None, trace: str | Path | None = None,
          memory: bool = False, labels: Sequence[str] | None = None) -> None:
    """Write the files asked for: a PNG and/or SVG of :func:`figure` (``memory``: with the
    memory curves), a Perfetto ``trace``; nothing for the ones left ``None``."""
    timelines = list(timelines)
    labels = list(labels) if labels is not None else default_labels(timelines)
    if png or svg:
        fig = figure(timelines, title, memory, labels)
        if png:
            save(fig, png, "png")
        if svg:
            save(fig, svg, "svg")
    if trace:
        write_trace(trace, timelines, labels)
