"""Check every registered schedule on this machine's backend in one launch.

``python -m pipebubble.runtime.dist.selfcheck --world 4 --layouts 4x1,2x2`` starts 4 processes
once and, for each layout ``P x D`` and each schedule in the registry (and each ``--p2p``
ordering asked for), runs one step of a small MLP and compares every gradient and the loss
with the unsplit model on the whole global batch. Rank 0 prints one JSON object per run:
``{"schedule", "ranks", "dp", "p2p", "chunks", "grad_max_abs_diff", "loss_abs_diff"}``, or
``"skipped"`` with the reason (a schedule that does not exist for that p, an ordering the
wire simulator shows would deadlock). Exit code 1 if any difference exceeds ``--tol``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ...ir.schedule import ScheduleError
from ...schedules import get_schedule, schedule_names
from ...sim.wire import ORDERINGS, WireDeadlock, lower, run_wire
from .worker import Cluster, DistConfig, Env, make_schedule_for
from .launch import launch, under_launcher
from .report import grad_diffs


def plan(layouts: list[tuple[int, int]], orderings: list[str], names: list[str]) -> list:
    """(DistConfig or None, reason) for every layout x schedule x ordering."""
    out = []
    for p, d in layouts:
        for name in names:
            m = 2 * p
            try:
                sched = get_schedule(name, p, m)
            except ScheduleError as exc:
                out.append((None, {"schedule": name, "ranks": p, "dp": d,
                                   "skipped": str(exc)}))
                continue
            for o in orderings:
                try:
                    run_wire(lower(sched, o), blocking=True)
                except WireDeadlock as exc:
                    out.append((None, {"schedule": name, "ranks": p, "dp": d, "p2p": o,
                                       "skipped": f"wire simulator: {exc}"}))
                    continue
                cfg = DistConfig(name, p, m, dp=d, p2p=o, model="mlp",
                                 model_args={"layers": sched.num_stages // sched.chains,
                                             "width": 8},
                                 microbatch_size=2, check=True, stall_timeout=20.0)
                out.append((cfg, {"schedule": name, "ranks": p, "dp": d, "p2p": o,
                                  "chunks": sched.chunks}))
    return out


def worker(args: argparse.Namespace) -> int:
    import torch

    from ..run import Run
    from ..setup import RunConfig

    torch.set_num_threads(1)  # tiny models; several ranks share the cores
    env = Env.from_environ()
    cluster = Cluster(env, "gloo", stall_timeout=20.0, heartbeat_timeout=args.heartbeat)
    bad = 0
    try:
        for cfg, row in plan(args.layouts, args.p2p, args.schedules):
            if cfg is None:
                if env.rank == 0:
                    print(json.dumps(row), flush=True)
                continue
            sched = make_schedule_for(cfg)  # the run, as ``pipebubble run`` sets it up
            run = Run(RunConfig(sched, "mlp", dict(cfg.model_args), seed=cfg.seed,
                                batch=cfg.microbatch_size * sched.total_microbatches,
                                dp=cfg.dp), reference=env.rank == 0)
            x, y = run.batch(0, cfg.dp)
            results = run.worker(cfg, cluster, x, y).step(0)
            if env.rank == 0:
                ref_loss, ref = run.reference_gradients(x, y)
                loss = sum(v for r in results for v in r.losses.values())
                row.update(grad_diffs(results, ref_loss, ref, loss))
                bad += row["grad_max_abs_diff"] > args.tol or row["loss_abs_diff"] > args.tol
                print(json.dumps(row), flush=True)
        cluster.close()
    except Exception as exc:  # noqa: BLE001
        cluster.watchdog.fail(f"{type(exc).__name__}: {exc}")
    return 1 if bad else 0


def _layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        p, _, d = part.partition("x")
        out.append((int(p), int(d or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m pipebubble.runtime.dist.selfcheck")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--layouts", type=_layouts, default=None, help="PxD,... (default: world x 1)")
    ap.add_argument("--schedules", type=lambda t: t.split(","), default=None)
    ap.add_argument("--p2p", type=lambda t: t.split(","), default=["batched"])
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--heartbeat", type=float, default=10.0)
    args = ap.parse_args(argv)
    args.layouts = args.layouts or [(args.world, 1)]
    args.schedules = args.schedules or schedule_names(searched=False)
    for p, d in args.layouts:
        if p * d != args.world:
            ap.error(f"layout {p}x{d} needs {p * d} processes, not --world {args.world}")
    for o in args.p2p:
        if o not in ORDERINGS:
            ap.error(f"unknown ordering {o!r}; valid are {', '.join(ORDERINGS)}")
    if under_launcher():
        rc = worker(args)
        sys.stdout.flush()
        os._exit(rc)
    return launch([sys.executable, "-m", "pipebubble.runtime.dist.selfcheck", *argv], args.world,
                  worker=lambda: worker(args))


if __name__ == "__main__":
    raise SystemExit(main())
