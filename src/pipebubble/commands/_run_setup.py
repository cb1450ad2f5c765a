"""What both executors of ``pipebubble run`` share: flags to a run, analysis, report.

- :func:`run_config` turns the flags into a :class:`~pipebubble.runtime.setup.RunConfig`
  and :func:`make_run` into a :class:`~pipebubble.runtime.run.Run` (the runtime owns the
  set-up, the cut, the batches and the training loop);
- the executor (``run --local`` in this process, or one process per rank: ``_run_dist.py``)
  produces a measured Timeline, the loss, per-rank activation peaks;
- :func:`analyse` calibrates a CostModel from the measurement and simulates it again
  (:mod:`pipebubble.plan.calibrate`);
- :func:`print_report` / :func:`report_json` show the result.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from ..costs import CostModel
from ..errors import UserError
from ..ir.schedule import Schedule
from ..limits import check_model_size
from ..render.terminal import gantt, summary_table
from ..runtime.run import Run
from ..runtime.setup import RunConfig, RunSetup, set_up
from ..timeline import Timeline
from .common import closed_form_for, load_schedule, parse_device, timeline_json


# ---- set-up: flags -> RunConfig -> runtime.run ------------------------------------------
def run_config(args: argparse.Namespace, schedule: Schedule) -> RunConfig:
    """The :class:`~pipebubble.runtime.setup.RunConfig` of ``run``'s flags (checked here:
    a flag that would be silently ignored is an error)."""
    from ..models.loader import is_builtin, parse_model_args
    from ._model import check_builtin_flags

    S, M = schedule.num_stages // schedule.chains, schedule.total_microbatches
    user = not is_builtin(args.model)  # --model file.py:NAME, package.module:NAME, hf:PATH
    check_builtin_flags(args, ("layers", "width"))
    seq, heads, vocab = getattr(args, "seq", 32), getattr(args, "heads", 4), \
        getattr(args, "vocab", 4096)
    if not user:
        check_model_size(args.model, args.layers or 2 * S, args.width, vocab, seq,
                         batch=args.batch or 8 * M)
    parse_device(args.device)
    if args.model != "sleep":
        for flag, default in (("sleep_f", 0.01), ("sleep_b", 0.02), ("sleep_w", 0.01)):
            if getattr(args, flag, default) != default:
                raise UserError(f"--{flag.replace('_', '-')} applies to --model sleep only, "
                                 f"not {args.model}")
    if user:
        model_args: dict = parse_model_args(getattr(args, "model_arg", None))
    elif args.model == "sleep":
        model_args = {"layers": args.layers, "width": args.width, "f": args.sleep_f,
                      "b": args.sleep_b, "w": args.sleep_w}
    else:
        model_args = {"layers": args.layers, "width": args.width, "heads": heads,
                      "vocab": vocab}

    def g(name: str, default: object = None):  # a flag this Namespace may lack (tests)
        return getattr(args, name, default)

    return RunConfig(
        schedule, args.model, model_args, seq=seq, input_shape=g("input_shape"),
        input_dtype=g("input_dtype"), boundaries=_boundaries_flag(args.boundaries),
        batch=args.batch, seed=args.seed, data=g("data"), data_dtype=g("data_dtype", "uint16"),
        steps=g("steps", 1), optimizer=g("optimizer", "adamw"), lr=g("lr"),
        save=g("save_dir"),  # not args.save: an output file of check_outputs
        overwrite=g("overwrite", False), resume=g("resume"), dp=g("dp", 1), ep=_ep_flag(args),
        engine=g("engine", "pipebubble"), device=args.device, dtype=g("dtype", "float32"),
        threads=g("threads", 1), warmup=g("warmup", 1), repeat=g("repeat") or 1,
        recompute=g("recompute", False), check=g("check", False), check_tol=g("check_tol"),
        check_dropout=g("check_dropout", "keep"))


def _ep_flag(args: argparse.Namespace) -> int:
    """``--ep N`` spreads experts over ``--dp`` replicas, one process per rank: not
    ``--local``."""
    ep = getattr(args, "ep", 1)
    if ep != 1 and getattr(args, "local", False):
        raise UserError(f"--ep {ep} spreads experts over --dp replicas, one process per rank; "
                        "drop --local")
    return ep


def make_run(args: argparse.Namespace, reference: bool | None = None,
             schedule: Schedule | None = None) -> Run:
    """Flags -> a :class:`~pipebubble.runtime.run.Run` (set-up and training plan checked).
    ``schedule``: one already built from these flags (a forked worker has the launcher's;
    an ``auto`` order need not be searched again on every rank)."""
    if schedule is None:
        schedule = load_schedule(args)  # --csv FILE, or --schedule/--ranks/--microbatches
    return Run(run_config(args, schedule), reference)


def build_setup(args: argparse.Namespace, reference: bool = False,
                schedule: Schedule | None = None) -> RunSetup:
    """Flags -> schedule, model stages, batch (:func:`pipebubble.runtime.setup.set_up`)."""
    if schedule is None:
        schedule = load_schedule(args)
    return set_up(run_config(args, schedule), reference)


def _boundaries_flag(text: str | None) -> list[int] | None:
    """``--boundaries I,J,..`` as layer indices (None: the default cut)."""
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(
            f"--boundaries must be a comma list of layer indices, got {text!r}") from None


def judge_check(report: RunReport, args: argparse.Namespace, grad_scale: float | None,
                param_scale: float | None) -> None:
    """``--check``'s verdict on ``report`` (:func:`pipebubble.runtime.run.check_verdict`)."""
    from ..runtime.run import check_verdict

    report.verdict = check_verdict(
        getattr(args, "dtype", "float32"), getattr(args, "check_tol", None), report.losses,
        report.reference_losses, report.loss_abs_diff, report.grad_max_abs_diff, grad_scale,
        report.param_max_abs_diff, param_scale)


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
    step_times: list[float] = field(default_factory=list)  # every measured step, in order
    # training (--steps): the loss of every step; with --check the unsplit model's, and the
    # largest parameter difference after the last step
    losses: list[float] = field(default_factory=list)
    reference_losses: list[float] | None = None
    param_max_abs_diff: float | None = None
    train: dict | None = None
    engine: str = "pipebubble"
    verdict: object | None = None  # --check's (runtime.check.Verdict)
    boundaries: list[int] = field(default_factory=list)  # the cut (--boundaries reproduces it)
    cut_by: str = "given"  # what chose it (runtime.cut.BY)


