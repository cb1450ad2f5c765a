"""The JSON contract of a timeline: what ``simulate --json`` prints and the explorer serves.

One function builds the object (:func:`timeline_json`), one runs a schedule and builds it
(:func:`simulate_json`), and one reads it back (:func:`timeline_from_json`), so the command
line, ``run --json`` and the web explorer (``pipebubble explore``) cannot drift apart.

Fields (README, "JSON output"): ``schedule``, ``ranks``, ``stages``, ``microbatches``,
``step_time``, ``bubble_fraction``, ``lower_bound``, ``per_rank``; then
``closed_form_bubble`` (the schedule's published bubble for these costs, or null),
``span_bubble_fraction`` (the idlest rank's idle time within its own span),
``closed_form_basis`` (``step`` or ``span``); with a memory limit ``memory_limit``,
``fits`` and ``over_limit_ranks``; for ``auto`` its search (``auto``); and with events:
``memory`` (each rank's activation memory over time as a step function: the value holds
from ``time[i]`` until ``time[i + 1]``) and, last, ``events`` (one object per action).
:func:`write_simulate_json` writes the same text without building a dict per event.

>>> from pipebubble.schedules import get_schedule
>>> out = simulate_json(get_schedule("gpipe", ranks=4, microbatches=8), CostModel())
>>> out["step_time"], round(out["bubble_fraction"], 4), round(out["closed_form_bubble"], 4)
(33.0, 0.2727, 0.2727)
>>> out["memory"][0]["time"][:4], out["memory"][0]["value"][:4]  # F adds M_B as it starts
([0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from itertools import islice
from typing import TextIO

from ..costs import CostModel, StageCosts
from ..ir.schedule import Schedule, ScheduleError
from ..schedules import closed_form_bubble, lookup, search_info
from ..schedules.registry import SEARCH_INFO
from ..sim.kernel import Deadlock, simulate
from ..timeline import Timeline


def closed_form_for(schedule: Schedule, costs: CostModel) -> float | None:
    """The closed-form bubble for a registered schedule under these costs (None if unknown)."""
    try:
        sc = costs.resolve(schedule.num_stages, schedule.chunks)
        return closed_form_bubble(schedule.name, schedule.num_ranks, schedule.total_microbatches,
                                  schedule.chunks, sc)
    except ScheduleError:
        return None


def closed_form_basis(schedule: Schedule) -> str | None:
    """``step`` or ``span``: what the schedule's published bubble is measured over."""
    try:
        return lookup(schedule.name).closed_form_basis
    except ScheduleError:
        return None


def span_bubble(timeline: Timeline) -> float:
    """The idlest rank's idle time within its own span (first start to last end) over that
    span: what ZB-H2 and ZB-V publish (no optimizer barrier between steps)."""
    return max(((s.span - s.busy) / s.span if s.span > 0 else 0.0
                for s in timeline.rank_stats()), default=0.0)


def memory_json(timeline: Timeline) -> list[dict]:
    """Each rank's activation memory as a step function with only its change points.

    ``{"rank": r, "time": [0, t1, ...], "value": [v0, v1, ...]}``: the memory is
    ``value[i]`` from ``time[i]`` until ``time[i + 1]``; the last point is at the step's end.
    Each event adds ``mem_start`` at its start and ``mem_end`` at its end
    (:meth:`Timeline.memory_curve`); changes at one instant are summed, and points that
    change nothing are dropped. Vectorised: a million events take a fraction of a second.
    """
    import numpy as np

    out = []
    end = timeline.step_time
    start_col = np.asarray(timeline.start, dtype=np.float64)
    end_col = np.asarray(timeline.end, dtype=np.float64)
    m0, m1 = (np.asarray(c, dtype=np.float64) for c in (timeline.mem_start, timeline.mem_end))
    for r in range(timeline.num_ranks):
        lo, hi = timeline.offsets[r], timeline.offsets[r + 1]
        times = np.empty(2 * (hi - lo) + 1)
        deltas = np.empty_like(times)
        times[0], deltas[0] = 0.0, 0.0
        times[1::2], times[2::2] = start_col[lo:hi], end_col[lo:hi]
        deltas[1::2], deltas[2::2] = m0[lo:hi], m1[lo:hi]
        order = np.argsort(times, kind="stable")
        times, values = times[order], np.cumsum(deltas[order])
        last = np.append(times[1:] != times[:-1], True)  # the last point of each instant
        times, values = times[last], values[last]
        change = np.append(True, values[1:] != values[:-1])
        if times[0] > 0.0:  # nothing happens at 0: the curve still starts there, at 0
            times, values = np.append(0.0, times), np.append(0.0, values)
            change = np.append(True, change)
        times, values = times[change], values[change]
        if times[-1] < end:
            times, values = np.append(times, end), np.append(values, values[-1])
        out.append({"rank": r, "time": times.tolist(), "value": values.tolist()})
    return out


def memory_fields(timeline: Timeline, costs: CostModel) -> dict:
    """JSON fields on the memory limit: none without one; else ``memory_limit``, ``fits``
    and ``over_limit_ranks`` (the ranks whose peak activation memory goes over it)."""
    if costs.memory_limit is None:
        return {}
    over = costs.over_limit([s.peak_memory for s in timeline.rank_stats()])
    return {"memory_limit": costs.memory_limit, "fits": not over, "over_limit_ranks": over}


def auto_fields(schedule: Schedule) -> dict:
    """``{"auto": {placement, chunks, lower_bound, gap, stages, ...}}`` for an auto schedule
    (its provenance, ``schedules.auto.Provenance``), and its provable lower bound as the
    one top-level ``lower_bound`` (with ``lower_bound_kind``)."""
    info = search_info(schedule)
    if not info:
        return {}
    out = dict(info)
    return {SEARCH_INFO: out, "lower_bound": out["lower_bound"],
            "lower_bound_kind": out["lower_bound_kind"]}


