"""``pipebubble demo``: the lesson's 4-stage pipeline with trace, Gantt chart and bubble."""

from __future__ import annotations

import argparse

from ..schedules import FIRST
from .common import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the lesson's 4-stage demo: trace, Gantt chart, bubble on the "
                       "cost-model (simulated) and the measured clock")
    p.add_argument("--stages", type=positive_int("--stages", 64), default=4,
                   help="pipeline stages, one per simulated device (4; at most 64)")
    p.add_argument("--microbatches", "-m", type=positive_int("--microbatches", 1024),
                   default=8,
                   help="microbatches per step (8; at most 1024: the demo runs real tensors)")
    p.add_argument("--schedule", default=FIRST,
                   help="a registered schedule name: gpipe (default), 1f1b, ..., or auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo  # torch: only when the demo runs

    run_demo(args.stages, args.microbatches, args.schedule)
    return 0