def analyse(setup: RunSetup, measured: Timeline, loss: float, peak_bytes: list[int],
            recompute: bool = False, input_bytes: list[float] | None = None,
            allocator_peak: int | None = None) -> RunReport:
    """Calibrate a CostModel from ``measured``, simulate the schedule with it, wrap it up."""
    from ..plan.calibrate import predict

    pred = predict(setup.schedule, measured, recompute, input_bytes)
    sc = pred.costs.resolve(setup.schedule.num_stages, setup.schedule.chunks)
    S = setup.schedule.num_stages
    equal = CostModel(f=[sum(sc.f) / S] * S, b=[sum(sc.b) / S] * S, w=[sum(sc.w) / S] * S)
    sched = setup.schedule
    title = (f"{sched.name}  p={sched.num_ranks} m={sched.total_microbatches} v={sched.chunks}"
             f"{'  recompute' if recompute else ''}  —  {setup.description}  —  {setup.cut}")
    # A CSV order is not its file name's family: no closed form for it.
    closed = None if "csv_columns" in sched.options else closed_form_for(sched, equal)
    return RunReport(sched, measured, pred.predicted, pred.costs, loss, list(peak_bytes),
                     allocator_peak, closed, title=title, boundaries=list(setup.boundaries),
                     cut_by=setup.cut_by)


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


# ---- output --------------------------------------------------------------------------------
def diverged_at(report: RunReport) -> int | None:
    """The first training step whose loss is not a finite number (nan, inf), or None.

    A diverging run (``--lr 1000``) is a failed run, not bad input: its report is still
    printed, every figure kept, the losses that are not numbers shown as ``null`` in
    ``--json`` with ``diverged_at_step``, and the command exits 1.
    """
    first = report.train.get("first_step", 0) if report.train else 0
    for k, value in enumerate(report.losses or [report.loss]):
        if not math.isfinite(value):
            return first + k
    return None


def _number(value: float | None) -> float | None:
    """A figure for ``--json``: a non-finite one (a diverged loss) is ``null``."""
    return value if value is None or math.isfinite(value) else None


def diverged_line(report: RunReport) -> str | None:
    """One line saying where the run diverged (for the table and for stderr), or None."""
    step = diverged_at(report)
    if step is None:
        return None
    first = report.train.get("first_step", 0) if report.train else 0
    losses = report.losses or [report.loss]
    return (f"training diverged: the loss is {losses[step - first]} at step {step} (a "
            "learning rate too large for the model? try a smaller --lr); the run's other "
            "figures are kept")


