"""``pipebubble run``: run a schedule on real tensors, measure it, compare with the simulator.

``--local`` runs every rank in this process (the local executor). The pieces are split so
that another executor (one process per rank) can reuse them:

- :func:`build_setup` turns the flags into a model cut into stages, a schedule and a batch;
- the executor produces a measured Timeline, the loss, per-rank activation peaks;
- :func:`analyse` calibrates a CostModel from the measurement and simulates it again;
- :func:`print_report` / :func:`report_json` show the result.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass, field, replace

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from ..costs import CostModel
from ..errors import UserError
from ..ir.schedule import Schedule, validate
from ..models import ModelSpec, build_model
from ..render.terminal import gantt, summary_table
from ..sim.kernel import simulate
from ..timeline import Timeline
from .common import (
    add_figure_flags,
    add_schedule_flags,
    closed_form_for,
    positive_int,
    print_json,
    schedule_from_args,
    time_value,
    timeline_json,
    write_figures,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a schedule on real tensors; measured vs predicted",
        description="Run one training step of a schedule on a built-in model, measure every "
        "action's time and activation memory, calibrate the simulator from it and compare.",
    )
    p.add_argument("--local", action="store_true",
                   help="run every rank in this process (the local executor); without it, "
                   "one process per rank (see the distributed flags)")
    add_schedule_flags(p)
    add_model_flags(p)
    from ..runtime.dist.run import add_distributed_flags

    add_distributed_flags(p)
    p.add_argument("--recompute", action="store_true",
                   help="recompute activations in the backward (F keeps only its input); also "
                   "runs without it and prints the memory saved and the time added")
    p.add_argument("--check", action="store_true",
                   help="also run the unsplit model on the whole batch; print the largest "
                   "gradient and loss differences")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="unmeasured steps before the measured ones (1)")
    p.add_argument("--repeat", type=positive_int("--repeat"), default=3, metavar="N",
                   help="measured steps; the fastest is reported, the least disturbed by "
                   "other work on the machine (3)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=positive_int("--threads"), default=1, metavar="N",
                   help="torch CPU threads (1: one process runs every rank in turn, and "
                   "timings stay steady on a shared machine)")
    p.add_argument("--chart-width", type=int, default=None, metavar="COLS",
                   help="Gantt chart width in columns")
    add_figure_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.set_defaults(func=run)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (built-in, cut evenly into ranks x chunks stages)")
    g.add_argument("--model", default="mlp",
                   help="mlp (default), transformer, or sleep (layers sleep --sleep-f/-b/-w)")
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
                   help="first layer of each stage after the first (default: even split)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--sleep-f", type=time_value("--sleep-f"), default=0.01, metavar="S",
                   help="sleep model: forward seconds per layer (or a comma list per layer)")
    g.add_argument("--sleep-b", type=time_value("--sleep-b"), default=0.02, metavar="S",
                   help="sleep model: full backward seconds per layer (I + W)")
    g.add_argument("--sleep-w", type=time_value("--sleep-w"), default=0.01, metavar="S",
                   help="sleep model: weight-gradient seconds per layer")


# ---- set-up ----------------------------------------------------------------------------------
@dataclass
class RunSetup:
    """What a run needs: the schedule, the model cut into stages, one batch."""

    schedule: Schedule
    spec: ModelSpec
    stages: list[nn.Module]
    boundaries: list[int]
    inputs: torch.Tensor
    targets: torch.Tensor
    device: torch.device
    reference: nn.Module | None = None  # the unsplit model, same weights (for --check)
    description: str = ""


def build_setup(args: argparse.Namespace, reference: bool = False) -> RunSetup:
    """Flags -> schedule, model stages, batch. Raises UserError naming a bad value."""
    from ..runtime.stages import check_boundaries, even_boundaries, split_stages

    schedule = schedule_from_args(args)
    validate(schedule)
    # Stages of one model copy (DualPipe's second chain runs a copy; see run_local) and the
    # microbatches of the whole step.
    S, M = schedule.num_stages // schedule.chains, schedule.total_microbatches
    if args.model not in ("mlp", "transformer", "sleep"):
        raise UserError(f"unknown model {args.model!r}; valid are mlp, transformer, sleep")
    if args.model == "sleep":
        layers = args.layers or S
        spec = build_model("sleep", layers=layers, width=args.width or 8, f=args.sleep_f,
                           b=args.sleep_b, w=args.sleep_w, seed=args.seed)
        what = (f"sleep ({layers} layers: F {args.sleep_f} s, B {args.sleep_b} s, "
                f"W {args.sleep_w} s)")
    elif args.model == "mlp":
        layers = args.layers or 2 * S
        spec = build_model("mlp", layers=layers, width=args.width or 256, seed=args.seed)
        what = f"mlp ({layers} blocks, width {args.width or 256})"
    else:
        layers = args.layers or max(1, 2 * S - 2)
        spec = build_model("transformer", layers=layers, dim=args.width or 64, heads=args.heads,
                           vocab=args.vocab, seq=args.seq, seed=args.seed)
        what = (f"transformer (embedding, {layers} blocks, head; dim {args.width or 64}, "
                f"vocab {args.vocab}, seq {args.seq})")
    n = len(spec.layers)
    if args.boundaries:
        try:
            cuts = [int(x) for x in args.boundaries.split(",")]
        except ValueError:
            raise UserError(
                f"--boundaries must be a comma list of layer indices, got {args.boundaries!r}"
            ) from None
        cuts = check_boundaries(cuts, n, S)
    else:
        if n % S:
            extra = " (embedding + blocks + head)" if args.model == "transformer" else ""
            raise UserError(
                f"{n} layers{extra} do not split evenly into {S} stages (ranks x chunks); "
                f"pick --layers so the count is a multiple of {S}, or give --boundaries"
            )
        cuts = even_boundaries(n, S)
    batch = args.batch or 8 * M
    if batch < M:
        raise UserError(f"--batch {batch} is smaller than --microbatches {M}; use at least {M}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but CUDA is not available here; use cpu")
    ref = copy.deepcopy(nn.Sequential(*spec.layers)).to(device) if reference else None
    stages = [s.to(device) for s in split_stages(spec.layers, S, cuts)]
    gen = torch.Generator().manual_seed(args.seed + 1)
    x, y = spec.make_batch(batch, gen)
    return RunSetup(schedule, spec, stages, cuts, x.to(device), y.to(device), device, ref,
                    f"{what}, batch {batch}")


# ---- analysis ------------------------------------------------------------------------------
@dataclass
class RunReport:
    """A measured step next to the calibrated simulator's prediction, and optional extras."""

    schedule: Schedule
    measured: Timeline
    predicted: Timeline
    costs: CostModel
    loss: float
    peak_bytes: list[int]
    allocator_peak: int | None = None
    closed_form: float | None = None
    grad_max_abs_diff: float | None = None
    loss_abs_diff: float | None = None
    trade: dict | None = None
    title: str = ""
    notes: list[str] = field(default_factory=list)


