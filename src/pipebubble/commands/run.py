"""``pipebubble run``: run a schedule on real tensors, measure it, compare with the simulator.

``--local`` runs every rank in this process (the local executor); without it one process
per rank runs over torch.distributed (``_run_dist.py``). Both share the set-up, the analysis
and the report (``_run_setup.py``). Importing this module loads no torch: only running does.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..limits import MAX_WIDTH, check_threads
from ..sim.kernel import simulate
from ..sim.wire import ORDERINGS
from ._flags import render
from .common import (
    add_cost_flags,
    add_figure_flags,
    add_schedule_flags,
    check_outputs,
    float_flag,
    int_flag,
    positive_int,
    print_json,
    time_value,
    write_figures,
)

if TYPE_CHECKING:
    from ._run_setup import RunReport, RunSetup

_SHARED = ("RunSetup", "RunReport", "build_setup", "analyse", "check_against_unsplit",
           "report_json", "print_report")


def __getattr__(name: str) -> Any:
    """``build_setup``, ``analyse``, ``report_json``... live in ``_run_setup`` (torch)."""
    if name in _SHARED:
        from . import _run_setup

        return getattr(_run_setup, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a schedule on real tensors; measured vs predicted",
        description="Run training steps of a schedule (one by default) on a model, measure every "
        "action's time and activation memory, calibrate the simulator from it and compare.",
    )
    p.add_argument("--local", action="store_true",
                   help="run every rank in this process (the local executor); without it, "
                   "one process per rank (see the distributed flags)")
    add_schedule_flags(p, optional=True)
    p.add_argument("--csv", metavar="FILE",
                   help="run the order in a torch.distributed.pipelining compute-only CSV "
                   "file instead of --schedule (stages and their ranks come from the file; "
                   "-p/-m, when given, are checked against it); every worker reads it")
    add_model_flags(p)
    add_distributed_flags(p)
    p.add_argument("--recompute", action="store_true",
                   help="recompute activations in the backward (F keeps only its input); also "
                   "runs without it and prints the memory saved and the time added")
    p.add_argument("--check", action="store_true",
                   help="also train the unsplit model (tied weights tied) on the same "
                   "batches; print the largest gradient, loss and parameter differences and "
                   "a verdict (exit 1 when one exceeds --check-tol)")
    p.add_argument("--check-tol", type=float_flag("--check-tol", 0, 1, lo_open=True),
                   default=None, metavar="X",
                   help="--check's tolerance on relative differences (float32 1e-5, "
                   "float64 1e-10)")
    p.add_argument("--check-dropout", choices=("keep", "off"), default="keep",
                   help="keep (default): --check refuses a model with dropout or another "
                   "random layer, naming it; off: set every dropout rate to 0 for the run")
    p.add_argument("--warmup", type=int_flag("--warmup", 0, 1000), default=1, metavar="N",
                   help="unmeasured steps before the measured ones (1)")
    p.add_argument("--repeat", type=positive_int("--repeat", 1000), default=None, metavar="N",
                   help="measured runs of each step's pipeline pass (same weights, same "
                   "batch); the fastest is reported, the least disturbed by other work on "
                   "the machine, and --json lists every one as step_times (3 with one "
                   "--steps, else 1)")
    add_training_flags(p)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--threads", type=positive_int("--threads"), default=1, metavar="N",
                   help="torch CPU threads, at most the machine's cores (1: one process runs "
                   "every rank in turn, and "
                   "timings stay steady on a shared machine)")
    p.add_argument("--chart-width", type=int_flag("--chart-width", 1, MAX_WIDTH), default=None,
                   metavar="COLS", help="Gantt chart width in columns")
    add_figure_flags(p)
    add_cost_flags(p)  # what --schedule auto plans for (the model's real times are measured)
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.set_defaults(func=run)


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """``--steps``, ``--optimizer``, ``--lr``, ``--save``, ``--resume``, ``--engine``."""
    g = p.add_argument_group("training (an optimizer step after every pipeline step)")
    g.add_argument("--steps", type=positive_int("--steps", 10**6), default=1, metavar="N",
                   help="training steps, a fresh batch each (from the model's make_batch, "
                   "seeded by --seed and the step) and an optimizer step after each (1)")
    g.add_argument("--data", metavar="FILE", default=None,
                   help="train on FILE's tokens, in order (windows of --seq + 1 tokens): a "
                   ".npy of integer token ids, a raw .bin (--data-dtype), or text tokenized "
                   "with the hf:FOLDER's own tokenizer; a causal LM only")
    g.add_argument("--data-dtype", choices=("uint16", "uint32", "int32", "int64"),
                   default="uint16", help="token dtype of a raw .bin --data file (uint16, "
                   "as nanoGPT writes them)")
    g.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw",
                   help="each rank steps its own stages' parameters (adamw)")
    g.add_argument("--lr", type=float_flag("--lr", 0, 1000), default=None, metavar="LR",
                   help="learning rate (sgd 0.01, adamw 0.001)")
    g.add_argument("--save", dest="save_dir", metavar="DIR", default=None,
                   help="after the last step write a sharded checkpoint to DIR "
                   "(torch.distributed.checkpoint: each rank its own stages, keyed by the "
                   "model's parameter names; plus pipebubble.json), atomically; DIR is "
                   "checked before the first step")
    g.add_argument("--overwrite", action="store_true",
                   help="let --save replace an existing checkpoint (only once the new one "
                   "is written whole)")
    g.add_argument("--resume", metavar="DIR", default=None,
                   help="start from the checkpoint in DIR (any cut or schedule of the same "
                   "model): weights, optimizer state, and the data stream's position")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="parameter and data type (float64: the pipeline and the unsplit "
                   "model agree to ~1e-12 per step, float32 to ~1e-6)")
    g.add_argument("--engine", choices=("pipebubble", "torch"), default="pipebubble",
                   help="pipebubble: our stage interpreter (default); torch: "
                   "torch.distributed.pipelining's PipelineStage and runtime, running the "
                   "same order, measured the same way (one process per rank)")


def add_distributed_flags(p: argparse.ArgumentParser) -> None:
    """Flags of ``pipebubble run`` without ``--local``."""
    g = p.add_argument_group("distributed (without --local: one process per rank)")
    g.add_argument("--dp", type=positive_int("--dp"), default=1, metavar="D",
                   help="data-parallel replicas of the pipeline: ranks x D processes (1)")
    g.add_argument("--ep", type=positive_int("--ep"), default=1, metavar="N",
                   help="expert parallelism: each MoE layer's experts spread over groups of N "
                   "of a stage's --dp replicas, tokens sent to them by all-to-all (1: every "
                   "replica holds every expert); N divides --dp and the experts")
    g.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="torch.distributed backend (gloo: CPU; nccl: one GPU per process)")
    g.add_argument("--p2p", choices=ORDERINGS, default="batched",
                   help="how each rank posts its sends and receives (batched)")
    g.add_argument("--timeout", type=float_flag("--timeout", 0, 86400, lo_open=True),
                   default=30.0, metavar="S",
                   help="deadlock: stop when no rank progressed for S seconds (30; at most "
                   "a day)")
    g.add_argument("--action-timeout", type=float_flag("--action-timeout", 0, 86400 * 7,
                                                       lo_open=True),
                   default=None, metavar="S",
                   help="a rank computing one action for more than S seconds is stopped and "
                   "named as the slow rank (default: 10 x the longest predicted action, at "
                   "least 300); the collective timeout is set above it")
    g.add_argument("--allow-oversubscribe", action="store_true",
                   help="start more than 4 processes per CPU core (refused by default: each "
                   "takes ~70 MB and they only slow each other down)")
    g.add_argument("--heartbeat-timeout", type=float_flag("--heartbeat-timeout", 0, 86400,
                                                          lo_open=True),
                   default=10.0, metavar="S",
                   help="a rank silent for S seconds is taken as dead (10; at most a day)")
    g.add_argument("--inject-fault", type=fault_flag, default=None, help=argparse.SUPPRESS)


def fault_flag(text: str) -> str:
    """The hidden test flag ``--inject-fault kill|raise:RANK:N``, checked before launch."""
    parts = text.split(":")
    if (len(parts) != 3 or parts[0] not in ("kill", "raise") or not parts[1].isdigit()
            or not parts[2].isdigit() or len(parts[1]) > 9 or len(parts[2]) > 9):
        raise argparse.ArgumentTypeError(
            f"--inject-fault must be kill:RANK:N or raise:RANK:N, got {text[:40]!r}")
    return text


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (cut into ranks x chunks stages balanced by the layers' "
                             "cost, or at --boundaries)")
    g.add_argument("--model", default="mlp", metavar="SPEC",
                   help="mlp (default), transformer, moe (mixture-of-experts blocks), or sleep "
                   "(layers sleep --sleep-f/-b/-w); "
                   "path/to/file.py:NAME or package.module:NAME (a ModelSpec, nn.Sequential "
                   "or HuggingFace causal LM); hf:PATH (a local config.json or folder)")
    from ._model import add_spec_flags

    add_spec_flags(g)
    g.add_argument("--layers", type=positive_int("--layers"), default=None, metavar="L",
                   help="MLP blocks or transformer blocks (default: 2 layers per stage; the "
                   "transformer adds an embedding and a head)")
    g.add_argument("--width", "--dim", dest="width", type=positive_int("--width"), default=None,
                   metavar="D", help="MLP width / transformer model dimension (256 / 64)")
    g.add_argument("--heads", type=positive_int("--heads"), default=4, help="transformer (4)")
    g.add_argument("--vocab", type=positive_int("--vocab"), default=4096,
                   help="transformer vocabulary (4096)")
    g.add_argument("--seq", type=positive_int("--seq"), default=32,
                   help="transformer sequence length (32)")
    g.add_argument("--batch", type=positive_int("--batch"), default=None, metavar="B",
                   help="samples per step (default 8 per microbatch)")
    g.add_argument("--boundaries", default=None, metavar="I,J,..",
                   help="first layer of each stage after the first (default: balanced by "
                   "the layers' FLOPs, or the sleep model's seconds; the run prints it)")
    g.add_argument("--seed", type=int_flag("--seed", 0, 2**32 - 1), default=0,
                   help="weights and batch seed, 0..2^32-1 (0)")
    g.add_argument("--sleep-f", type=time_value("--sleep-f"), default=0.01, metavar="S",
                   help="sleep model: forward seconds per layer (or a comma list per layer)")
    g.add_argument("--sleep-b", type=time_value("--sleep-b"), default=0.02, metavar="S",
                   help="sleep model: full backward seconds per layer (I + W)")
    g.add_argument("--sleep-w", type=time_value("--sleep-w"), default=0.01, metavar="S",
                   help="sleep model: weight-gradient seconds per layer")


# ---- the local path ------------------------------------------------------------------
def recompute_trade(setup: RunSetup, plain, rec, rec_report: RunReport) -> dict:
    """Memory saved and time added by recomputation: measured, and predicted by the cost model
    (the plain run's calibrated costs with ``recompute=True``)."""
    from ..plan.calibrate import calibrated_costs, stage_times

    base = calibrated_costs(plain.timeline, False, plain.input_bytes)
    model = simulate(setup.schedule, replace(base, recompute=True))
    plain_bwd = _backward_total(stage_times(plain.timeline))
    rec_bwd = _backward_total(stage_times(rec.timeline))
    f_total = sum(x or 0.0 for x in stage_times(plain.timeline)["F"])
    return {
        "peak_bytes_without": list(plain.peak_bytes),
        "peak_bytes_with": list(rec.peak_bytes),
        "predicted_peak_bytes_with": [s.peak_memory for s in model.rank_stats()],
        "backward_time_without": plain_bwd,
        "backward_time_with": rec_bwd,
        "predicted_backward_time_with": plain_bwd + f_total,
        "step_time_without": plain.timeline.step_time,
        "step_time_with": rec.timeline.step_time,
        "predicted_step_time_with": model.step_time,
    }


def _backward_total(t: dict) -> float:
    """Sum over stages of the median backward time (B, or I + W)."""
    out = 0.0
    for s in range(len(t["F"])):
        if t["I"][s] is not None:
            out += t["I"][s] + (t["W"][s] or 0.0)
        else:
            out += t["B"][s] or 0.0
    return out


def run(args: argparse.Namespace) -> int:
    """``pipebubble run``. The model's own ``print()`` goes to standard error, in this
    process and in every worker: standard output is the report's (``--json``)."""
    from ..usercode import user_prints_to_stderr

    with user_prints_to_stderr():
        return _checked_run(args)


def _checked_run(args: argparse.Namespace) -> int:
    check_outputs(args)
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.repeat is None:  # one step: the fastest of 3; training: every step once
        args.repeat = 3 if args.steps == 1 else 1
    if args.dtype == "float64":  # before any model or batch is built, in every process
        import torch

        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return _run(args)
        finally:  # a caller in this process (a test, a notebook) keeps its default
            torch.set_default_dtype(before)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    if not args.local:  # one process per rank
        from ._run_dist import run_distributed

        return run_distributed(args)
    if args.dp > 1:
        raise UserError(f"--dp {args.dp} needs one process per rank; drop --local")
    if args.backend != "gloo":  # --local has no process group: the flag would do nothing
        raise UserError(f"--backend {args.backend} applies to one process per rank; drop "
                        "--local (or --backend: --local runs on --device)")
    if args.engine == "torch":
        raise UserError("--engine torch runs one process per rank (torch's PipelineStage "
                        "sends over torch.distributed); drop --local")
    import torch

    from ._run_setup import analyse, judge_check, make_run, noise_note, print_report, report_json

    torch.set_num_threads(check_threads(args.threads))
    run = make_run(args)  # set-up and training plan: checkpoint checks before any work
    setup, plan = run.setup, run.plan
    for note in plan.notes:
        sys.stderr.write(f"pipebubble: warning: {note}\n")
    trained = run.train([False, True] if args.recompute else [False])
    *rest, result = trained.best
    plain = rest[0] if rest else None
    report = analyse(setup, result.timeline, trained.losses[-1], result.peak_bytes,
                     args.recompute, result.input_bytes, result.allocator_peak)
    report.losses, report.train = trained.losses, trained.summary
    if args.check:
        report.grad_max_abs_diff, report.loss_abs_diff = trained.grad_diff, trained.loss_diff
        report.reference_losses = trained.reference_losses
        report.param_max_abs_diff = trained.param_diff
        judge_check(report, args, trained.grad_scale, trained.param_scale)
    times = trained.step_times
    if plain is not None:
        report.trade = recompute_trade(setup, plain, result, report)
    report.step_times = list(times[-1])
    from ..limits import machine_load

    note = noise_note(times[-1], report.measured.step_time, report.predicted.step_time,
                      warmup=args.warmup, load=machine_load(), processes=1)
    if note:
        report.notes.append(note)
    from ..usercode import results_to_stdout

    with results_to_stdout():
        write_figures(args, [report.measured, report.predicted], report.title)
        if args.json:
            print_json(report_json(report))
        else:
            from rich.console import Console

            print_report(report, Console(), args.chart_width)
    if plan.save_error:  # the results above stand; the checkpoint did not get written
        sys.stderr.write(f"pipebubble: error: {render(plan.save_error)}\n")
        return 1
    from ._run_setup import diverged_exit

    rc = diverged_exit(report)
    if rc:
        return rc
    return 1 if report.verdict is not None and not report.verdict.passed else 0