def report_json(report: RunReport) -> dict:
    """The simulate contract for the measured timeline, plus the prediction and extras.
    A loss that is not a finite number is ``null``, and ``diverged_at_step`` names the first
    such step (:func:`diverged_at`; null when every loss is a number)."""
    out = timeline_json(report.measured, report.closed_form)
    out["source"] = "measured"
    out["loss"] = _number(report.loss)
    out["diverged_at_step"] = diverged_at(report)
    out["predicted"] = {
        "step_time": report.predicted.step_time,
        "bubble_fraction": report.predicted.bubble_fraction,
        "peak_memory": [s.peak_memory for s in report.predicted.rank_stats()],
    }
    out["peak_activation_bytes"] = report.peak_bytes
    out["allocator_peak_bytes"] = report.allocator_peak
    if report.step_times:  # every measured step (--repeat); step_time is the fastest
        out["step_times"] = list(report.step_times)
    if report.grad_max_abs_diff is not None:
        out["grad_max_abs_diff"] = _number(report.grad_max_abs_diff)
        out["loss_abs_diff"] = _number(report.loss_abs_diff)
    if report.trade is not None:
        out["recompute_trade"] = report.trade
    if report.losses:
        out["losses"] = [_number(v) for v in report.losses]
        out["train"] = report.train
    if report.reference_losses is not None:
        out["reference_losses"] = [_number(v) for v in report.reference_losses]
        out["param_max_abs_diff"] = _number(report.param_max_abs_diff)
    out["engine"] = report.engine
    out["boundaries"], out["cut_by"] = list(report.boundaries), report.cut_by
    if report.verdict is not None:
        out["check"] = report.verdict.as_dict()
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
    if len(report.losses) > 1 or report.train and report.train.get("first_step"):
        first = report.train["first_step"] if report.train else 0
        ref = report.reference_losses
        for k, value in enumerate(report.losses):
            line = f"step {first + k}: loss {value:.6g}"
            if ref is not None:
                line += f"   unsplit model {ref[k]:.6g} (difference {abs(value - ref[k]):.3g})"
            console.print(line)
    else:
        console.print(f"loss {report.loss:.6g}")
    if report.train:
        tr = report.train
        console.print(f"trained {tr['steps']} step{'s' if tr['steps'] > 1 else ''} with "
                      f"{tr['optimizer']} (lr {tr['lr']:g})"
                      + (f", resumed from {tr['resumed_from']}" if tr["resumed_from"] else "")
                      + (f", saved to {tr['saved_to']}" if tr["saved_to"] else ""))
    if report.param_max_abs_diff is not None:
        console.print(f"after the last step, the largest parameter difference from the "
                      f"unsplit model trained the same way: {report.param_max_abs_diff:.3g}")
    for note in report.notes:
        console.print(note)
    diverged = diverged_line(report)
    if diverged:
        console.print(diverged)
    if report.grad_max_abs_diff is not None:
        console.print(f"check against the unsplit model on the whole batch: largest gradient "
                      f"difference {report.grad_max_abs_diff:.3g}, loss difference "
                      f"{report.loss_abs_diff:.3g}")
    if report.verdict is not None:
        console.print(report.verdict.line())
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


def noise_note(step_times: list[float], measured: float, predicted: float,
               cause: str | None = None, *, warmup: int | None = None,
               load: float | None = None, processes: int | None = None) -> str | None:
    """Set the measured-vs-predicted gap against the run's own spread over its repeats.

    spread = (slowest - fastest) / fastest of the measured steps (the ``warmup`` cold steps
    are not among them). A gap within the spread is noise (the machine, not the model); a
    larger one is ``cause`` when the caller knows one (a distributed run with more processes
    than cores), else the machine when it was loaded (``load``, the 1-minute load average,
    above the cores, or more ``processes`` than cores), and only then something the cost
    model misses. With ``warmup``, ``load`` or ``processes`` the note states them.

    >>> noise_note([1.0, 1.5], 1.0, 1.2)[:72]  # spread 50%, gap 20%
    'measured vs predicted differ by 20.0%, within the run-to-run spread of 5'
    """
    if len(step_times) < 2 or measured <= 0 or min(step_times) <= 0:
        return None
    from ..limits import available_cores, load_words

    spread = (max(step_times) - min(step_times)) / min(step_times)
    gap = abs(predicted - measured) / measured
    state, busy = "", False
    if warmup is not None or load is not None or processes is not None:
        words = []
        if warmup is not None:
            words.append(f"{warmup} warm-up step(s) excluded")
        if load is not None or processes is not None:
            text, busy = load_words(load, available_cores(), processes or 1, True)
            words.append(text)
        state = f" ({'; '.join(words)})"
    if gap <= spread:
        return (f"measured vs predicted differ by {gap:.1%}, within the run-to-run spread of "
                f"{spread:.1%} over {len(step_times)} steps{state}: noise, not a model error "
                "(more --repeat, --threads 1 or a quieter machine narrow it)"
                + (f"; likely cause: {cause}" if cause else ""))
    blame = (f"likely cause: {cause}" if cause else
             "likely cause: the machine was loaded (see its load above), which the "
             "prediction does not include; rerun on a quieter machine before blaming the "
             "cost model" if busy else "the cost model misses something here")
    return (f"measured vs predicted differ by {gap:.1%}, more than the run-to-run spread of "
            f"{spread:.1%} over {len(step_times)} steps{state}: " + blame)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b:+.1%}" if b else "—"


def _bytes(n: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def diverged_exit(report: RunReport) -> int:
    """The exit code of a run whose report is printed: 1 when the training diverged (a
    failed run, with one line on stderr saying where), else 0."""
    line = diverged_line(report)
    if line is None:
        return 0
    sys.stderr.write(f"pipebubble: error: {line}\n")
    return 1
