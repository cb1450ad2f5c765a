"""``pipebubble simulate``: generate (or read) a schedule, simulate it, draw it."""

from __future__ import annotations

import argparse

from rich.console import Console

from ..render.terminal import gantt, summary_lines, summary_table
from ..schedule import validate
from ..simulate import simulate
from .common import (
    add_cost_flags,
    add_figure_flags,
    add_schedule_flags,
    closed_form_for,
    costs_from_args,
    print_json,
    schedule_from_args,
    timeline_json,
    write_figures,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate one schedule and draw its Gantt chart",
                       description="Simulate one schedule with a cost model; print the Gantt "
                       "chart and a summary, or one JSON object with --json.")
    add_schedule_flags(p)
    add_cost_flags(p)
    add_figure_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.add_argument("--width", type=int, default=None, help="chart width in columns")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    validate(schedule)
    costs = costs_from_args(args)
    timeline = simulate(schedule, costs)
    closed = closed_form_for(schedule, costs)
    title = (f"{schedule.name}  p={schedule.num_ranks} m={schedule.num_microbatches} "
             f"v={schedule.chunks}")
    write_figures(args, [timeline], title)
    if args.json:
        print_json(timeline_json(timeline, closed))
        return 0
    console = Console()
    console.print(gantt(timeline, width=args.width, title=title))
    console.print(summary_table(timeline))
    for line in summary_lines(timeline, closed):
        console.print(line)
    return 0
