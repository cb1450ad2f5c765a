"""``pipebubble export``: write a generated schedule in another tool's format.

``pipebubble export --schedule zbv --ranks 4 --microbatches 8 --csv zbv.csv`` writes
torch.distributed.pipelining's compute-only CSV (one row per rank, one action per cell),
which ``_PipelineScheduleRuntime._load_csv`` loads and ``pipebubble simulate --csv`` reads
back. ``--csv -`` writes to standard output.
"""

from __future__ import annotations

import argparse
import sys

from ..interop.torch_csv import write_torch_csv
from ..ir.schedule import validate
from .common import add_cost_flags, add_schedule_flags, check_outputs, schedule_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a schedule as torch.distributed.pipelining CSV",
                       description="Generate a schedule and write it as torch.distributed."
                       "pipelining's compute-only CSV (one row per rank, one action per cell).")
    add_schedule_flags(p)
    add_cost_flags(p)  # for --schedule auto
    p.add_argument("--csv", metavar="OUT", required=True, help="output file, or - for stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, "csv")
    schedule = schedule_from_args(args)
    validate(schedule)
    write_torch_csv(schedule, args.csv)
    if args.csv != "-":
        per_chain = (f" ({schedule.num_microbatches} per chain)" if schedule.chains > 1
                     else "")
        sys.stderr.write(f"wrote {args.csv}: {schedule.name}, {schedule.num_ranks} ranks, "
                         f"{schedule.num_stages} stages, {schedule.total_microbatches} "
                         f"microbatches{per_chain}, {schedule.num_actions()} actions\n")
    return 0
