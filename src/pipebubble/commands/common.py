"""Flags and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice

from ..costs import CostModel
from ..ir.schedule import Schedule, ScheduleError
from ..schedules import closed_form_bubble, get_schedule, lookup, schedule_names
from ..timeline import Timeline


def positive_int(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer >= 1, got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def time_value(name: str):
    """A scalar or a comma list of non-negative numbers (one per stage)."""

    def parse(text: str) -> float | list[float]:
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a number or a comma list of numbers, got {text!r}"
            ) from None
        for v in values:
            if not v >= 0 or v == float("inf"):
                raise argparse.ArgumentTypeError(f"{name} must be finite and >= 0, got {v:g}")
        return values[0] if len(values) == 1 else values

    return parse


def add_schedule_flags(p: argparse.ArgumentParser, schedule_required: bool = True,
                       optional: bool = False) -> None:
    """--schedule/--ranks/--microbatches/--chunks. ``optional``: none of them is required
    (a command that can also read its schedule from a file checks them itself)."""
    if schedule_required or optional:
        p.add_argument("--schedule", required=not optional, metavar="NAME",
                       help=f"one of: {', '.join(schedule_names())}, or auto (the fastest order "
                       "found for the cost flags within --memory-limit; case-insensitive)")
    p.add_argument("--ranks", "-p", type=positive_int("--ranks"), required=not optional,
                   metavar="P")
    p.add_argument("--microbatches", "-m", type=positive_int("--microbatches"),
                   required=not optional, metavar="M")
    p.add_argument("--chunks", "-v", type=positive_int("--chunks"), default=None, metavar="V",
                   help="stages per rank (interleaved schedules); default: the schedule's own")


def add_cost_flags(p: argparse.ArgumentParser, limit: bool = True) -> None:
    """--f/--b/--w/--comm/--overlap and the memory flags (``limit``: with --memory-limit)."""
    g = p.add_argument_group("costs (a scalar is one rank's share; a comma list is per stage)")
    g.add_argument("--f", type=time_value("--f"), default=1.0, metavar="T", help="forward (1)")
    g.add_argument("--b", type=time_value("--b"), default=2.0, metavar="T",
                   help="full backward B = I + W (2)")
    g.add_argument("--w", type=time_value("--w"), default=1.0, metavar="T",
                   help="weight-gradient part W of the backward (1)")
    g.add_argument("--comm", type=time_value("--comm"), default=0.0, metavar="T",
                   help="time per hop between ranks (0)")
    g.add_argument("--overlap", type=float, default=1.0, metavar="X",
                   help="overlapped F&B pair time as a fraction of F + B (1.0)")
    add_memory_flags(p, limit)


def add_memory_flags(p: argparse.ArgumentParser, limit: bool = True) -> None:
    """--mem-b, --mem-w (same scalar/list rules as --f) and --memory-limit (per rank)."""
    g = p.add_argument_group("activation memory (a scalar is one rank's share; a comma list is "
                             "per stage; --memory-limit: one value, or one per rank)")
    g.add_argument("--mem-b", type=time_value("--mem-b"), default=1.0, metavar="X",
                   help="activation memory M_B one forward adds (1)")
    g.add_argument("--mem-w", type=time_value("--mem-w"), default=0.0, metavar="X",
                   help="the part M_W of M_B that W still needs after I frees the rest (0)")
    if not limit:
        return
    g.add_argument("--memory-limit", type=time_value("--memory-limit"), default=None,
                   metavar="X", help="the most activation memory a rank may hold, in the units "
                   "of peak memory; a schedule over it is reported as not fitting (none)")


def costs_from_args(args: argparse.Namespace) -> CostModel:
    if isinstance(args.comm, list):
        raise ScheduleError("--comm takes one value (time per hop), got a list")
    return CostModel(f=args.f, b=args.b, w=args.w, comm=args.comm,
                     overlap=getattr(args, "overlap", 1.0),
                     activation_memory=getattr(args, "mem_b", 1.0),
                     weight_memory=getattr(args, "mem_w", 0.0),
                     memory_limit=getattr(args, "memory_limit", None))


def schedule_from_args(args: argparse.Namespace) -> Schedule:
    """The schedule the flags name; ``auto`` searches one for the cost flags (when the
    command has them) under ``--memory-limit``: ``--chunks 1`` loop placement, ``2`` V."""
    if str(args.schedule).lower() == "auto":
        return auto_from_args(args)
    return get_schedule(args.schedule, args.ranks, args.microbatches, args.chunks)


def auto_from_args(args: argparse.Namespace) -> Schedule:
    from ..schedules.auto import auto_schedule

    placement = {None: "any", 1: "loop", 2: "v"}.get(args.chunks)
    if placement is None:
        raise ScheduleError(f"auto takes --chunks 1 (loop placement) or 2 (V placement), "
                            f"got {args.chunks}")
    costs = costs_from_args(args) if hasattr(args, "f") else CostModel()
    return auto_schedule(args.ranks, args.microbatches, costs, placement=placement)


def memory_fields(timeline: Timeline, costs: CostModel) -> dict:
    """JSON fields on the memory limit: none without one; else ``memory_limit``, ``fits``
    and ``over_limit_ranks`` (the ranks whose peak activation memory goes over it)."""
    if costs.memory_limit is None:
        return {}
    over = costs.over_limit([s.peak_memory for s in timeline.rank_stats()])
    return {"memory_limit": costs.memory_limit, "fits": not over, "over_limit_ranks": over}


def fit_line(timeline: Timeline, costs: CostModel) -> str | None:
    """One line saying whether the timeline fits ``--memory-limit`` (None without one)."""
    if costs.memory_limit is None:
        return None
    peaks = [s.peak_memory for s in timeline.rank_stats()]
    limits = costs.rank_limits(len(peaks))
    over = costs.over_limit(peaks)
    if not over:
        return f"fits the memory limit: peak {max(peaks):.4g} <= {max(limits):.4g} on every rank"
    r = over[0]
    return (f"does NOT fit the memory limit: rank {r} peaks at {peaks[r]:.4g} > "
            f"{limits[r]:.4g}" + (f" (and {len(over) - 1} more ranks)" if len(over) > 1 else ""))


def auto_fields(schedule: Schedule) -> dict:
    """``{"auto": {placement, chunks, lower_bound, seconds, ...}}`` for an auto schedule."""
    info = schedule.options.get("auto")
    return {"auto": dict(info)} if info else {}


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


def timeline_json(timeline: Timeline, closed_form: float | None, events: bool = True,
                  basis: str | None = "step") -> dict:
    """The JSON contract shared by every command (see README, "JSON output").

    Beyond the base contract: ``span_bubble_fraction`` (see :func:`span_bubble`) and
    ``closed_form_basis`` (``step`` or ``span``: which of the two fractions the closed form
    is comparable with; null when there is no closed form).
    """
    out = timeline.summary()
    out["closed_form_bubble"] = closed_form
    out["span_bubble_fraction"] = span_bubble(timeline)
    out["closed_form_basis"] = basis if closed_form is not None else None
    if events:
        out["events"] = timeline.events_json()
    return out


def print_json(obj: object) -> None:
    """One JSON document on stdout. ``json.dumps`` runs the C encoder; ``json.dump`` to a
    stream encodes piece by piece in Python, many times slower on large documents."""
    sys.stdout.write(json.dumps(obj))
    sys.stdout.write("\n")


_EVENT = ('{"rank": %d, "stage": %d, "kind": "%s", "microbatch": %d, "start": %r, '
          '"end": %r}')


def print_timeline_json(timeline: Timeline, closed_form: float | None,
                        basis: str | None = "step", extra: dict | None = None) -> None:
    """``print_json(timeline_json(...))`` with the same text, but the events are formatted
    straight from the timeline's columns instead of built as one dict each (a million
    events: about a second instead of tens). ``%r`` of a float is what json writes for it.
    ``extra``: more fields, before ``events`` (``memory_limit``/``fits``, ``auto``)."""
    import math

    extra = extra or {}
    head = json.dumps({**timeline_json(timeline, closed_form, events=False, basis=basis),
                       **extra})
    finite = not len(timeline) or all(math.isfinite(x) for x in (
        min(timeline.start), max(timeline.end)))
    if not finite:  # json spells inf and nan its own way
        print_json({**timeline_json(timeline, closed_form, basis=basis), **extra})
        return
    write = sys.stdout.write
    write(head[:-1] + ', "events": [')
    rows = zip(timeline.rank, timeline.stage, timeline.kind, timeline.microbatch,
               timeline.start, timeline.end, strict=True)
    chunk = 1 << 16
    first = True
    while True:
        part = ", ".join([_EVENT % row for row in islice(rows, chunk)])
        if not part:
            break
        write(part if first else ", " + part)
        first = False
    write("]}\n")


def add_figure_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pictures and traces")
    g.add_argument("--png", metavar="FILE", help="save the Gantt chart as PNG")
    g.add_argument("--svg", metavar="FILE", help="save the Gantt chart as SVG")
    g.add_argument("--memory", action="store_true",
                   help="stack each rank's activation memory under the Gantt chart")
    g.add_argument("--trace", metavar="FILE", help="save a Chrome/Perfetto trace (JSON)")


def write_figures(args: argparse.Namespace, timelines: list[Timeline], title: str) -> None:
    """Write whatever --png/--svg/--trace asked for (render/figures.py does the drawing)."""
    if not any(getattr(args, k, None) for k in ("png", "svg", "trace")):
        return
    from ..render import figures

    figures.write(timelines, title, png=getattr(args, "png", None),
                  svg=getattr(args, "svg", None), trace=getattr(args, "trace", None),
                  memory=bool(getattr(args, "memory", False)))
