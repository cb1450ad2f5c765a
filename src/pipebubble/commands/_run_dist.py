"""``pipebubble run`` without ``--local``: one process per rank, on this machine or torchrun.

The command-line side of :mod:`pipebubble.runtime.dist` (which knows no flags).

The same command line is both the launcher and the worker. Run it plainly and it forks
``--ranks x --dp`` workers that run :func:`worker_main` with the parsed flags
(:func:`~pipebubble.runtime.dist.launch.launch`); run it
under ``torchrun`` (or with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set) and it
is one worker. Rank 0 prints the Gantt chart and the summary, or ``--json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from dataclasses import replace
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
from rich.console import Console

from ..errors import UserError
from ..ir.schedule import Schedule
from ..limits import check_processes, check_threads, machine_load
from ..runtime.check import max_abs
from ..runtime.dist.launch import launch, pin_sockets, under_launcher
from ..runtime.dist.report import grad_diffs, measured_comm, measured_timeline
from ..runtime.dist.watchdog import DIVERGED, default_action_timeout, publish_failure
from ..runtime.dist.worker import Cluster, DistConfig, Env
from ..runtime.ep import Rows
from ..runtime.failures import preflight_timeout
from ..sim.dataparallel import step_time_with_allreduce
from ..sim.kernel import simulate
from ..sim.wire import WireDeadlock, lower, run_wire
from ..usercode import describe, results_to_stdout, user_prints_to_stderr
from ._flags import render
from ._run_setup import (
    analyse,
    diverged_exit,
    judge_check,
    make_run,
    noise_note,
    print_report,
    report_json,
)
from .common import print_json, write_figures


def check_backend(backend: str) -> None:
    """Refuse, once and before any worker starts, a backend this torch cannot run."""

    if backend == "nccl":
        if not dist.is_nccl_available():
            raise UserError("--backend nccl: this torch build has no NCCL; use --backend gloo")
        if not torch.cuda.is_available():
            raise UserError("--backend nccl needs CUDA GPUs, and none is available here; "
                             "use --backend gloo")
    elif backend == "gloo" and not dist.is_gloo_available():
        raise UserError("--backend gloo: this torch build has no gloo")


def config_from_args(args: argparse.Namespace, schedule: Schedule) -> DistConfig:
    if args.timeout <= 0 or args.heartbeat_timeout <= 0:
        raise UserError("--timeout and --heartbeat-timeout must be > 0 seconds")
    if args.inject_fault:
        fault_rank = int(args.inject_fault.split(":")[1])
        if fault_rank >= schedule.num_ranks * args.dp:
            raise UserError(f"--inject-fault rank {fault_rank}: valid ranks are "
                             f"0..{schedule.num_ranks * args.dp - 1}")
    return DistConfig(
        schedule=schedule.name, ranks=schedule.num_ranks,
        microbatches=schedule.num_microbatches, chunks=schedule.chunks, dp=args.dp,
        backend=args.backend, p2p=args.p2p, model=args.model,
        model_args=dict(a.split("=", 1) for a in getattr(args, "model_arg", None) or ()),
        warmup=args.warmup,
        repeat=args.repeat, check=args.check, seed=args.seed, threads=args.threads,
        stall_timeout=args.timeout, heartbeat_timeout=args.heartbeat_timeout,
        fault=args.inject_fault, csv=getattr(args, "csv", None), ep=getattr(args, "ep", 1),
    )


def run_distributed(args: argparse.Namespace) -> int:
    """``pipebubble run`` without ``--local``: launch the workers, or be one."""
    if under_launcher():
        if os.environ.get("PIPEBUBBLE_LAUNCHER") != "1":
            sys.stderr.write(
                f"pipebubble: RANK={os.environ['RANK']} and WORLD_SIZE="
                f"{os.environ['WORLD_SIZE']} are set in the environment: acting as one worker "
                "of a distributed run (torchrun); unset them to launch the run from here\n")
        rc = worker_main(args)
        # Skip the interpreter's teardown (over a second for torch and gloo): everything
        # is reported and the process group is closed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    check_threads(args.threads)
    check_backend(args.backend)
    # The workers are forked from this process (launch's worker=): it must not start
    # torch's thread pool first, since a forked child would inherit the pool but none of
    # its threads. The launcher's own work (checking the flags) is small.
    torch.set_num_threads(1)
    with preflight_timeout(action_timeout_of(args)):  # a model that never returns: 1 line
        run = make_run(args, reference=False)  # every flag checked before any process starts
    setup = run.setup
    cfg = config_from_args(args, setup.schedule)
    check_processes(cfg.world_size, getattr(args, "allow_oversubscribe", False),
                    f"-p {cfg.ranks} x --dp {cfg.dp}")  # bounded before any process starts
    for note in run.plan.notes:  # the training flags, a --resume checkpoint
        sys.stderr.write(f"pipebubble: warning: {note}\n")
    check_engine_flags(args, setup.schedule)
    try:  # (torch's engine posts its own sends and receives: --p2p does not apply)
        if getattr(args, "engine", "pipebubble") != "torch":
            run_wire(lower(setup.schedule, cfg.p2p), blocking=True)
    except WireDeadlock as exc:
        sys.stderr.write(
            f"pipebubble: warning: with --p2p {cfg.p2p} the wire simulator predicts a "
            f"{exc}; running anyway: the watchdog stops it after {cfg.stall_timeout:g} s\n"
        )
    # no command: each worker is this process, forked, running worker_main with these flags
    # and the schedule built here; rank 0 leaves a failed --check's verdict in a file
    fd, verdict_file = tempfile.mkstemp(prefix="pipebubble-check-")
    os.close(fd)
    os.environ[CHECK_FILE] = verdict_file
    try:
        rc = launch((), cfg.world_size, p2p=cfg.p2p,
                    worker=lambda: worker_main(args, setup.schedule))
        failed = Path(verdict_file).read_text(encoding="utf-8") == "fail"
    finally:
        os.environ.pop(CHECK_FILE, None)
        os.unlink(verdict_file)
    return 1 if rc == 0 and failed else rc


CHECK_FILE = "PIPEBUBBLE_CHECK_VERDICT"
"""The environment variable naming the file where rank 0 writes ``fail`` when ``--check``'s
verdict fails: every rank then ends normally (exit 0, no rank is reported as crashed) and
the launcher exits 1."""


def check_exit(failed: bool) -> int:
    """A worker's exit code once the run is complete: 0, or on rank 0 for a failed
    ``--check`` 1 (under torchrun) or 0 with the verdict left to our launcher."""
    if not failed:
        return 0
    path = os.environ.get(CHECK_FILE)
    if path and os.environ.get("PIPEBUBBLE_LAUNCHER") == "1":
        Path(path).write_text("fail", encoding="utf-8")
        return 0
    return 1


def worker_main(args: argparse.Namespace, schedule: Schedule | None = None) -> int:
    """One rank: build the model (and, under torchrun, the schedule) from the flags, train
    the steps, and on rank 0 report. The model's ``print()`` goes to stderr in every rank
    (standard output is rank 0's report)."""
    with user_prints_to_stderr():
        return _worker_main(args, schedule)


def _worker_main(args: argparse.Namespace, schedule: Schedule | None = None) -> int:
    env = Env.from_environ()
    cluster = None
    torch.set_num_threads(args.threads)
    if where := pin_sockets(env.master_addr, env.rank, int(os.environ.get("LOCAL_RANK", 0))):
        sys.stderr.write(where + "\n")  # multi-node: say which interface is exposed
    if schedule is None and _searched(args):  # auto under torchrun: rank 0 searches
        from ..runtime.dist.agree import agreed_schedule
        from .common import load_schedule

        cluster = Cluster(env, args.backend, args.timeout, args.heartbeat_timeout, args.p2p,
                          action_timeout=action_timeout_of(args))
        schedule = agreed_schedule(cluster.store, env.rank, lambda: load_schedule(args))
    # Bad input (flags, a --resume checkpoint, a model whose first call fails on this rank)
    # ends every rank alike, before any process group: one line, exit 2 (the launcher then
    # stops the other ranks). Under our launcher the flags were checked before the fork.
    try:
        with preflight_timeout(action_timeout_of(args), "on this rank"):
            run = make_run(args, reference=args.check and env.rank == 0, schedule=schedule)
        setup, plan = run.setup, run.plan
        cfg = config_from_args(args, setup.schedule)
        check_engine_flags(args, setup.schedule)
        if schedule is None and env.rank == 0:  # under torchrun: no launcher said it
            for note in plan.notes:
                sys.stderr.write(f"pipebubble: warning: {note}\n")
    except UserError as exc:
        sys.stderr.write(f"pipebubble: error: rank {env.rank}: {render(exc)}\n")
        return 2  # (the other ranks' heartbeat watchdogs see this one gone)
    try:
        x, y = run.batch(plan.start, cfg.dp)
        if cluster is None:
            cluster = Cluster(env, cfg.backend, cfg.stall_timeout, cfg.heartbeat_timeout,
                              cfg.p2p, action_timeout=action_timeout_of(args))
        worker = run.worker(cfg, cluster, x, y)
        trained = run.train_ranks(worker, cfg.dp, coordinator=env.rank == 0)
        failed, rc = False, 0
        if env.rank == 0:
            worker.watchdog.at("rank 0: reference gradients and report", False)
            losses, last_ref, final = trained.losses, trained.last_reference, trained.final
            report, extra = summarize(args, cfg, run, trained.results, x, y, last_ref, final)
            report.step_times = trained.spans
            here = local_processes(cfg.world_size)
            note = noise_note(trained.spans, report.measured.step_time,
                              report.predicted.step_time,
                              oversubscribed(here, args.threads), warmup=cfg.warmup,
                              load=machine_load(), processes=here)
            if note:  # as run --local says it
                report.notes.append(note)
            report.losses, report.train = losses, trained.summary
            report.loss = losses[-1]
            report.engine = getattr(args, "engine", "pipebubble")
            if trained.reference_losses is not None:
                report.loss_abs_diff = abs(losses[-1] - last_ref[0])
                report.reference_losses = trained.reference_losses
                report.param_max_abs_diff = param_diffs(final, run.reference_stages())
                judge_check(report, args, max_abs(g for gs in last_ref[1].values() for g in gs),
                            max_abs(setup.reference.parameters()))
            _print(args, report, extra)
            if plan.save_error:  # the results above stand; the checkpoint was not written
                sys.stderr.write(f"pipebubble: error: {render(plan.save_error)}\n")
                cluster.close()
                return 1
            failed = report.verdict is not None and not report.verdict.passed
            rc = diverged_exit(report)  # 1: the loss diverged (said once, on stderr)
        cluster.close()
        if rc:  # the launcher exits 1 too, without a line of its own
            publish_failure(cluster.store, DIVERGED + "rank 0: the training diverged")
            return rc
        return check_exit(env.rank == 0 and failed)
    except Exception as exc:  # noqa: BLE001 - every failure must reach the other ranks
        msg = describe(exc)  # one line, never empty ("RuntimeError", not "RuntimeError: ")
        if cluster is None and isinstance(exc, UserError):  # bad input, e.g. a model whose
            # first call fails on this rank: one line; the launcher stops the other ranks
            sys.stderr.write(f"pipebubble: error: rank {env.rank}: {error_line(exc)}\n")
            return 2
        if cluster is None:
            sys.stderr.write(f"pipebubble: rank {env.rank}: {msg}\n")
            traceback.print_exc(limit=3)
            return 1
        if isinstance(exc, UserError):  # the model's code failed, or bad input: one line,
            # said by the first rank that met it; every rank exits 2
            line = error_line(exc)
            cluster.watchdog.fail_user(line if "rank " in line else f"rank {env.rank}: {line}")
            return 2
        cluster.watchdog.fail(msg, peer_error=_looks_like_peer(exc))
        return 1


def error_line(exc: BaseException) -> str:
    """A user error's message, first line (as ``pipebubble.cli`` prints it)."""
    text = render(exc) if isinstance(exc, UserError) else str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def action_timeout_of(args: argparse.Namespace) -> float:
    """``--action-timeout``, or by default 10x the longest action the flags predict (the
    sleep model sleeps what it is told: at most every layer's longest sleep), at least
    :data:`~pipebubble.runtime.dist.watchdog.MIN_ACTION_TIMEOUT`."""
    given = getattr(args, "action_timeout", None)
    if given is not None:
        return given
    predicted = 0.0
    if getattr(args, "model", None) == "sleep":
        flat: list[float] = []
        for k in ("sleep_f", "sleep_b", "sleep_w"):  # a scalar or one time per stage
            v = getattr(args, k, 0.0)
            flat.extend(v if isinstance(v, list) else [v])
        predicted = max(flat, default=0.0) * max(1, getattr(args, "layers", None) or 1)
    return default_action_timeout(predicted)


def _searched(args: argparse.Namespace) -> bool:
    """Whether the flags name a searched schedule (auto) rather than a file or a family."""
    from ..schedules import lookup

    if getattr(args, "csv", None) or not getattr(args, "schedule", None):
        return False
    try:
        return lookup(args.schedule).searched
    except UserError:
        return False  # an unknown name: build_setup says so
def check_engine_flags(args: argparse.Namespace, schedule: Schedule) -> None:
    """``--engine torch``: what torch's runtime cannot run, refused before any process."""
    if getattr(args, "engine", "pipebubble") == "torch":
        from ..runtime.torch_engine import check_engine

        check_engine(schedule, args.recompute)


def param_diffs(results: list, ref_stages: list) -> float:
    """Largest |parameter - reference| after the last step; stage s of a later chain
    (DualPipe's copy) is compared with model stage ``s mod len(ref_stages)``."""
    per = len(ref_stages)
    worst = 0.0
    for r in results:
        for s, params in (r.params or {}).items():
            for a, b in zip(params, ref_stages[s % per].parameters(), strict=True):
                if isinstance(a, Rows):  # an HF fused expert tensor's own rows (--ep)
                    a, b = a.value, a.of(b)
                if a is not None and a.numel():  # None: another rank's expert (--ep)
                    worst = max(worst, float((a - b.detach().cpu()).abs().max()))
    return worst


def local_processes(world_size: int) -> int:
    """Processes of this run on this machine: torchrun's LOCAL_WORLD_SIZE, else all."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(text) if text.isdigit() and int(text) > 0 else world_size


def oversubscribed(processes: int, threads: int = 1) -> str | None:
    """Why a distributed run on one machine is slower than its prediction, when it is: more
    busy threads than CPU cores, so ranks wait for a core (the cost model, calibrated from
    each action's own time, does not see the waiting). None when every thread has a core."""
    from ..limits import available_cores

    cores = available_cores()
    if processes * threads <= cores:
        return None
    return (f"{processes} processes x {threads} thread(s) on {cores} CPU cores: ranks take "
            "turns on the cores, which the prediction does not include (fewer ranks, or a "
            "machine with a core per rank)")


def _looks_like_peer(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Connection reset",
                                   "Broken pipe", "Timed out", "timed out"))


def summarize(args, cfg: DistConfig, run, results: list, x, y, ref_last=None,
              final: list | None = None):
    """Rank 0: the measured timeline, the calibrated prediction (comm and all-reduce
    included), the check; the same report as ``run --local`` plus the distributed extras."""
    setup = run.setup
    schedule = setup.schedule
    timeline, align = measured_timeline(schedule, results)
    mine = [r for r in results if r.replica == 0]
    allreduce: dict[int, float] = {}
    for r in mine:
        allreduce.update(r.allreduce)
    loss = sum(v for r in results for v in r.losses.values())
    peaks = [0] * schedule.num_ranks
    inputs: dict[int, list[int]] = {}
    for r in mine:
        peaks[r.rank] = r.peak_bytes
        for (s, _), n in r.input_bytes.items():
            inputs.setdefault(s, []).append(n)
    input_bytes = [float(median(inputs[s])) if s in inputs else 0.0
                   for s in range(schedule.num_stages)]
    report = analyse(setup, timeline, loss, peaks, args.recompute, input_bytes, None)
    comm = measured_comm(timeline)
    ar = [allreduce.get(s, 0.0) for s in range(schedule.num_stages)]
    report.costs = replace(report.costs, comm=comm, allreduce=ar)
    report.predicted = simulate(schedule, report.costs)
    engine = getattr(args, "engine", "pipebubble")
    via = ("torch's _PipelineScheduleRuntime" if engine == "torch"
           else f"--p2p {cfg.p2p}")
    report.title += (f"  —  {cfg.world_size} processes ({cfg.backend}, {via}"
                     f"{f', dp={cfg.dp}' if cfg.dp > 1 else ''}"
                     f"{f', ep={cfg.ep}' if cfg.ep > 1 else ''})")
    if args.check and setup.reference is not None:
        # the last step's gradients against the unsplit model's on the same batch
        ref_loss, ref = ref_last if ref_last is not None else run.reference_gradients(x, y)
        diffs = grad_diffs(final if final is not None else results, ref_loss, ref, loss)
        report.grad_max_abs_diff = diffs["grad_max_abs_diff"]
        report.loss_abs_diff = diffs["loss_abs_diff"]
    extra = {
        "dp": cfg.dp, "ep": cfg.ep, "world_size": cfg.world_size,
        "p2p": None if engine == "torch" else cfg.p2p, "backend": cfg.backend,
        "clock_alignment": align.as_dict(), "comm": comm,
        "allreduce_time": sum(allreduce.values()) if cfg.dp > 1 else 0.0,
    }
    if cfg.dp > 1:
        extra["step_time_with_allreduce"] = step_time_with_allreduce(
            report.predicted, report.costs, cfg.dp)
    return report, extra


def _print(args, report, extra: dict) -> None:
    with results_to_stdout():  # the report owns standard output, not the model's print()
        _print_report(args, report, extra)


def _print_report(args, report, extra: dict) -> None:
    write_figures(args, [report.measured, report.predicted], report.title)

    if args.json:
        out = report_json(report)
        out.update(extra)
        if "step_time_with_allreduce" in extra:
            out["predicted"]["step_time_with_allreduce"] = extra.pop("step_time_with_allreduce")
            out.pop("step_time_with_allreduce", None)
        print_json(out)
        return
    console = Console()
    print_report(report, console, args.chart_width)
    a = extra["clock_alignment"]
    skew = ("" if a["barrier_skew"] is None
            else f"; the barrier alone would have left {a['barrier_skew'] * 1e6:.0f} µs")
    console.print(f"clocks aligned by {a['method']}{skew}; message delay (calibrated) "
                  f"{extra['comm'] * 1e3:.3f} ms")
    if extra["dp"] > 1:
        console.print(f"gradient all-reduce over {extra['dp']} replicas: "
                      f"{extra['allreduce_time'] * 1e3:.3f} ms (replica 0, summed over its "
                      f"stages); predicted step with all-reduce "
                      f"{extra['step_time_with_allreduce'] * 1e3:.3f} ms")
