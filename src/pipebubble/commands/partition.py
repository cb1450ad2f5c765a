"""``pipebubble partition``: cut a profiled model into stages by each method, side by side.

Reads a profile (``pipebubble profile --out``, or any file in the README's format), cuts it
into ranks x chunks stages by ``uniform``, ``params``, ``flops`` and ``time`` (exact
min-max), simulates the schedule for each cut, and prints the stages and the predicted step
time side by side, then each cut in forms to paste (layer lists, Megatron, torchtitan).
With ``--measured TIMELINE.json --current-cut ...`` it rebalances from a measured run.
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from ..cut_rule import Cut
from ..errors import UserError
from ..limits import split_list
from ..plan.balance import METHODS, SIM_METHOD, Options, Plan, balance, rebalance
from ..plan.layouts import layer_lists, megatron_flags, megatron_layout, torchtitan_fqns
from ..plan.partition import PartitionError, Ranges
from ..plan.profile import Profile
from ..schedules import STANDARD, lookup, schedule_names
from ..timeline import Timeline
from ._model import MODEL_HELP, add_spec_flags
from .common import float_flag, int_flag, positive_int, print_json, time_value

if TYPE_CHECKING:
    from rich.table import Table

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "partition", help="cut a profiled model into balanced stages; compare methods",
        description="Cut the layers of a profile into ranks x chunks contiguous stages by each "
        "method (exact min-max of the slowest stage), simulate the schedule for each cut and "
        "print the stages and predicted step times side by side.")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="profile JSON (pipebubble profile --out), or give --model")
    p.add_argument("--model", default=None, metavar="SPEC",
                   help="profile this model first (one microbatch of --batch samples), "
                   "instead of --profile: " + MODEL_HELP)
    add_spec_flags(p)
    p.add_argument("--seq", type=positive_int("--seq"), default=None, metavar="T",
                   help="--model: tokens per sample of a HuggingFace or built-in LM (32)")
    p.add_argument("--batch", type=positive_int("--batch"), default=8, metavar="B",
                   help="--model: samples in the profiled microbatch (8)")
    p.add_argument("--seed", type=int_flag("--seed", 0, 2**32 - 1), default=0,
                   help="--model: weights and batch seed (0)")
    p.add_argument("--ranks", "-p", type=positive_int("--ranks"), required=True, metavar="P",
                   help="pipeline ranks (workers, one per device)")
    p.add_argument("--chunks", "-v", type=positive_int("--chunks"), default=None, metavar="V",
                   help="stages per rank per model copy: P x V stages (the schedule's own: "
                   "1 for 1f1b, 2 for zbv, v-half, v-min, dualpipev, interleaved-1f1b)")
    p.add_argument("--microbatches", "-m", type=positive_int("--microbatches"), default=None,
                   metavar="M", help="microbatches per step, for the simulation (8, or the "
                   "measured run's)")
    p.add_argument("--schedule", default=None, metavar="NAME",
                   help="schedule to simulate each cut with (1f1b, or the measured run's)")
    p.add_argument("--method", default="all", metavar="M",
                   help=f"{'|'.join(METHODS)}|{SIM_METHOD}|all, or a comma list (all)")
    p.add_argument("--top", type=int_flag("--top", 0, 10_000), default=0, metavar="K",
                   help=f"also simulate up to K near-optimal time cuts, keep the fastest step "
                   f"as '{SIM_METHOD}' (0: off)")
    p.add_argument("--memory-cap", type=memory_value, default=None, metavar="BYTES",
                   help="per-stage memory cap: 24GiB, 8e9, or a comma list (one per stage)")
    p.add_argument("--bytes-per-param", type=time_value("--bytes-per-param"), default=16.0,
                   metavar="N", help="weight + gradient + optimizer bytes per parameter (16)")
    p.add_argument("--first-extra", type=time_value("--first-extra"), default=0.0,
                   metavar="T", help="extra seconds on the first stage (0)")
    p.add_argument("--last-extra", type=time_value("--last-extra"), default=0.0, metavar="T",
                   help="extra seconds on the last stage, e.g. a loss not in the profile (0)")
    p.add_argument("--comm", type=time_value("--comm"), default=0.0, metavar="T",
                   help="seconds per hop between ranks, in the simulation (0)")
    p.add_argument("--w-fraction", type=float_flag("--w-fraction", 0, 1), default=0.5,
                   metavar="X",
                   help="W as a fraction of B, for split-backward schedules (0.5)")
    p.add_argument("--measured", metavar="FILE",
                   help="a measured timeline (JSON with events) of --current-cut: rebalance")
    p.add_argument("--current-cut", metavar="RANGES",
                   help="the cut that --measured ran, e.g. 0-2,3-6,7-10,11-13")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list, one object per method, and nothing else")
    p.set_defaults(func=run)


def memory_value(text: str) -> float | list[float]:
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", part)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise argparse.ArgumentTypeError(
                f"--memory-cap must be bytes like 24GiB, 512MiB or 8e9 (a comma list for one "
                f"per stage), got {part.strip()!r}")
        try:
            value = float(m.group(1)) * _UNITS[unit]
        except ValueError:
            raise argparse.ArgumentTypeError(f"--memory-cap: bad number {m.group(1)!r}") from None
        if not 0 < value <= 1e18:  # an exabyte: beyond it the number means no cap (or inf)
            raise argparse.ArgumentTypeError(
                f"--memory-cap must be a number of bytes in (0, 1e18] (finite), got "
                f"{part.strip()[:40]!r}")
        out.append(value)
    return out[0] if len(out) == 1 else out


def parse_methods(text: str) -> list[str]:
    names = [m.lower() for m in split_list(text, "--method")] if text.strip() else []
    if not names:  # (uniform,,time: an empty item is an error too, from split_list)
        raise UserError(f"--method: no method in {text!r}; valid are "
                         f"{', '.join((*METHODS, SIM_METHOD))} or all")
    if names == ["all"]:
        return list(METHODS)
    for m in names:
        if m not in (*METHODS, SIM_METHOD):
            raise UserError(f"unknown --method {m!r}; valid are "
                             f"{', '.join((*METHODS, SIM_METHOD))} or all")
    return names


def parse_cut(text: str, num_layers: int) -> Ranges:
    """``0-2,3-6,7`` -> [(0, 2), (3, 6), (7, 7)]; must cover every layer once, in order."""
    ranges, expect = [], 0
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", part)
        if not m:
            raise UserError(f"--current-cut: {part.strip()!r} is not a layer range like 3-6")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if a != expect or b < a:
            raise UserError(f"--current-cut: range {a}-{b} should start at layer {expect} and "
                             "not end before it starts (stages are contiguous, in order)")
        ranges.append((a, b))
        expect = b + 1
    if expect != num_layers:
        raise UserError(f"--current-cut covers layers 0-{expect - 1}; the profile has "
                         f"{num_layers} layers (0-{num_layers - 1})")
    return ranges


def load_timeline(path: str) -> Timeline:
    """A timeline from the JSON contract, every field checked (see ``timeline_io``)."""
    from ..timeline_io import load_timeline as load

    return load(path, "--measured")


def profile_of(args: argparse.Namespace) -> Profile:
    """``--profile FILE``, or a fresh measurement of ``--model SPEC`` (one CPU thread)."""
    if (args.profile is None) == (args.model is None):
        raise UserError("give one of --profile FILE (a saved profile) or --model SPEC (profile "
                         "it now)")
    if args.profile is not None:
        from ._model import user_spec_flags_given

        given = user_spec_flags_given(args)
        if given:
            raise UserError(f"{', '.join(given)} apply with --model, not --profile")
        return Profile.load(args.profile)
    from ..models.loader import is_builtin, load_model, parse_model_args
    from ..plan.profile import profile_model

    args_ = parse_model_args(args.model_arg)
    if is_builtin(args.model) and args.seq is not None and args.model in ("transformer", "moe"):
        args_.setdefault("seq", str(args.seq))
    spec = load_model(args.model, args_, seed=args.seed, seq=args.seq,
                      input_shape=args.input_shape, input_dtype=args.input_dtype)
    args.profile = f"measured now from --model {args.model}"
    import sys

    from ..plan.profile import noisy_layers

    prof = profile_model(spec, args.batch, seed=args.seed, warn=False)
    for line in noisy_layers(prof):
        sys.stderr.write(f"pipebubble: warning: {line}\n")
    return prof


def run(args: argparse.Namespace) -> int:
    profile = profile_of(args)
    timeline = None
    if args.measured or args.current_cut:
        if not (args.measured and args.current_cut):
            raise UserError("--measured and --current-cut go together")
        timeline = load_timeline(args.measured)
        if args.microbatches is None:
            args.microbatches = timeline.num_microbatches
        if args.schedule is None and timeline.schedule.lower() in map(str.lower,
                                                                      schedule_names()):
            args.schedule = timeline.schedule
    args.microbatches = args.microbatches or 8
    args.schedule = args.schedule or STANDARD
    if lookup(args.schedule).searched:  # the cut is searched for a fixed order
        from ..ir.schedule import ScheduleError

        raise ScheduleError(f"partition --schedule {args.schedule}: the cut is chosen for a "
                            "fixed order; valid are "
                            f"{', '.join(schedule_names(searched=False))}")
    if not 0 <= args.w_fraction <= 1:
        raise UserError(f"--w-fraction must be in [0, 1], got {args.w_fraction}")
    if isinstance(args.comm, list):
        raise UserError("--comm takes one value (seconds per hop), got a list")
    if args.chunks is None:  # the schedule's own (DualPipe: one stage per rank per copy)
        args.chunks = lookup(args.schedule).chunks
    if args.microbatches is not None:  # each cut's schedule is generated: bounded first
        from ..limits import check_actions

        check_actions(args.ranks, args.microbatches, args.chunks, args.schedule)
    options = Options(
        ranks=args.ranks, chunks=args.chunks, schedule=args.schedule,
        microbatches=args.microbatches, memory_cap=args.memory_cap,
        bytes_per_param=_scalar(args.bytes_per_param, "--bytes-per-param"),
        first_extra=_scalar(args.first_extra, "--first-extra"),
        last_extra=_scalar(args.last_extra, "--last-extra"), comm=args.comm,
        w_fraction=args.w_fraction)
    if args.top < 0:
        raise UserError(f"--top must be >= 0, got {args.top}")
    if timeline is not None:
        plans = _rebalance(profile, options, timeline, args)
    else:
        plans = balance(profile, options, parse_methods(args.method), top=args.top)
    if args.json:
        print_json([p.as_json() for p in plans])
        return 0
    from rich.console import Console

    console = Console()
    o = options
    console.print(f"[bold]{len(profile)} layers -> {o.stages} stages[/bold] ({o.ranks} ranks x "
                  f"{o.chunks} chunks), {o.schedule}, {o.microbatches} microbatches; profile "
                  f"{args.profile} ({profile.metadata.get('device', 'device unknown')})")
    console.print(stages_table(plans))
    console.print(summary_table(plans))
    if timeline is not None:
        before, after = plans
        gain = (1 - after.predicted_step_time / before.predicted_step_time
                if before.predicted_step_time > 0 else 0.0)
        console.print(f"rebalanced from {args.measured}: predicted step "
                      f"{fmt_time(before.predicted_step_time)} -> "
                      f"{fmt_time(after.predicted_step_time)} ({gain:.1%} faster)")
    console.print(default_cut_line(profile, o.stages), highlight=False, soft_wrap=True,
                  markup=False)
    for line in layouts_text(profile, plans):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    return 0


def default_cut_line(profile: Profile, stages: int) -> str:
    """The cut every command takes by default (:mod:`pipebubble.cut_rule`), as a flag."""
    from ..cut_rule import profile_cut

    return (f"default cut (pipebubble.cut_rule, as profile --ranks prints it): "
            f"{profile_cut(profile, stages).describe()}; run --boundaries VALUE runs any "
            "cut below")


def _scalar(value: float | list[float], flag: str) -> float:
    if isinstance(value, list):
        raise UserError(f"{flag} takes one value, got a list")
    return value


def _rebalance(profile: Profile, options: Options, timeline: Timeline,
               args: argparse.Namespace) -> list[Plan]:
    ranges = parse_cut(args.current_cut, len(profile))
    if len(ranges) != options.stages:
        raise UserError(f"--current-cut has {len(ranges)} stages; --ranks x --chunks is "
                         f"{options.stages}")
    from ..plan.balance import make_plan

    current = make_plan(profile, ranges, "current", options, score=False)
    _, before, after = rebalance(profile, current, timeline, top=args.top)
    return [before, after]


# ---- output ---------------------------------------------------------------------------------

def fmt_time(t: float | None) -> str:
    if t is None:
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns" if t else "0"


def fmt_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.4g}"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def stages_table(plans: list[Plan]) -> Table:
    """Rows are stages, one column per method: layers, time, params, memory."""
    from rich.table import Table

    t = Table(title="stages: layers · F+B time · params · memory (weights + in-flight "
              "activations)")
    t.add_column("stage", justify="right")
    t.add_column("rank", justify="right")
    for p in plans:
        t.add_column(p.method, justify="left")
    worst = [p.bottleneck for p in plans]
    for k, st in enumerate(plans[0].stages):
        cells = []
        for p, w in zip(plans, worst, strict=True):
            s = p.stages[k]
            n = s.last_layer - s.first_layer + 1
            layers = f"{s.first_layer}" if n == 1 else f"{s.first_layer}–{s.last_layer}"
            time = fmt_time(s.time)
            if s.time == w:
                time = f"[bold red]{time}[/bold red]"
            cells.append(f"{layers} ({n})  {time}\n{fmt_count(s.params)} · {fmt_bytes(s.memory)}")
        t.add_row(str(k), str(st.rank), *cells)
    return t


def summary_table(plans: list[Plan]) -> Table:
    """Methods side by side: bottleneck, predicted step time, bubble, peak memory."""
    from rich.table import Table

    t = Table(title="predicted by simulation")
    t.add_column("", justify="left")
    for p in plans:
        t.add_column(p.method, justify="right")
    ref = min(p.predicted_step_time for p in plans)
    t.add_row("slowest stage", *[fmt_time(p.bottleneck) for p in plans])
    t.add_row("step time", *[fmt_time(p.predicted_step_time) for p in plans])
    t.add_row("vs fastest", *[f"+{(p.predicted_step_time / ref - 1):.1%}" if ref > 0 else "—"
                              for p in plans])
    t.add_row("bubble", *[f"{p.bubble_fraction:.1%}" for p in plans])
    t.add_row("peak memory (max rank)", *[fmt_bytes(max(p.peak_memory)) for p in plans])
    return t


def layouts_text(profile: Profile, plans: list[Plan]) -> list[str]:
    out = ["", "to paste:"]
    for p in plans:
        out.append(f"{p.method}")
        out.append(f"  layers per stage: {layer_lists(p.ranges)}")
        flag = Cut.of_ranges(p.ranges, p.method).flag
        out.append(f"  pipebubble run: --boundaries {flag}" if flag else
                   "  pipebubble run: one stage (no --boundaries)")
        flags = megatron_flags(profile, p.ranges, p.options.chunks)
        out.append(f"  megatron: --pipeline-model-parallel-layout "
                   f"\"{megatron_layout(profile, p.ranges)}\"")
        if flags:
            out.append(f"  megatron (or, instead of the layout): {flags}")
        out.append(f"  torchtitan 0.2 [parallelism]: {torchtitan_fqns(profile, p.ranges)}")
        head = torchtitan_fqns(profile, p.ranges, head="lm_head")
        if head != torchtitan_fqns(profile, p.ranges):
            out.append(f"  torchtitan 0.3 (head lm_head): {head}")
    return out


__all__ = ["PartitionError", "fmt_bytes", "fmt_count", "fmt_time", "register", "run"]
