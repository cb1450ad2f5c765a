"""Flags and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys

from ..costs import CostModel
from ..interop.timeline_json import (  # noqa: F401  re-exported: the JSON contract
    JSON_DIGITS,
    auto_fields,
    clean_floats,
    closed_form_basis,
    closed_form_for,
    memory_fields,
    span_bubble,
    timeline_json,
)
from ..ir.schedule import Schedule, ScheduleError
from ..limits import MAX_INT_DIGITS, MAX_TIME, MIN_TIME  # noqa: F401  (re-exported)
from ..params import BY_FLAG, parse_float, parse_int, parse_real, parse_times
from ..schedules import get_schedule, lookup, schedule_names
from ..timeline import Timeline
from ._flags import arg_type as as_arg_type


def int_flag(name: str, lo: int | None = 1, hi: int | None = None):
    """An argparse ``type`` for an integer flag in ``lo..hi`` (either end open when None):
    :func:`pipebubble.params.parse_int`, the explorer's reader too.
    ``--width must be >= 1, got 0``, ``--seed must be an integer in 0..4294967295, got 'x'``.
    """
    return as_arg_type(lambda text: parse_int(text, name, lo, hi))


def positive_int(name: str, hi: int | None = None):
    """An integer flag >= 1 (see :func:`int_flag`)."""
    return int_flag(name, 1, hi)


def float_flag(name: str, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False, hi_open: bool = False):
    """An argparse ``type`` for a finite real flag in a range (``lo_open``: ``> lo``):
    :func:`pipebubble.params.parse_float`. ``--overlap must be a number in (0, 1], got 'nan'``.
    """
    return as_arg_type(lambda text: parse_float(text, name, lo, hi, lo_open, hi_open))


def real_flag(name: str):
    """An argparse ``type`` for a real number the planner prices with, in the range
    :data:`pipebubble.params.REALS` gives ``name`` (:func:`pipebubble.params.parse_real`):
    ``--efficiency must be a number in [0.001, 1], got '1e-320'``."""
    return as_arg_type(lambda text: parse_real(text, name))


def time_value(name: str):
    """A scalar or a comma list of times (one per stage): each 0 or in
    [:data:`MIN_TIME`, :data:`MAX_TIME`] (:func:`pipebubble.params.parse_times`)."""
    return as_arg_type(lambda text: parse_times(text, name))


def param_type(flag: str):
    """The argparse ``type`` of a flag in the shared table :data:`pipebubble.params.PARAMS`
    (the explorer reads the same parameter with the same check)."""
    return as_arg_type(BY_FLAG[flag])


def add_schedule_flags(p: argparse.ArgumentParser, schedule_required: bool = True,
                       optional: bool = False) -> None:
    """--schedule/--ranks/--microbatches/--chunks. ``optional``: none of them is required
    (a command that can also read its schedule from a file checks them itself)."""
    if schedule_required or optional:
        p.add_argument("--schedule", required=not optional, metavar="NAME",
                       help=f"one of: {', '.join(schedule_names(searched=False))}, or auto "
                       "(the fastest order "
                       "found for the cost flags within --memory-limit; case-insensitive)")
    p.add_argument("--ranks", "-p", type=param_type("--ranks"), required=not optional,
                   metavar="P", help="pipeline ranks (workers, one per device)")
    p.add_argument("--microbatches", "-m", type=param_type("--microbatches"),
                   required=not optional, metavar="M", help="microbatches per training step")
    p.add_argument("--chunks", "-v", type=param_type("--chunks"), default=None, metavar="V",
                   help="stages per rank (interleaved schedules); default: the schedule's own")
    add_limit_flag(p)


def add_limit_flag(p: argparse.ArgumentParser) -> None:
    """``--max-actions``: the documented work limit (see ``pipebubble.limits``)."""
    from ..limits import HARD_MAX_ACTIONS, MAX_ACTIONS

    p.add_argument("--max-actions", type=positive_int("--max-actions", HARD_MAX_ACTIONS),
                   default=None,
                   metavar="N", help=f"refuse schedules larger than N actions, about "
                   f"3 x ranks x chunks x microbatches ({MAX_ACTIONS:,}; a sweep: 10x that)")


def parse_device(text: str):
    """A ``torch.device`` that can run stages: ``cpu``, ``cuda`` or ``cuda:N`` present here.

    ``meta`` has no data and other backends are not supported; each is one line naming the
    value (torch is imported here, not at module import).
    """
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise ScheduleError(f"unknown --device {text!r}; valid are cpu, cuda, cuda:N") from None
    if device.type == "cpu" and device.index not in (None, 0):
        raise ScheduleError(f"--device {text}: there is one CPU device; use cpu (or cpu:0)")
    if device.type not in ("cpu", "cuda"):
        raise ScheduleError(f"--device {text!r} cannot run a model's stages; valid are cpu, "
                            "cuda, cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ScheduleError(f"--device {text} asked for, but CUDA is not available here; "
                                "use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ScheduleError(f"--device {text}: this machine has "
                                f"{torch.cuda.device_count()} CUDA devices (0.."
                                f"{torch.cuda.device_count() - 1})")
    return device


def add_cost_flags(p: argparse.ArgumentParser, limit: bool = True) -> None:
    """--f/--b/--w/--comm/--overlap and the memory flags (``limit``: with --memory-limit)."""
    g = p.add_argument_group("costs (a scalar is one rank's share; a comma list is per stage)")
    g.add_argument("--f", type=param_type("--f"), default=1.0, metavar="T", help="forward (1)")
    g.add_argument("--b", type=param_type("--b"), default=2.0, metavar="T",
                   help="full backward B = I + W (2)")
    g.add_argument("--w", type=param_type("--w"), default=1.0, metavar="T",
                   help="weight-gradient part W of the backward (1)")
    g.add_argument("--comm", type=param_type("--comm"), default=0.0, metavar="T",
                   help="time per hop between ranks (0)")
    g.add_argument("--overlap", type=param_type("--overlap"), default=1.0,
                   metavar="X",
                   help="overlapped F&B pair time as a fraction of F + B (1.0)")
    g.add_argument("--a2a-f", type=param_type("--a2a-f"), default=0.0, metavar="T",
                   help="the all-to-all (expert parallelism's dispatch and combine) inside one "
                   "F, part of --f: a lone F exposes it, an overlapped F&B pair hides it "
                   "behind the other half's compute (0)")
    g.add_argument("--a2a-b", type=param_type("--a2a-b"), default=0.0, metavar="T",
                   help="the all-to-all inside one B or I, part of --b minus --w (0)")
    add_memory_flags(p, limit)


def add_memory_flags(p: argparse.ArgumentParser, limit: bool = True) -> None:
    """--mem-b, --mem-w (same scalar/list rules as --f) and --memory-limit (per rank)."""
    g = p.add_argument_group("activation memory (a scalar is one rank's share; a comma list is "
                             "per stage; --memory-limit: one value, or one per rank)")
    g.add_argument("--mem-b", type=param_type("--mem-b"), default=1.0, metavar="X",
                   help="activation memory M_B one forward adds (1)")
    g.add_argument("--mem-w", type=param_type("--mem-w"), default=0.0, metavar="X",
                   help="the part M_W of M_B that W still needs after I frees the rest (0)")
    if not limit:
        return
    g.add_argument("--memory-limit", type=param_type("--memory-limit"), default=None,
                   metavar="X", help="the most activation memory a rank may hold, in the units "
                   "of peak memory; a schedule over it is reported as not fitting (none)")
    g.add_argument("--search-seconds", type=float_flag("--search-seconds", 0, 3600,
                                                       lo_open=True),
                   default=None, metavar="S",
                   help="auto: a budget of S seconds of counted work (default: auto's own); "
                   "the same order on any machine, a busy one only takes longer")
    g.add_argument("--search-deadline", type=float_flag("--search-deadline", 0, 86400,
                                                        lo_open=True),
                   default=None, metavar="S",
                   help="auto: also stop after S seconds of wall clock (default: no clock; "
                   "with it the order may depend on the machine's load)")


def costs_from_args(args: argparse.Namespace) -> CostModel:
    if isinstance(args.comm, list):
        raise ScheduleError("--comm takes one value (time per hop), got a list")
    return CostModel(f=args.f, b=args.b, w=args.w, comm=args.comm,
                     overlap=getattr(args, "overlap", 1.0),
                     a2a_f=getattr(args, "a2a_f", 0.0), a2a_b=getattr(args, "a2a_b", 0.0),
                     activation_memory=getattr(args, "mem_b", 1.0),
                     weight_memory=getattr(args, "mem_w", 0.0),
                     memory_limit=getattr(args, "memory_limit", None))


def check_size(args: argparse.Namespace, name: str | None = None) -> None:
    """Refuse a schedule over the ``--max-actions`` limit before generating it."""
    from ..limits import check_actions

    check_actions(args.ranks, args.microbatches, args.chunks,
                  name or getattr(args, "schedule", None), getattr(args, "max_actions", None))


def schedule_from_args(args: argparse.Namespace) -> Schedule:
    """The schedule the flags name; ``auto`` searches one for the cost flags (when the
    command has them) under ``--memory-limit``: ``--chunks 1`` loop placement, ``2`` V."""
    check_size(args)  # over --max-actions: refused before any work
    if not lookup(args.schedule).searched:  # a family's order needs no costs
        return get_schedule(args.schedule, args.ranks, args.microbatches, args.chunks)
    return get_schedule(args.schedule, args.ranks, args.microbatches, args.chunks,
                        **search_options(args))


def search_options(args: argparse.Namespace) -> dict:
    """What a search (``auto``) takes from the flags: the costs (when the command has the
    cost flags), ``--search-seconds`` (its budget of counted work) and ``--search-deadline``
    (a wall-clock limit, only when given)."""
    out: dict = {"costs": costs_from_args(args) if hasattr(args, "f") else None}
    for name in ("search_seconds", "search_deadline"):
        if getattr(args, name, None) is not None:
            out[name] = getattr(args, name)
    return out


def load_schedule(args: argparse.Namespace) -> Schedule:
    """The schedule ``--csv FILE`` names (torch.distributed.pipelining's compute-only CSV:
    the file fixes the stages and their placement; ``--ranks``/``--microbatches``, when
    given, are checked against it), or the one --schedule/--ranks/--microbatches generate.
    Shared by ``simulate`` and ``run`` (whose workers each read the same file)."""
    from ..ir.schedule import validate
    from ..limits import MAX_ACTIONS, LimitError

    csv_path = getattr(args, "csv", None)
    if csv_path:
        from ..interop.torch_csv import read_torch_csv

        if args.chunks is not None:
            raise ScheduleError("--chunks does not apply with --csv (the file fixes the stages)")
        schedule = read_torch_csv(csv_path, name=args.schedule, ranks=args.ranks,
                                  microbatches=args.microbatches)
        limit = args.max_actions or MAX_ACTIONS
        if schedule.num_actions() > limit:
            raise LimitError(f"--csv {csv_path}: {schedule.num_actions():,} actions, over the "
                             f"limit of {limit:,}; raise --max-actions")
        return schedule
    missing = [flag for flag, v in (("--schedule", args.schedule), ("--ranks", args.ranks),
                                    ("--microbatches", args.microbatches)) if v is None]
    if missing:
        raise ScheduleError(f"{', '.join(missing)} required (or --csv FILE)")
    schedule = schedule_from_args(args)
    validate(schedule)
    return schedule


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


def print_json(obj: object) -> None:
    """One JSON document on stdout, floats without binary noise (:func:`clean_floats`).
    ``json.dumps`` runs the C encoder; ``json.dump`` to a stream encodes piece by piece in
    Python, many times slower on large documents."""
    from ..files import json_text

    sys.stdout.write(json_text(clean_floats(obj)))  # never NaN or Infinity
    sys.stdout.write("\n")


def add_figure_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pictures and traces")
    g.add_argument("--png", metavar="FILE", help="save the Gantt chart as PNG")
    g.add_argument("--svg", metavar="FILE", help="save the Gantt chart as SVG")
    g.add_argument("--memory", action="store_true",
                   help="stack each rank's activation memory under the Gantt chart")
    g.add_argument("--trace", metavar="FILE", help="save a Chrome/Perfetto trace (JSON)")


OUTPUT_FLAGS = ("png", "svg", "trace", "out", "save")


def check_outputs(args: argparse.Namespace, *names: str) -> None:
    """Refuse bad output paths (a directory, ``newdir/``, a missing parent...) before any
    work: ``names`` are attributes of ``args`` (default: every output flag it has)."""
    from ..files import check_output_path

    for name in names or OUTPUT_FLAGS:
        path = getattr(args, name, None)
        if path is not None and path != "-":
            check_output_path(path, f"--{name}")


def wrote(path: str) -> None:
    """Tell the user a file was written (on stderr, so ``--json`` output stays clean);
    nothing for ``-`` (standard output)."""
    if path != "-":
        sys.stderr.write(f"wrote {path}\n")


def write_figures(args: argparse.Namespace, timelines: list[Timeline], title: str) -> None:
    """Write whatever --png/--svg/--trace asked for (render/figures.py does the drawing)."""
    if not any(getattr(args, k, None) is not None for k in ("png", "svg", "trace")):
        return
    check_outputs(args, "png", "svg", "trace")
    from ..render import figures

    figures.write(timelines, title, png=getattr(args, "png", None),
                  svg=getattr(args, "svg", None), trace=getattr(args, "trace", None),
                  memory=bool(getattr(args, "memory", False)))
    for k in ("png", "svg", "trace"):
        if getattr(args, k, None):
            wrote(getattr(args, k))
