"""``pipebubble run`` without ``--local``: one process per rank, on this machine or torchrun.

The same command line is both the launcher and the worker. Run it plainly and it starts
``--ranks x --dp`` copies of itself (:func:`~pipebubble.runtime.launch.launch`); run it
under ``torchrun`` (or with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set) and it
is one worker. Rank 0 prints the Gantt chart and the summary, or ``--json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from rich.console import Console

from ..render.terminal import gantt, summary_lines, summary_table
from ..schedule import ScheduleError
from ..wire import ORDERINGS, WireDeadlock, lower, run_wire
from .distributed import (
    Cluster,
    DistConfig,
    Env,
    Worker,
    make_schedule_for,
    reference_gradients,
)
from .launch import launch, under_launcher
from .report import grad_diffs, measured_timeline, predict, step_span

# How a worker is started: the same command line, as a module (set by the run command).
WORKER_COMMAND = [sys.executable, "-m", "pipebubble.runtime.dist_cli"]


def add_distributed_flags(p: argparse.ArgumentParser) -> None:
    from ..commands.common import positive_int, time_value

    g = p.add_argument_group("distributed (one process per rank)")
    g.add_argument("--dp", type=positive_int("--dp"), default=1, metavar="D",
                   help="data-parallel replicas of the pipeline: P x D processes (1)")
    g.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="torch.distributed backend (gloo: CPU)")
    g.add_argument("--p2p", choices=ORDERINGS, default="batched",
                   help="how each rank posts its sends and receives (batched)")
    g.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="unmeasured steps before the measured ones (1)")
    g.add_argument("--repeat", type=positive_int("--repeat"), default=3, metavar="N",
                   help="measured steps; the fastest is reported (3)")
    g.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="deadlock: stop when no rank progressed for S seconds (30)")
    g.add_argument("--heartbeat-timeout", type=float, default=10.0, metavar="S",
                   help="a rank silent for S seconds is taken as dead (10)")
    g.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    m = p.add_argument_group("model")
    m.add_argument("--model", default="mlp", help="mlp, transformer or sleep (mlp)")
    m.add_argument("--layers", type=positive_int("--layers"), default=None,
                   help="layers (default: one per stage, at least 8 for mlp)")
    m.add_argument("--dim", type=positive_int("--dim"), default=None,
                   help="width of the mlp / sleep layers, dim of the transformer")
    m.add_argument("--microbatch-size", type=positive_int("--microbatch-size"), default=4)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--sleep-f", type=time_value("--sleep-f"), default=0.01, metavar="S",
                   help="sleep model: forward seconds per layer (scalar or per-layer list)")
    m.add_argument("--sleep-b", type=time_value("--sleep-b"), default=0.02, metavar="S",
                   help="sleep model: full backward seconds per layer (I + W)")
    m.add_argument("--sleep-w", type=time_value("--sleep-w"), default=0.01, metavar="S",
                   help="sleep model: weight-gradient seconds per layer")


def config_from_args(args: argparse.Namespace) -> DistConfig:
    schedule = make_schedule_for(DistConfig(args.schedule, args.ranks, args.microbatches,
                                            args.chunks))
    stages = schedule.num_stages
    margs: dict = {}
    if args.model == "sleep":
        margs = {"layers": args.layers or stages, "f": args.sleep_f, "b": args.sleep_b,
                 "w": args.sleep_w}
        if args.dim:
            margs["width"] = args.dim
    elif args.model == "mlp":
        margs = {"layers": args.layers or max(8, stages)}
        if args.dim:
            margs["width"] = args.dim
    elif args.model == "transformer":
        margs = {"layers": args.layers or max(2, stages - 2)}
        if args.dim:
            margs["dim"] = args.dim
    else:
        raise ValueError(f"unknown model {args.model!r}; valid are mlp, transformer, sleep")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.timeout <= 0 or args.heartbeat_timeout <= 0:
        raise ValueError("--timeout and --heartbeat-timeout must be > 0 seconds")
    return DistConfig(
        schedule=args.schedule, ranks=args.ranks, microbatches=args.microbatches,
        chunks=args.chunks, dp=args.dp, backend=args.backend, p2p=args.p2p, model=args.model,
        model_args=margs, microbatch_size=args.microbatch_size, warmup=args.warmup,
        repeat=args.repeat,
        check=args.check, seed=args.seed, stall_timeout=args.timeout,
        heartbeat_timeout=args.heartbeat_timeout, fault=args.inject_fault,
    )


def run_distributed(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """The handler: launch the workers, or be one."""
    cfg = config_from_args(args)
    if under_launcher():
        rc = worker_main(cfg, json_out=args.json, width=getattr(args, "width", None))
        # Skip the interpreter's teardown (over a second for torch and gloo): everything
        # is reported and the process group is closed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    schedule = make_schedule_for(cfg)
    try:
        run_wire(lower(schedule, cfg.p2p), blocking=True)
    except WireDeadlock as exc:
        sys.stderr.write(
            f"pipebubble: warning: with --p2p {cfg.p2p} the wire simulator predicts a "
            f"{exc}; running anyway: the watchdog stops it after {cfg.stall_timeout:g} s\n"
        )
    argv = sys.argv[1:] if argv is None else argv
    return launch([*WORKER_COMMAND, *argv], cfg.world_size, p2p=cfg.p2p)


def worker_main(cfg: DistConfig, json_out: bool = False, width: int | None = None) -> int:
    env = Env.from_environ()
    cluster = None
    try:
        cluster = Cluster(env, cfg.backend, cfg.stall_timeout, cfg.heartbeat_timeout, cfg.p2p)
        worker = Worker(cfg, cluster)
        results, best = None, float("inf")
        for i in range(cfg.warmup + cfg.repeat):
            got = worker.step(i, gather=i >= cfg.warmup)
            if got is not None:  # rank 0: keep the fastest measured step
                t = step_span(got)
                if t < best:
                    results, best = got, t
        if env.rank == 0:
            worker.watchdog.at("rank 0: reference gradients and report", False)
            out = summarize(cfg, worker, results)
            if json_out:
                from ..commands.common import print_json

                print_json(out["json"])
            else:
                print_report(out, width)
        cluster.close()
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure must reach the other ranks
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if cluster is None:
            sys.stderr.write(f"pipebubble: rank {env.rank}: {msg}\n")
            traceback.print_exc(limit=3)
            return 1
        cluster.watchdog.fail(msg, peer_error=_looks_like_peer(exc))
        return 1


def _looks_like_peer(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Connection reset",
                                   "Broken pipe", "Timed out", "timed out"))


def summarize(cfg: DistConfig, worker: Worker, results: list) -> dict:
    schedule = worker.schedule
    timeline, align = measured_timeline(schedule, results)
    allreduce: dict[int, float] = {}
    for r in results:
        if r.replica == 0:
            allreduce.update(r.allreduce)
    loss = sum(v for r in results for v in r.losses.values())
    pred = predict(schedule, timeline, allreduce, cfg.dp)
    data = timeline.summary()
    data["closed_form_bubble"] = None
    data["events"] = timeline.events_json()
    data["predicted"] = {"step_time": pred["step_time"],
                         "bubble_fraction": pred["bubble_fraction"]}
    data["loss"] = loss
    data.update(dp=cfg.dp, world_size=cfg.world_size, p2p=cfg.p2p, backend=cfg.backend,
                clock_alignment=align.as_dict(),
                allreduce_time=sum(allreduce.values()) if cfg.dp > 1 else 0.0)
    if cfg.dp > 1:
        data["predicted"]["step_time_with_allreduce"] = pred["step_time_with_allreduce"]
    if cfg.check:
        ref_loss, ref = reference_gradients(cfg)
        data.update(grad_diffs(results, ref_loss, ref, loss))
    return {"json": data, "timeline": timeline, "pred": pred, "align": align}


def print_report(out: dict, width: int | None = None) -> None:
    console = Console()
    data, tl = out["json"], out["timeline"]
    title = (f"{tl.schedule}  p={tl.num_ranks} m={tl.num_microbatches} v={tl.chunks}  "
             f"dp={data['dp']}  measured, {data['world_size']} processes ({data['backend']}, "
             f"--p2p {data['p2p']})")
    console.print(gantt(tl, width=width, title=title))
    console.print(summary_table(tl))
    for line in summary_lines(tl):
        console.print(line)
    pred = data["predicted"]
    console.print(f"predicted (calibrated from this run): step time {pred['step_time']:.4g}s, "
                  f"bubble {pred['bubble_fraction']:.2%}")
    if data["dp"] > 1:
        console.print(f"all-reduce {data['allreduce_time']:.4g}s; predicted step with "
                      f"all-reduce {pred['step_time_with_allreduce']:.4g}s")
    a = out["align"]
    skew = ("" if a.barrier_skew is None
            else f" (barrier exits spread {a.barrier_skew * 1e6:.0f} µs)")
    console.print(f"clocks aligned by {a.method}{skew}")
    console.print(f"loss {data['loss']:.6g}")
    if "grad_max_abs_diff" in data:
        console.print(f"check vs unsplit model: max |grad diff| {data['grad_max_abs_diff']:.3g}, "
                      f"|loss diff| {data['loss_abs_diff']:.3g}")


def build_parser() -> argparse.ArgumentParser:
    from ..commands.common import add_schedule_flags

    p = argparse.ArgumentParser(prog="pipebubble run")
    add_schedule_flags(p)
    add_distributed_flags(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--width", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return run_distributed(args, argv)
    except (ScheduleError, ValueError) as exc:
        sys.stderr.write(f"pipebubble: error: {str(exc).splitlines()[0]}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