def analyse(setup: RunSetup, measured: Timeline, loss: float, peak_bytes: list[int],
            recompute: bool = False, input_bytes: list[float] | None = None,
            allocator_peak: int | None = None) -> RunReport:
    """Calibrate a CostModel from ``measured``, simulate the schedule with it, wrap it up."""
    from ..runtime.calibrated import predict

    pred = predict(setup.schedule, measured, recompute, input_bytes)
    sc = pred.costs.resolve(setup.schedule.num_stages, setup.schedule.chunks)
    S = setup.schedule.num_stages
    equal = CostModel(f=[sum(sc.f) / S] * S, b=[sum(sc.b) / S] * S, w=[sum(sc.w) / S] * S)
    sched = setup.schedule
    title = (f"{sched.name}  p={sched.num_ranks} m={sched.num_microbatches} v={sched.chunks}"
             f"{'  recompute' if recompute else ''}  —  {setup.description}")
    return RunReport(sched, measured, pred.predicted, pred.costs, loss, list(peak_bytes),
                     allocator_peak, closed_form_for(sched, equal), title=title)


def check_against_unsplit(setup: RunSetup, loss: float) -> tuple[float, float]:
    """(largest |gradient difference|, |loss difference|) vs the unsplit model, whole batch."""
    if setup.reference is None:
        raise ValueError(  # not a user error: a caller forgot reference=True
            "build_setup(reference=True) keeps the unsplit model for the check")
    ref = setup.reference
    ref.zero_grad(set_to_none=True)
    ref_loss = setup.spec.loss_fn(ref(setup.inputs), setup.targets)
    ref_loss.backward()
    worst = 0.0
    pipe = [p for st in setup.stages for p in st.parameters()]
    for a, b in zip(pipe, ref.parameters(), strict=True):
        ga = a.grad if a.grad is not None else torch.zeros_like(a)
        gb = b.grad if b.grad is not None else torch.zeros_like(b)
        worst = max(worst, float((ga - gb).abs().max()))
    return worst, abs(loss - ref_loss.item())


