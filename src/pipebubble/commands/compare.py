"""``pipebubble compare``: every registered schedule side by side under the same costs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ..costs import CostModel
from ..errors import UserError
from ..ir.schedule import ScheduleError
from ..limits import check_actions
from ..params import parse_size
from ..schedules import get_schedule, lookup, schedule_names
from ..sim.dataparallel import dp_fields
from ..sim.kernel import simulate
from ._flags import arg_type as as_arg_type
from ._flags import render
from .common import (
    add_cost_flags,
    add_figure_flags,
    add_limit_flag,
    check_outputs,
    closed_form_basis,
    closed_form_for,
    costs_from_args,
    memory_fields,
    positive_int,
    print_json,
    span_bubble,
    time_value,
    timeline_json,
    write_figures,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare every schedule for the same p, m and costs")
    p.add_argument("--ranks", "-p", type=positive_int("--ranks"), required=True, metavar="P",
                   help="pipeline ranks (workers, one per device)")
    p.add_argument("--microbatches", "-m", type=positive_int("--microbatches"), required=True,
                   metavar="M", help="microbatches per training step")
    p.add_argument("--chunks", "-v", type=positive_int("--chunks"), default=None, metavar="V",
                   help="chunks for schedules that take a variable number (default: their own)")
    add_limit_flag(p)
    add_cost_flags(p)
    add_profile_flags(p)
    add_dp_flags(p)
    add_figure_flags(p)
    p.add_argument("--json", action="store_true", help="print a JSON list and nothing else")
    p.set_defaults(func=run)


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    """``--profile`` and expert parallelism's ``--ep``/``--ep-bandwidth``: the cost flags
    from a profile (:mod:`pipebubble.plan.moe_costs`)."""
    g = p.add_argument_group("costs from a profile (instead of --f/--b/--w/--a2a-f/--a2a-b)")
    g.add_argument("--profile", default=None, metavar="FILE",
                   help="take the times from a profile (pipebubble profile --out): each "
                   "rank's share is 1/P of its layers' sums, in seconds")
    g.add_argument("--ep", type=positive_int("--ep"), default=1, metavar="N",
                   help="with --profile: expert parallelism over N ranks; each MoE layer's "
                   "four all-to-alls (all_to_all_bytes in an analytic MoE profile) become "
                   "--a2a-f and --a2a-b (1: none)")
    g.add_argument("--ep-bandwidth", type=as_arg_type(lambda t: parse_size(t, "--ep-bandwidth")),
                   default=None,
                   metavar="BYTES/S", help="with --ep > 1: the bytes/s each rank sends its "
                   "all-to-all at (e.g. 50GB for one 400 Gb/s NIC per GPU)")


def costs_with_profile(args: argparse.Namespace, costs: CostModel, ranks: int) -> CostModel:
    """``costs`` with the times of ``--profile`` (none given: unchanged; ``--ep`` without
    it is refused)."""
    if args.profile is None:
        if args.ep != 1 or args.ep_bandwidth is not None:
            raise UserError("--ep and --ep-bandwidth apply with --profile FILE (an MoE profile "
                            "with all_to_all_bytes); without it give --a2a-f and --a2a-b")
        return costs
    given = [flag for flag, key, default in _PROFILE_TIMES if getattr(args, key) != default]
    if given:
        raise UserError(f"--profile gives the times; drop {', '.join(given)} (or the profile)")
    from ..plan.moe_costs import profile_costs
    from ..plan.profile import Profile

    times = profile_costs(Profile.load(args.profile), ranks, args.ep, args.ep_bandwidth)
    return replace(costs, **times)


_PROFILE_TIMES = (("--f", "f", 1.0), ("--b", "b", 2.0), ("--w", "w", 1.0),
                  ("--a2a-f", "a2a_f", 0.0), ("--a2a-b", "a2a_b", 0.0))


def add_dp_flags(p: argparse.ArgumentParser) -> None:
    """``--dp`` and ``--allreduce``: the 2D step time (``sim/dataparallel.py``)."""
    g = p.add_argument_group("pipeline x data parallel")
    g.add_argument("--dp", type=positive_int("--dp"), default=1, metavar="D",
                   help="data-parallel replicas of the pipeline (1)")
    g.add_argument("--allreduce", type=time_value("--allreduce"), default=0.0, metavar="T",
                   help="time to all-reduce one rank-share of the gradients over the D "
                   "replicas (scalar, or one value per stage); added after the rank's last "
                   "action (0)")


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    costs = replace(costs_with_profile(args, costs_from_args(args), args.ranks),
                    allreduce=args.allreduce)
    rows, skipped = [], []
    from ..schedules.auto import LimitTooSmall  # auto's limit below any feasible one

    for name in schedule_names():  # the families, then auto (the fastest order that fits)
        spec = lookup(name)
        chunks = args.chunks if (args.chunks and not spec.fixed_chunks) else None
        if spec.searched:
            chunks = None  # auto picks its placement here
        try:
            check_actions(args.ranks, args.microbatches, chunks, name, args.max_actions)
            schedule = get_schedule(name, args.ranks, args.microbatches, chunks, costs=costs)
            timeline = simulate(schedule, costs)
        except LimitTooSmall:
            raise  # a limit nothing fits: bad input
        except ScheduleError as exc:
            skipped.append((name, render(exc)))
            continue
        rows.append((schedule, timeline, closed_form_for(schedule, costs),
                     closed_form_basis(schedule)))
    if not rows:  # every schedule refused these flags: nothing to show is an error
        reasons = sorted({why for _, why in skipped})
        raise ScheduleError(f"no schedule accepts these flags: {reasons[0]}"
                            + (f" (and {len(reasons) - 1} other reasons)"
                               if len(reasons) > 1 else ""))
    write_figures(args, [t for _, t, _, _ in rows], f"p={args.ranks} m={args.microbatches}")
    if args.json:
        out = [{**timeline_json(t, c, events=False, basis=b), **memory_fields(t, costs)}
               for _, t, c, b in rows]
        if args.dp > 1:
            for obj, (_, t, _, _) in zip(out, rows, strict=True):
                obj.update(dp_fields(t, costs, args.dp))
        print_json(out)
        for name, why in skipped:
            sys.stderr.write(f"pipebubble: skipped {name}: {why}\n")
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"p={args.ranks} m={args.microbatches}", caption=_CAPTION,
                  box=box.SIMPLE_HEAD, caption_justify="left")
    dp_col = (f"step+AR\ndp={args.dp}",) if args.dp > 1 else ()
    fit_col = ("fits",) if costs.memory_limit is not None else ()
    comm = any(t.has_a2a for _, t, _, _ in rows)
    a2a_col = ("a2a\nhidden", "a2a\nexposed") if comm else ()
    for col in ("schedule", "v", "step\ntime", *dp_col, "bubble", "span\nbubble",
                "closed\nform", *a2a_col, "act\nr0", "mem\nr0", "mem\nmax", *fit_col):
        table.add_column(col, justify="right", no_wrap=True)
    for schedule, t, closed, basis in rows:
        stats = t.rank_stats()
        form = "—" if closed is None else f"{closed:.2%}" + ("*" if basis == "span" else " ")
        ar = ((f"{dp_fields(t, costs, args.dp)['step_time_with_allreduce']:.4g}",)
              if dp_col else ())
        table.add_row(
            schedule.name, str(schedule.chunks), f"{t.step_time:.4g}", *ar,
            f"{t.bubble_fraction:.2%}", f"{span_bubble(t):.2%}", form, *_a2a_cells(t, comm),
            str(stats[0].peak_activations), f"{stats[0].peak_memory:.4g}",
            f"{max(s.peak_memory for s in stats):.4g}",
            *(("yes" if memory_fields(t, costs)["fits"] else "[red]no[/red]",) if fit_col else ()),
        )
    console = Console()
    if comm and console.width < 100:  # two more columns: wider than 80, not truncated
        console = Console(width=100)
    console.print(table)
    if comm:
        console.print(_A2A_CAPTION)
    for name, why in skipped:
        console.print(f"[dim]skipped {name}: {why}[/dim]")
    return 0


def _a2a_cells(t, comm: bool) -> tuple[str, ...]:
    """The all-to-all hidden and exposed per rank (the mean over the ranks)."""
    if not comm:
        return ()
    stats = t.rank_stats()
    hidden = sum(s.a2a_hidden or 0.0 for s in stats) / len(stats)
    exposed = sum(s.a2a_exposed or 0.0 for s in stats) / len(stats)
    return f"{hidden:.4g}", f"{exposed:.4g}"


_A2A_CAPTION = (
    "a2a hidden / exposed: expert parallelism's all-to-all per rank (mean over the ranks), "
    "hidden behind the other half's compute in DualPipe's overlapped F&B pairs, or exposed "
    "(every lone F, B or I waits for its own; a pair exposes what outlasts its compute)."
)

_CAPTION = (
    "bubble: idle / (ranks x step). span bubble: the idlest rank's idle time within its own "
    "span (first start to last end) over that span. closed form: the published bubble, over "
    "the step, or * over the span (as ZB-H2 and ZB-V are published); — where its conditions "
    "do not hold. act r0: peak in-flight (stage, microbatch) activations on rank 0. mem: peak "
    "activation memory in rank-shares of M_B. fits: within --memory-limit on every rank. auto: "
    "the fastest order found within the limit (pipebubble.auto_schedule)."
)