def timeline_json(timeline: Timeline, closed_form: float | None, events: bool = True,
                  basis: str | None = "step") -> dict:
    """The JSON contract shared by every command (see README, "JSON output").

    Beyond the base contract: ``span_bubble_fraction`` (see :func:`span_bubble`) and
    ``closed_form_basis`` (``step`` or ``span``: which of the two fractions the closed form
    is comparable with; null when there is no closed form); with ``events``, the events and
    each rank's ``memory`` over time (:func:`memory_json`).
    """
    out = timeline.summary()
    out["closed_form_bubble"] = closed_form
    out["span_bubble_fraction"] = span_bubble(timeline)
    out["closed_form_basis"] = basis if closed_form is not None else None
    if events:
        out["memory"] = memory_json(timeline)
        out["events"] = timeline.events_json()
    return out


def simulate_checked(schedule: Schedule, costs: CostModel | StageCosts) -> Timeline:
    """:func:`simulate`, with a deadlock in a CSV file named by its rows and columns."""
    from .torch_csv import explain_deadlock

    try:
        return simulate(schedule, costs)
    except Deadlock as exc:
        raise explain_deadlock(schedule, exc) from None


def _head(schedule: Schedule, costs: CostModel, timeline: Timeline, closed_form: bool) -> dict:
    """Every field of :func:`simulate_json` but ``events``, in the order they are printed."""
    closed = closed_form_for(schedule, costs) if closed_form else None
    out = timeline_json(timeline, closed, events=False, basis=closed_form_basis(schedule))
    out.update(memory_fields(timeline, costs))
    out.update(auto_fields(schedule))
    out["memory"] = memory_json(timeline)
    return out


def simulate_json(schedule: Schedule, costs: CostModel, *, closed_form: bool = True,
                  timeline: Timeline | None = None) -> dict:
    """Simulate ``schedule`` under ``costs``: the object ``simulate --json`` prints.

    ``closed_form=False`` (a schedule read from a file) reports no closed form; pass the
    ``timeline`` when the caller has already simulated (the CLI also draws it).
    """
    if timeline is None:
        timeline = simulate_checked(schedule, costs)
    out = _head(schedule, costs, timeline, closed_form)
    out["events"] = timeline.events_json()
    return clean_floats(out)  # as printed: floats to JSON_DIGITS significant digits


_EVENT = ('{"rank": %d, "stage": %d, "kind": "%s", "microbatch": %d, "start": %r, '
          '"end": %r}')


JSON_DIGITS = 12


def clean_floats(obj: object, digits: int = JSON_DIGITS) -> object:
    """``obj`` with every float rounded to ``digits`` significant digits, so sums of exact
    decimal inputs print as such: 0.1 + 0.2 gives 0.3, not 0.30000000000000004. Twelve
    digits keep every measured time to a picosecond per second; inf/nan stay as they are.

    >>> clean_floats({"t": [0.1 + 0.2, 3, 1 / 3]})
    {'t': [0.3, 3, 0.333333333333]}
    """
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {k: clean_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_floats(v, digits) for v in obj]
    return obj


def write_simulate_json(stream: TextIO, schedule: Schedule, costs: CostModel,
                        timeline: Timeline, *, closed_form: bool = True) -> None:
    """Write :func:`simulate_json`'s object and a newline to ``stream``, the same text as
    ``json.dumps``, but the events are formatted straight from the timeline's columns
    instead of built as one dict each (a million events: about a second instead of tens).
    ``%r`` of a float is what json writes for it."""
    head = _head(schedule, costs, timeline, closed_form)
    finite = not len(timeline) or all(math.isfinite(x) for x in (
        min(timeline.start), max(timeline.end)))
    if not finite or timeline.has_a2a:  # json spells inf and nan its own way; events with
        # their all-to-all (a2a_hidden, a2a_exposed) are the dicts of events_json
        from ..files import json_text  # refuses inf and nan, naming the event

        stream.write(json_text(clean_floats({**head, "events": timeline.events_json()}))
                     + "\n")
        return
    stream.write(json.dumps(clean_floats(head))[:-1] + ', "events": [')
    fmt = f"%.{JSON_DIGITS}g"  # as clean_floats rounds: no float noise, the same text
    rows = zip(timeline.rank, timeline.stage, timeline.kind, timeline.microbatch,
               [float(fmt % x) for x in timeline.start], [float(fmt % x) for x in timeline.end],
               strict=True)
    first = True
    while part := ", ".join([_EVENT % row for row in islice(rows, 1 << 16)]):
        stream.write(part if first else ", " + part)
        first = False
    stream.write("]}\n")


def timeline_from_json(data: object, source: str = "timeline") -> Timeline:
    """A Timeline from the JSON contract (``simulate --json`` or ``run --json``).

    Every field is checked by :func:`pipebubble.timeline_io.timeline_from_json` (the one
    reader, also behind ``partition --measured``); here the object's ``source`` becomes
    ``measured`` only when it says so (``run --json`` does), else ``simulated``. Memory is not
    carried by events, so a Timeline read back has none (the object's own ``memory`` curves,
    when present, say what it held). ``source`` names the object in error messages.
    """
    from ..timeline_io import timeline_from_json as checked

    timeline = checked(data, source)
    measured = isinstance(data, Mapping) and data.get("source") == "measured"
    timeline.source = "measured" if measured else "simulated"
    return timeline