# ---- the local path ------------------------------------------------------------------------
def run_local_steps(setup: RunSetup, recompute: list[bool], warmup: int = 1,
                    repeat: int = 1) -> list:
    """One measured step per entry of ``recompute``: the fastest of ``repeat``.

    The variants take turns (warm-up steps first), so that a busy spell on a shared
    machine slows them alike. Gradients are zeroed before each step, so afterwards they are
    those of one step of the last variant (every step computes the same gradients: the
    weights do not change).
    """
    from ..runtime.local import run_local

    best: list = [None] * len(recompute)
    for i in range(warmup + repeat):
        for k, rec in enumerate(recompute):
            for st in setup.stages:
                st.zero_grad(set_to_none=True)
            result = run_local(setup.schedule, setup.stages, setup.inputs, setup.targets,
                               setup.spec.loss_fn, recompute=rec, device=setup.device)
            if i >= warmup and (best[k] is None
                                or result.timeline.step_time < best[k].timeline.step_time):
                best[k] = result
    return best


def recompute_trade(setup: RunSetup, plain, rec, rec_report: RunReport) -> dict:
    """Memory saved and time added by recomputation: measured, and predicted by the cost model
    (the plain run's calibrated costs with ``recompute=True``)."""
    from ..plan.calibrate import stage_times
    from ..runtime.calibrated import calibrated_costs

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
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if not args.local:  # one process per rank: runtime/dist_cli.py
        from ..runtime.dist.run import run_distributed

        return run_distributed(args)
    if args.dp > 1:
        raise UserError(f"--dp {args.dp} needs one process per rank; drop --local")
    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    torch.set_num_threads(args.threads)
    setup = build_setup(args, reference=args.check)
    variants = [False, True] if args.recompute else [False]
    *rest, result = run_local_steps(setup, variants, args.warmup, args.repeat)
    plain = rest[0] if rest else None
    report = analyse(setup, result.timeline, result.loss, result.peak_bytes, args.recompute,
                     result.input_bytes, result.allocator_peak)
    if args.check:
        report.grad_max_abs_diff, report.loss_abs_diff = check_against_unsplit(setup,
                                                                               result.loss)
    if plain is not None:
        report.trade = recompute_trade(setup, plain, result, report)
    write_figures(args, [report.measured, report.predicted], report.title)
    if args.json:
        print_json(report_json(report))
    else:
        print_report(report, Console(), args.chart_width)
    return 0


# ---- output --------------------------------------------------------------------------------
def report_json(report: RunReport) -> dict:
    """The simulate contract for the measured timeline, plus the prediction and extras."""
    out = timeline_json(report.measured, report.closed_form)
    out["source"] = "measured"
    out["loss"] = report.loss
    out["predicted"] = {
        "step_time": report.predicted.step_time,
        "bubble_fraction": report.predicted.bubble_fraction,
        "peak_memory": [s.peak_memory for s in report.predicted.rank_stats()],
    }
    out["peak_activation_bytes"] = report.peak_bytes
    out["allocator_peak_bytes"] = report.allocator_peak
    if report.grad_max_abs_diff is not None:
        out["grad_max_abs_diff"] = report.grad_max_abs_diff
        out["loss_abs_diff"] = report.loss_abs_diff
    if report.trade is not None:
        out["recompute_trade"] = report.trade
    return out


