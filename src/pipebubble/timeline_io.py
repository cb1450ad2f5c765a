"""Read a Timeline back from the JSON contract, checking every field before use.

``pipebubble simulate --json`` and ``pipebubble run --json`` print a timeline as one JSON
object (README, "JSON output"): ``schedule``, ``ranks``, ``stages``, ``microbatches`` and
``events``, a list of ``{rank, stage, kind, microbatch, start, end}``. Files like that come
back as ``partition --measured`` (and the explorer's uploads), written by hand or by another
tool, so nothing in them is trusted:

- ``ranks``, ``stages``, ``microbatches`` are whole numbers >= 1 (``true`` is not a number),
  at most :data:`MAX_RANKS` ranks and :data:`MAX_STAGES` stages, and ``stages >= ranks``;
- ``events`` is a non-empty list of at most :data:`MAX_EVENTS` objects;
- every event's ``rank`` is in ``0..ranks-1`` and ``stage`` in ``0..stages-1`` (a negative
  index would silently wrap around in Python), ``microbatch`` in ``0..microbatches-1``,
  ``kind`` one of F, I, W, B, ``start`` and ``end`` finite with ``end >= start``;
- a stage runs on one rank only, and every stage in ``0..stages-1`` has events.

Each message names the field, the event's index and the value, e.g.
``--measured 'run.json': events[3].rank is -1; valid ranks are 0..3``.

>>> t = timeline_from_json({"ranks": 1, "stages": 1, "events": [
...     {"rank": 0, "stage": 0, "kind": "F", "microbatch": 0, "start": 0, "end": 1.5}]})
>>> t.step_time
1.5
>>> timeline_from_json({"ranks": 2, "stages": 2, "events": []}, "x.json")
Traceback (most recent call last):
...
pipebubble.files.FileError: x.json: 'events' is empty; a timeline needs at least one event
"""

from __future__ import annotations

import math
import os

from .files import FileError, read_json_file
from .limits import MAX_TIME
from .timeline import Event, Timeline

MAX_RANKS = 100_000
MAX_STAGES = 1_000_000
MAX_MICROBATCHES = 10_000_000
MAX_EVENTS = 5_000_000
KINDS = ("F", "I", "W", "B")


def load_timeline(path: str | os.PathLike, what: str = "timeline file") -> Timeline:
    """Read and check a timeline JSON file (see the module doc); errors name ``what``."""
    data = read_json_file(path, what)
    return timeline_from_json(data, f"{what} {os.fspath(path)!r}")


def _count(data: dict, key: str, where: str, top: int, required: bool = True) -> int | None:
    if key not in data:
        if required:
            raise FileError(f"{where}: lacks {key!r} (see README, JSON output)")
        return None
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
        raise FileError(f"{where}: {key!r} must be a whole number >= 1, got {v!r}")
    v = int(v)
    if not 1 <= v <= top:
        raise FileError(f"{where}: {key!r} must be between 1 and {top:,}, got {v}")
    return v


def _int_field(e: dict, key: str, i: int, where: str, n: int, plural: str) -> int:
    v = e[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or v != int(v):
        raise FileError(f"{where}: events[{i}].{key} must be a whole number, got {v!r}")
    v = int(v)
    if not 0 <= v < n:
        raise FileError(f"{where}: events[{i}].{key} is {v}; valid {plural} are 0..{n - 1}")
    return v


def _time_field(e: dict, key: str, i: int, where: str) -> float:
    v = e[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise FileError(f"{where}: events[{i}].{key} must be a finite number (seconds), "
                        f"got {v!r}")
    if abs(v) > MAX_TIME:  # sums of such times overflow to infinity
        raise FileError(f"{where}: events[{i}].{key} is {v:g}; times must be at most "
                        f"{MAX_TIME:g} in size")
    return float(v)


def timeline_from_json(data: object, where: str = "timeline") -> Timeline:
    """A :class:`Timeline` from a decoded JSON object, every field checked (module doc)."""
    if not isinstance(data, dict):
        raise FileError(f"{where}: expected a JSON object with ranks, stages and events, got "
                        f"{type(data).__name__}")
    ranks = _count(data, "ranks", where, MAX_RANKS)
    stages = _count(data, "stages", where, MAX_STAGES)
    if stages < ranks:
        raise FileError(f"{where}: 'stages' is {stages}, fewer than 'ranks' {ranks}; every "
                        "rank holds at least one stage")
    micro = _count(data, "microbatches", where, MAX_MICROBATCHES, required=False)
    raw = data.get("events")
    if not isinstance(raw, list):
        raise FileError(f"{where}: 'events' must be a list of events, got "
                        f"{type(raw).__name__}" + ("" if "events" in data else " (missing)"))
    if not raw:
        raise FileError(f"{where}: 'events' is empty; a timeline needs at least one event")
    if len(raw) > MAX_EVENTS:
        raise FileError(f"{where}: {len(raw):,} events, over the limit of {MAX_EVENTS:,}")
    events: list[Event] = []
    stage_to_rank: dict[int, int] = {}
    top_mb = micro if micro is not None else MAX_MICROBATCHES
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise FileError(f"{where}: events[{i}] must be an object, got {type(e).__name__}")
        missing = [k for k in ("rank", "stage", "kind", "microbatch", "start", "end")
                   if k not in e]
        if missing:
            raise FileError(f"{where}: events[{i}] lacks {', '.join(missing)}")
        rank = _int_field(e, "rank", i, where, ranks, "ranks")
        stage = _int_field(e, "stage", i, where, stages, "stages")
        mb = _int_field(e, "microbatch", i, where, top_mb, "microbatches")
        kind = e["kind"]
        if kind not in KINDS:
            raise FileError(f"{where}: events[{i}].kind is {kind!r}; valid are "
                            f"{', '.join(KINDS)}")
        start = _time_field(e, "start", i, where)
        end = _time_field(e, "end", i, where)
        if end < start:
            raise FileError(f"{where}: events[{i}] ends at {end!r} before it starts at "
                            f"{start!r}")
        if stage_to_rank.setdefault(stage, rank) != rank:
            raise FileError(f"{where}: events[{i}] puts stage {stage} on rank {rank}, but an "
                            f"earlier event has it on rank {stage_to_rank[stage]}")
        events.append(Event(rank, stage, kind, mb, start, end))
    if len(stage_to_rank) != stages:
        absent = [s for s in range(stages) if s not in stage_to_rank]
        raise FileError(f"{where}: 'stages' is {stages} but no event runs stage {absent[0]}"
                        + (f" (nor {len(absent) - 1} other stages)" if len(absent) > 1 else "")
                        + "; every stage needs events")
    placement = [stage_to_rank[s] for s in range(stages)]
    schedule = data.get("schedule", "measured")
    source = data.get("source", "measured")
    return Timeline.from_events(
        events, schedule=str(schedule)[:100], num_ranks=ranks, num_stages=stages,
        num_microbatches=micro if micro is not None else 1 + max(e.microbatch for e in events),
        stage_to_rank=placement, source=str(source)[:100])
