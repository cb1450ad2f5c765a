"""``pipebubble wire``: a schedule's SEND/RECV program per rank, and whether it deadlocks.

Lowers the schedule with each P2P ordering (``naive``, ``parity``, ``batched``), simulates
it with blocking sends (a send completes only when its receive is posted, as with gloo) or
buffered ones, and prints each rank's program and the outcome: the step time, or the
deadlock with every rank's stuck operation.
"""

from __future__ import annotations

import argparse

from ..ir.schedule import validate
from ..sim.kernel import simulate
from ..sim.wire import ORDERINGS, WireDeadlock, lower, run_wire
from .common import (
    add_cost_flags,
    add_schedule_flags,
    costs_from_args,
    print_json,
    schedule_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("wire", help="per-rank SEND/RECV programs; which P2P orderings deadlock",
                       description="Lower a schedule to per-rank programs with explicit SEND "
                       "and RECV operations and simulate them with blocking point-to-point "
                       "messages.")
    add_schedule_flags(p)
    add_cost_flags(p)
    p.add_argument("--p2p", choices=(*ORDERINGS, "all"), default="all",
                   help="ordering to show (default: all three, outcome only)")
    p.add_argument("--buffered", action="store_true",
                   help="sends complete at once (buffered) instead of blocking until received")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.set_defaults(func=run)


def outcome(schedule, costs, ordering: str, blocking: bool) -> dict:
    """``{"p2p", "deadlock", "stuck", "step_time", "program"}`` for one ordering."""
    wired = lower(schedule, ordering)
    out: dict = {"p2p": ordering, "program": wired.to_text().splitlines()}
    try:
        res = run_wire(wired, costs, blocking=blocking)
    except WireDeadlock as exc:
        out.update(deadlock=True, step_time=None,
                   stuck={str(r): {"at": a, "waits_for": w} for r, (a, w) in exc.stuck.items()})
    else:
        out.update(deadlock=False, step_time=res.timeline.step_time, stuck={})
    return out


def run(args: argparse.Namespace) -> int:
    schedule = schedule_from_args(args)
    validate(schedule)
    costs = costs_from_args(args)
    orderings = ORDERINGS if args.p2p == "all" else (args.p2p,)
    rows = [outcome(schedule, costs, o, not args.buffered) for o in orderings]
    base = simulate(schedule, costs).step_time
    if args.json:
        print_json({"schedule": schedule.name, "ranks": schedule.num_ranks,
                    "microbatches": schedule.num_microbatches, "blocking": not args.buffered,
                    "compute_only_step_time": base, "orderings": rows})
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    mode = "buffered sends" if args.buffered else "blocking sends (rendezvous)"
    if len(rows) == 1:
        console.print(f"[bold]{schedule.name} p={schedule.num_ranks} "
                      f"m={schedule.num_microbatches}, --p2p {rows[0]['p2p']}[/bold]")
        for r, line in enumerate(rows[0]["program"]):
            console.print(f"rank {r}: {line}", soft_wrap=True)
    table = Table(title=f"{schedule.name} p={schedule.num_ranks} m={schedule.num_microbatches}"
                  f", {mode}; compute-only step time {base:.4g}", show_edge=False)
    for col in ("p2p", "outcome"):
        table.add_column(col)
    for row in rows:
        if row["deadlock"]:
            stuck = "; ".join(f"rank {r} at {v['at']}" for r, v in row["stuck"].items())
            table.add_row(row["p2p"], f"[red]deadlock[/red]: {stuck}")
        else:
            table.add_row(row["p2p"], f"completes, step time {row['step_time']:.4g}")
    console.print(table)
    return 0
