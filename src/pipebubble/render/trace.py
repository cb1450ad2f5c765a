"""Chrome / Perfetto traces of Timelines (JSON Trace Event Format).

Open the file in https://ui.perfetto.dev or chrome://tracing. Layout:

- one *process* per rank (``pid``), named ``<label> rank r``; with several timelines
  (predicted and measured, or several schedules) each gets its own block of processes;
- one *thread* (track) per chunk: ``tid`` = chunk + 1, named ``stage s (chunk c)``, so an
  interleaved or V-shaped schedule shows each of a rank's stages on its own line;
- each action is a complete event (``ph: "X"``) named ``F3``/``B3``/..., category = kind,
  with ``args`` stage, microbatch, action (``2F3``) and overlapped;
- flow arrows (``ph: "s"`` then ``ph: "f"``, same ``id``) for every send → receive: from
  F(s, m) to F(s+1, m) (the activation) and from the backward I/B(s, m) to I/B(s-1, m)
  (the gradient). A flow starts just inside the end of its producer and binds to the
  slice enclosing its consumer's start (``bp: "e"``);
- a counter (``ph: "C"``) per rank, ``activation memory``, set at time 0 and at every change;
- with all-to-all (``--a2a-f``/``--a2a-b``), one more track per rank, ``all-to-all``, with a
  slice ``a2a hidden`` (category ``a2a_hidden``) where an overlapped F&B pair hides it behind
  the other half's compute and ``a2a exposed`` (``a2a_exposed``) where the rank waits for it,
  laid inside each action as the Gantt chart draws them (:func:`~.style.a2a_spans`); each
  action's slice also carries ``a2a_hidden`` and ``a2a_exposed`` in its ``args``.

Times: the format counts microseconds. Measured timelines are in seconds (1 s = 1e6 µs). The
simulator's abstract units are written as **1 unit = 1 ms**, so F=1, B=2 reads as 1 ms and
2 ms; ``otherData.time_scale`` says which scale a file uses. When any timeline is measured,
all of them are taken to be in seconds (a prediction calibrated from a measurement).

>>> from pipebubble import get_schedule, simulate
>>> doc = trace_document([simulate(get_schedule("gpipe", 2, 2))])
>>> sorted({e["ph"] for e in doc["traceEvents"]})
['C', 'M', 'X', 'f', 's']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import param
from ..ir.deps import Signal, producers, produces
from ..ir.schedule import Action
from ..timeline import Timeline
from .style import a2a_spans, is_measured
from .terminal import chunk_of_stage

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_TRACE = param("trace")

US_PER_SECOND = 1e6
US_PER_UNIT = 1e3  # simulated: 1 unit = 1 ms


def _us(x: float) -> float:
    return round(x, 3)


def trace_events(
    timeline: Timeline, *, us_per_unit: float, pid_base: int = 0, flow_base: int = 0,
    label: str | None = None,
) -> list[dict]:
    """All events of one timeline; ranks get pids ``pid_base .. pid_base + p - 1`` and flows
    the integer ids ``flow_base, flow_base + 1, ...``."""
    label = label or timeline.schedule
    chunk = chunk_of_stage(timeline)
    t0 = min(timeline.start, default=0.0)
    comm = timeline.has_a2a
    comm_tid = max(chunk, default=0) + 2  # the all-to-all track, under the stages'
    events: list[dict] = []
    for r in range(timeline.num_ranks):
        pid = pid_base + r
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"{label} rank {r}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        for s in range(timeline.num_stages):
            if timeline.stage_to_rank[s] == r:
                tid = chunk[s] + 1
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"name": f"stage {s} (chunk {chunk[s]})"}})
                events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}})
        if comm:
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": comm_tid,
                           "args": {"name": "all-to-all"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid,
                           "tid": comm_tid, "args": {"sort_index": comm_tid}})

    # Slices, and which slice produced each signal (ir.deps: F output, input gradient, W).
    made: dict[Signal, int] = {}
    slices: list[dict] = []
    comm_slices: list[dict] = []
    for i, e in enumerate(timeline.events()):
        # Round the ends, not the duration, so back-to-back actions stay back to back.
        ts = _us((e.start - t0) * us_per_unit)
        dur = _us(_us((e.end - t0) * us_per_unit) - ts)
        slices.append({
            "name": f"{e.kind}{e.microbatch}", "cat": e.kind, "ph": "X", "ts": ts, "dur": dur,
            "pid": pid_base + e.rank, "tid": chunk[e.stage] + 1,
            "args": {"stage": e.stage, "microbatch": e.microbatch,
                     "action": f"{e.stage}{e.kind}{e.microbatch}", "overlapped": e.overlapped},
        })
        made[produces(Action(e.stage, e.kind, e.microbatch))] = i
        if comm and (e.a2a_hidden or e.a2a_exposed):
            slices[-1]["args"].update(a2a_hidden=e.a2a_hidden, a2a_exposed=e.a2a_exposed)
            spans = a2a_spans(e.start, e.end, e.a2a_hidden, e.a2a_exposed)
            for span, what in zip(spans, ("hidden", "exposed"), strict=True):
                if span is None:
                    continue
                a = _us((span[0] - t0) * us_per_unit)
                comm_slices.append({
                    "name": f"a2a {what}", "cat": f"a2a_{what}", "ph": "X", "ts": a,
                    "dur": _us(_us((span[1] - t0) * us_per_unit) - a),
                    "pid": pid_base + e.rank, "tid": comm_tid,
                    "args": {"action": f"{e.stage}{e.kind}{e.microbatch}"}})
    events.extend(slices)
    events.extend(comm_slices)

    # Flows: each message between stages (ir.deps: an activation F(s) -> F(s+1), a gradient
    # I/B(s) -> I/B(s-1), within a chain), from its producer's slice to its consumer's.
    edges = []
    for i, e in enumerate(timeline.events()):
        for dep in producers(Action(e.stage, e.kind, e.microbatch), timeline):
            if dep.signal.stage != e.stage and dep.signal in made:
                edges.append((made[dep.signal], i,
                              "activation" if dep.signal.kind == "F" else "gradient"))
    for n, (a, b, name) in enumerate(edges):
        src, dst = slices[a], slices[b]
        flow_id = flow_base + n
        start = _us(src["ts"] + max(0.0, src["dur"] - min(1.0, src["dur"] / 2)))
        events.append({"name": name, "cat": "flow", "ph": "s", "id": flow_id, "ts": start,
                       "pid": src["pid"], "tid": src["tid"]})
        events.append({"name": name, "cat": "flow", "ph": "f", "bp": "e", "id": flow_id,
                       "ts": dst["ts"], "pid": dst["pid"], "tid": dst["tid"]})

    # Memory counters: time 0, then every change.
    name = "activation memory" + (" (bytes)" if timeline.source == "measured" else " (M_B)")
    for r in range(timeline.num_ranks):
        pid, cur = pid_base + r, 0.0
        events.append({"name": name, "ph": "C", "ts": 0.0, "pid": pid, "tid": 0,
                       "args": {"memory": 0.0}})
        for e in timeline.events(r):
            for t, delta in ((e.start, e.mem_start), (e.end, e.mem_end)):
                if delta:
                    cur += delta
                    events.append({"name": name, "ph": "C", "ts": _us((t - t0) * us_per_unit),
                                   "pid": pid, "tid": 0, "args": {"memory": cur}})
    return events


def trace_document(timelines: Sequence[Timeline], labels: Sequence[str] | None = None) -> dict:
    """The whole JSON object: ``traceEvents`` plus ``otherData`` saying what and which scale."""
    if not timelines:
        raise ValueError("a trace needs at least one timeline")
    if labels is None:
        from .plots import default_labels

        labels = default_labels(timelines)
    measured = is_measured(timelines)
    us_per_unit = US_PER_SECOND if measured else US_PER_UNIT
    events: list[dict] = []
    pid = flows = 0
    for t, label in zip(timelines, labels, strict=True):
        mine = trace_events(t, us_per_unit=us_per_unit, pid_base=pid, flow_base=flows,
                            label=label)
        events.extend(mine)
        pid += t.num_ranks
        flows += sum(1 for e in mine if e["ph"] == "s")
    other = {
        "generator": "pipebubble",
        "time_scale": "measured: timestamps are real time (1 s = 1e6 us)" if measured else
        "simulated: 1 cost-model unit = 1 ms (1000 us)",
    }
    for k, (t, label) in enumerate(zip(timelines, labels, strict=True)):
        other[f"timeline {k}"] = (
            f"{label}: {t.schedule}, p={t.num_ranks}, m={t.num_microbatches * t.chains}, "
            f"v={t.chunks}, "
            f"{t.source}, step time {t.step_time:.6g}, bubble {t.bubble_fraction:.2%}"
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(path: str | Path, timelines: Sequence[Timeline],
                labels: Sequence[str] | None = None) -> Path:
    """Write the trace of ``timelines`` to ``path`` (compact JSON); return the path."""
    from ..files import json_text, write_text

    doc = trace_document(timelines, labels)
    return write_text(path, json_text(doc, _TRACE, separators=(",", ":")), _TRACE)