def print_report(report: RunReport, console: Console, width: int | None = None) -> None:
    m, p = report.measured, report.predicted
    console.print(gantt(m, width=width, title=f"measured: {report.title}"))
    console.print(summary_table(m))
    t = Table(title="measured vs predicted (simulator with costs calibrated from this run)",
              show_edge=False)
    for col in ("", "measured", "predicted", "difference"):
        t.add_column(col, justify="right")
    t.add_row("step time", _ms(m.step_time), _ms(p.step_time), _pct(p.step_time, m.step_time))
    t.add_row("bubble", f"{m.bubble_fraction:.2%}", f"{p.bubble_fraction:.2%}",
              f"{(p.bubble_fraction - m.bubble_fraction) * 100:+.2f} pt")
    t.add_row("lower bound", _ms(m.lower_bound), _ms(p.lower_bound),
              _pct(p.lower_bound, m.lower_bound))
    console.print(t)
    if report.closed_form is not None:
        console.print(f"closed-form bubble for equal stages: {report.closed_form:.2%}")
    mem = Table(title="activation memory held for backward, peak per rank", show_edge=False)
    for col in ("rank", "measured", "predicted", "in microbatches (M_B of its first stage)"):
        mem.add_column(col, justify="right")
    m_b = report.costs.activation_memory
    for r, (peak, ps) in enumerate(zip(report.peak_bytes, p.rank_stats(), strict=True)):
        first = m.stage_to_rank.index(r)
        unit = m_b[first] if isinstance(m_b, list) and m_b[first] else 0
        mem.add_row(str(r), _bytes(peak), _bytes(ps.peak_memory),
                    f"{peak / unit:.2f}" if unit else "—")
    console.print(mem)
    if report.allocator_peak is not None:
        console.print(f"CUDA allocator peak over the step: {_bytes(report.allocator_peak)} "
                      "(the whole device: every rank shares it in one process)")
    console.print(f"loss {report.loss:.6g}")
    if report.grad_max_abs_diff is not None:
        console.print(f"check against the unsplit model on the whole batch: largest gradient "
                      f"difference {report.grad_max_abs_diff:.3g}, loss difference "
                      f"{report.loss_abs_diff:.3g}")
    if report.trade is not None:
        tr = report.trade
        rt = Table(title="activation recomputation: what it saves and what it costs",
                   show_edge=False)
        for col in ("", "without", "with (measured)", "with (cost model)"):
            rt.add_column(col, justify="right")
        for r, (a, b, c) in enumerate(zip(tr["peak_bytes_without"], tr["peak_bytes_with"],
                                          tr["predicted_peak_bytes_with"], strict=True)):
            rt.add_row(f"peak memory, rank {r}", _bytes(a), _bytes(b), _bytes(c))
        rt.add_row("backward (medians summed)", _ms(tr["backward_time_without"]),
                   _ms(tr["backward_time_with"]), _ms(tr["predicted_backward_time_with"]))
        rt.add_row("step time", _ms(tr["step_time_without"]), _ms(tr["step_time_with"]),
                   _ms(tr["predicted_step_time_with"]))
        console.print(rt)
        saved = 1 - sum(tr["peak_bytes_with"]) / sum(tr["peak_bytes_without"])
        first = 1 - tr["peak_bytes_with"][0] / tr["peak_bytes_without"][0]
        added = tr["backward_time_with"] / tr["backward_time_without"] - 1
        model = tr["predicted_backward_time_with"] / tr["backward_time_without"] - 1
        console.print(f"recomputation saves {first:.1%} of rank 0's peak activation memory "
                      f"({saved:.1%} of the peaks summed over ranks) and adds {added:.1%} to "
                      f"the backward time; the cost model (one more forward per backward) "
                      f"says {model:+.1%}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b:+.1%}" if b else "—"


def _bytes(n: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
