"""``pipebubble simulate``: generate (or read) a schedule, simulate it, draw it.

``--csv FILE`` reads torch.distributed.pipelining's compute-only CSV instead of generating
a schedule (see ``interop/torch_csv.py``); then --schedule, --ranks and --microbatches are
optional (given, --ranks and --microbatches are checked against the file), and every cost
flag and --json apply as usual.
"""

from __future__ import annotations

import argparse
import sys

from ..interop.timeline_json import (
    closed_form_basis,
    closed_form_for,
    memory_fields,
    simulate_checked,
    span_bubble,
    write_simulate_json,
)
from ..limits import MAX_WIDTH, estimate_actions
from ..schedules import search_info
from .common import (
    add_cost_flags,
    add_figure_flags,
    add_schedule_flags,
    check_outputs,
    costs_from_args,
    fit_line,
    int_flag,
    load_schedule,
    write_figures,
)
from .compare import add_profile_flags, costs_with_profile

TIME_UNIT = "in the time unit of --f/--b/--w/--comm; seconds with --profile"
"""What a simulated time means: the cost flags have no unit of their own, so the step time
is in theirs (seconds when they are seconds)."""


KEEP_MEMORY_FROM = 100_000
"""Actions from which ``simulate`` asks malloc to keep the memory it frees
(:func:`keep_freed_memory`)."""


def keep_freed_memory() -> None:
    """Have glibc's malloc serve large blocks from its heap and keep what is freed there,
    instead of mapping fresh memory for each block and handing it back when freed.

    Simulating a million actions makes a few dozen arrays of 1 to 12 MB, most of them
    temporaries; each fresh mapping is zeroed page by page by the kernel when first
    touched (numpy asks for huge pages: 2 MB at a time), which cost this command as much
    system time as the simulation's numpy work took user time. Reused, each page is
    touched fresh once. The command exits soon after, so nothing is lost by keeping.
    Does nothing where malloc is not glibc's."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to load, or not glibc
        return
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)  # keep up to 1 GiB freed at the heap's top
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # blocks up to 32 MB (glibc's most) from the heap


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate one schedule and draw its Gantt chart",
                       description="Simulate one schedule with a cost model; print the Gantt "
                       "chart and a summary, or one JSON object with --json.")
    add_schedule_flags(p, optional=True)
    p.add_argument("--csv", metavar="FILE", help="read the schedule from a torch.distributed."
                   "pipelining compute-only CSV file instead of --schedule")
    add_cost_flags(p)
    add_profile_flags(p)
    add_figure_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.add_argument("--width", type=int_flag("--width", 1, MAX_WIDTH), default=None,
                   metavar="COLS", help="output width in columns, piped or not (default: the "
                   "terminal's; 80 when output is not a terminal)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    if None not in (args.ranks, args.microbatches) and estimate_actions(
            args.ranks, args.microbatches, args.chunks, args.schedule) >= KEEP_MEMORY_FROM:
        keep_freed_memory()  # before the schedule is made: all its arrays reuse memory
    schedule = load_schedule(args)
    costs = costs_with_profile(args, costs_from_args(args), schedule.num_ranks)
    timeline = simulate_checked(schedule, costs)
    closed = None if args.csv else closed_form_for(schedule, costs)
    title = (f"{schedule.name}  p={schedule.num_ranks} m={schedule.total_microbatches} "
             f"v={schedule.chunks}")
    write_figures(args, [timeline], title)
    memory = memory_fields(timeline, costs)
    status = 1 if memory and not memory["fits"] else 0  # ran, but over --memory-limit
    if args.json:
        # the same object as GET /api/simulate (pipebubble explore): interop/timeline_json.py
        write_simulate_json(sys.stdout, schedule, costs, timeline, closed_form=not args.csv)
        return status
    from rich.console import Console

    from ..render.terminal import gantt, summary_lines, summary_table

    # --width is the whole output's width, on a terminal or piped: the chart's time axis
    # gets what the rank labels leave.
    console = Console(width=args.width) if args.width else Console()
    axis = None
    if args.width:
        axis = max(1, args.width - len(f"rank {timeline.num_ranks - 1}") - 2)
    # (a console without colours, e.g. piped, drops the styles: none are made)
    console.print(gantt(timeline, width=axis, title=title,
                        styled=console.color_system is not None))
    console.print(summary_table(timeline))
    info = search_info(schedule)
    bound = (info.lower_bound.value, info.lower_bound.kind) if info else None
    for line in summary_lines(timeline, closed, bound, unit=TIME_UNIT):
        console.print(line)
    if closed_form_basis(schedule) == "span":
        console.print(f"span bubble {span_bubble(timeline):.2%} (the idlest rank's idle time "
                      "within its own first-start-to-last-end span, which is what this "
                      "schedule's closed form measures)")
    if info:
        console.print(info.line())
    line = fit_line(timeline, costs)
    if line:
        console.print(line)
    return status
