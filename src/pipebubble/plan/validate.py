"""Prove a plan by running it: one process per rank over gloo, sleeping the profiled times.

A plan predicts a step for GPUs this machine does not have. What can be checked here is the
part the planner derives: the schedule, the cut and the simulated order of F, I and W on
every rank. :func:`validate` runs each plan with ``pipebubble run --model sleep`` (one
process per pipeline rank and data-parallel replica, ``pp x dp`` in all, over gloo): stage
``s`` sleeps the sum of its layers' profiled F, I (recomputation included) and W, all scaled
by one factor ``scale`` so that the first plan's step takes about ``target`` seconds (sleeping
costs no CPU, so eight ranks run true to time on two cores). The same factor for every plan
keeps their order.

The prediction it is held against is the simulator's for those scaled stage times, with
this machine's own costs of running a schedule instead of the GPUs' P2P and all-reduce
times. They are measured once, before the plans run, by running the first plan with its
times scaled down to :data:`CALIBRATION` of the plan's scale (:func:`calibrate`): ``overhead``
is the median, over that run's actions, of how much longer each took than it sleeps (the
interpreter, autograd, and a sleeping process waking up late on a busy machine: layers that
sleep 0 s, as this used to calibrate with, never show that), added to every F, I, W and B;
``hop`` is the P2P delay per message at which the simulator reproduces that run's step
(bisection; the simulator's step grows with the delay). On a loaded two-core machine a gloo
message between processes takes milliseconds, so without this the prediction would miss by
far more than the schedule does.
The all-reduce of the sleep model's few weights is not part of the measured pipeline step.

With a real model (``plan --validate K --model SPEC``, :func:`validate_on_model`) each plan
runs that model instead (``run --model SPEC --boundaries`` at the plan's cut, microbatch size
and microbatches), at scale 1: the prediction is the simulator's for the profile's own
times, so it is a fair comparison when the profile was measured on this machine
(``pipebubble profile --model SPEC``); the model must have the profile's layers.

A plan runs its schedule by name (``run --schedule NAME``), except an ``auto`` order: it
was searched for the plan's costs and would come out differently if searched again, so its
order is written as torch's compute-only CSV and run as data (``run --csv FILE``: every
process reads the same file; stages and ranks come from it).

The measured step is the **median** of ``repeat`` steps after a warm-up (the fastest is kept
as ``measured_min``): one step that a busy spell on a shared machine slowed, or one that
happened to run undisturbed, moves it no more than the others. The calibration run's step is
its median too. "Within 15 % of the prediction" and "within 5 % of the best measured" are
judged on the medians.

**The verdict.** Each plan that ran passes when its median lands within ``tolerance`` of its
prediction (``|measured / predicted - 1| <= tolerance``; :data:`DEFAULT_TOLERANCE`, 15 %, set
with ``plan --validate-tol``), and fails otherwise or when its run failed (:func:`verdict`).
The plans' **ranking** holds when no two plans swap places by more than the tolerance: a plan
predicted faster than another may measure slower, but by at most ``tolerance`` of the other's
median (:func:`ranking`, which also gives Kendall's tau between the predicted and measured
orders and whether the predicted best measured fastest). ``plan --validate`` exits 1 when a
plan or the ranking fails.

A miss is not blamed on the cost model before the machine: each plan records the 1-minute
load average after its run (``os.getloadavg``) and its processes per CPU core, and
:func:`explain` says "the machine was loaded" (load above the cores, or, for a real model,
more processes than cores) before "the cost model misses something". The spread of a run,
``(slowest - fastest) / fastest`` of its measured steps, leaves out the ``warmup`` cold steps
(:data:`WARMUP`, run but not measured: the first pass pays for imports, allocations and
gloo's first connections); a miss within the spread is noise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from statistics import median

from ..cut_rule import Cut
from ..errors import UserError, param
from ..limits import available_cores, load_words, machine_load
from ..sim.kernel import simulate
from .planner import Plan

WARMUP = 1
"""Unmeasured steps each validated run starts with (``run --warmup``): the cold first pass."""

DEFAULT_TOLERANCE = 0.15
"""``plan --validate-tol``: the relative step-time miss a validated plan may have. The sleep
model's plans landed between -1.5 % and +9.6 % of their predictions at load averages 4 to 6.5
on the project's 2-core machine (README, "Proof by running"); 15 % keeps those passing and
fails a plan whose schedule, cut or calibration is wrong (the first-stage I-in-W bug measured
+33 %)."""


@dataclass(frozen=True)
class Machine:
    """This machine's cost of running a schedule: per action, and per P2P message."""

    overhead: float = 0.0
    hop: float = 0.0
    empty_step: float | None = None  # the calibration run's measured step (median)


@dataclass
class Validation:
    plan: Plan
    scale: float  # seconds slept per second of the plan
    predicted: float  # simulated pipeline step at that scale, seconds
    measured: float | None  # median measured step, seconds (None: the run failed)
    error: str | None = None
    machine: Machine = Machine()
    steps: list[float] = field(default_factory=list)  # every measured step, seconds
    model: str | None = None  # the --model SPEC it ran (None: the sleep workload)
    load: float | None = None  # 1-minute load average right after the run
    cores: int = 1  # CPU cores this process may use
    warmup: int = WARMUP  # cold steps run before the measured ones, not in ``steps``

    @property
    def processes(self) -> int:
        """Processes the run started: one per pipeline rank and data-parallel replica (a
        validated plan has no tensor or context parallelism: every GPU is one process)."""
        return self.plan.gpus

    @property
    def relative_error(self) -> float | None:
        """measured / predicted - 1 on the medians (None: the run failed)."""
        if self.measured is None or not self.predicted > 0:
            return None
        return self.measured / self.predicted - 1

    @property
    def spread(self) -> float | None:
        """(slowest - fastest) / fastest of the measured steps (warm-up excluded)."""
        if len(self.steps) < 2 or min(self.steps) <= 0:
            return None
        return (max(self.steps) - min(self.steps)) / min(self.steps)

    @property
    def measured_min(self) -> float | None:
        """The fastest measured step (seconds, scaled)."""
        return min(self.steps) if self.steps else None

    @property
    def measured_step_time(self) -> float | None:
        """The median measured step in the plan's own time (divided by ``scale``)."""
        return None if self.measured is None else self.measured / self.scale

    @property
    def measured_step_time_min(self) -> float | None:
        """The fastest measured step in the plan's own time."""
        low = self.measured_min
        return None if low is None else low / self.scale

    def as_json(self) -> dict:
        return {"scale": self.scale, "predicted_scaled": self.predicted,
                "measured_scaled": self.measured, "measured_scaled_min": self.measured_min,
                "measured_steps_scaled": list(self.steps), "statistic": "median",
                "action_overhead": self.machine.overhead,
                "hop_delay": self.machine.hop, "empty_step": self.machine.empty_step,
                "relative_error": self.relative_error, "spread": self.spread,
                "warmup_steps": self.warmup, "load_average": self.load, "cores": self.cores,
                "processes": self.processes,
                "processes_per_core": self.processes / max(self.cores, 1),
                "error": self.error, "model": self.model,
                "boundaries": plan_cut(self.plan).boundaries}


def fits_here(plan: Plan, max_processes: int) -> bool:
    """Whether the plan's ``pp x dp`` processes fit this machine (an ``auto`` order runs
    from its CSV, every other schedule by name)."""
    d = plan.dims  # no TP/CP runtime: one process per pipeline x data-parallel rank
    return d.model_parallel == 1 and d.world <= max_processes


def sleep_times(plan: Plan, scale: float) -> tuple[list[float], list[float], list[float]]:
    """Per stage of one model copy: F, B (= I + W) and W seconds to sleep."""
    c = plan.costs
    n = len(plan.ranges)
    return ([scale * x for x in c.f[:n]], [scale * x for x in c.b[:n]],
            [scale * x for x in c.w[:n]])


def scaled_prediction(plan: Plan, scale: float, machine: Machine = Machine()) -> float:
    """The simulated pipeline step of the plan's schedule with its stage times scaled, plus
    this machine's overhead per action and delay per message: what the run should measure."""
    c, o = plan.costs, machine.overhead
    split = plan.schedule_obj.uses_split_backward()
    costs = replace(c, f=[scale * x + o for x in c.f],
                    b=[scale * x + (2 * o if split else o) for x in c.b],
                    w=[scale * x + (o if split else 0.0) for x in c.w], comm=machine.hop,
                    allreduce=0.0)
    return simulate(plan.schedule_obj, costs).step_time


CALIBRATION = 0.02
"""The calibration run sleeps this fraction of the plans' scaled times (module doc)."""


def slept(plan: Plan, scale: float, events: list[dict]) -> list[float]:
    """What the sleep model sleeps for each measured action of ``plan`` run at ``scale``."""
    f, b, w = sleep_times(plan, scale)
    per = {"F": f, "B": b, "I": [x - y for x, y in zip(b, w, strict=True)], "W": w}
    # DualPipe's second copy sleeps as the first
    return [per[e["kind"]][e["stage"] % len(f)] for e in events]


def calibrate(plan: Plan, timeout: float = 600.0, csv: str | None = None,
              repeat: int = 5, scale: float = 0.0) -> Machine:
    """Run ``plan`` with its stage times scaled by ``scale`` (small: the run measures this
    machine, not the plan); the median excess of an action over what it sleeps is the
    overhead per action; then fit the per-message delay (module doc). ``csv``: the plan's
    order as a CSV file (needed for an ``auto`` plan)."""
    result = _run(command(plan, scale, repeat=repeat, csv=csv), timeout)
    if isinstance(result, str):
        raise UserError(f"{param('validate')}: the calibration run failed: {result}")
    steps, events = result
    step = median(steps)
    excess = [e["end"] - e["start"] - t
              for e, t in zip(events, slept(plan, scale, events), strict=True)]
    overhead = max(0.0, median(excess)) if excess else 0.0
    lo, hi = 0.0, max(step, 1e-9)
    if scaled_prediction(plan, scale, Machine(overhead, 0.0)) >= step:
        return Machine(overhead, 0.0, step)
    for _ in range(50):
        mid = (lo + hi) / 2
        if scaled_prediction(plan, scale, Machine(overhead, mid)) < step:
            lo = mid
        else:
            hi = mid
    return Machine(overhead, (lo + hi) / 2, step)


def _run(cmd: list[str], timeout: float) -> tuple[list[float], list[dict]] | str:
    """(every measured step, the fastest step's events) of a ``pipebubble run --json``, or
    why it failed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"exit code {proc.returncode}: {why}"
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        steps = [float(t) for t in out.get("step_times") or [out["step_time"]]]
        return steps, list(out.get("events", []))
    except (ValueError, KeyError, IndexError) as exc:
        return f"unreadable output: {exc}"


def needs_csv(plan: Plan) -> bool:
    """Whether the plan's order must be run from a file: a searched one (``auto``: found
    for its costs, no generator makes it again)."""
    from ..schedules import lookup

    return lookup(plan.schedule).searched


def command(plan: Plan, scale: float, warmup: int = WARMUP, repeat: int = 5,
            csv: str | None = None) -> list[str]:
    """The ``pipebubble run`` command line that runs ``plan`` for real, sleeping; with
    ``csv`` (the plan's order written by :func:`write_csv`), the order from that file."""
    f, b, w = sleep_times(plan, scale)
    fmt = lambda xs: ",".join(f"{x:.6g}" for x in xs)  # noqa: E731
    if csv is None and needs_csv(plan):
        raise ValueError(f"an {plan.schedule} plan runs from its CSV: pass csv=")
    which = (["--csv", csv] if csv is not None
             else ["--schedule", plan.schedule, "--chunks", str(plan.chunks)])
    return [sys.executable, "-m", "pipebubble", "run", "--model", "sleep", *which,
            "--ranks", str(plan.pp), "--microbatches", str(plan.microbatches),
            "--dp", str(plan.dp), "--layers", str(len(plan.ranges)),
            "--sleep-f", fmt(f), "--sleep-b", fmt(b), "--sleep-w", fmt(w),
            "--warmup", str(warmup), "--repeat", str(repeat), "--json",
            "--allow-oversubscribe"]  # sleeping ranks need no core each


def write_csv(plan: Plan, folder: str, k: int) -> str | None:
    """Write the plan's order as torch's CSV in ``folder`` when it needs one; its path."""
    if not needs_csv(plan):
        return None
    from ..interop.torch_csv import write_torch_csv

    path = os.path.join(folder, f"plan{k + 1}.{plan.schedule}.csv")
    write_torch_csv(plan.schedule_obj, path)
    return path


def validate(plans: list[Plan], target: float = 1.0, repeat: int = 5,
             timeout: float = 600.0, machine: Machine | None = None) -> list[Validation]:
    """Run each plan (see the module doc); the first plan sets the scale and, unless
    ``machine`` is given, is first run at a small scale to measure this machine's
    overheads."""
    if not plans:
        return []
    scale = target / plans[0].pipeline_time if plans[0].pipeline_time > 0 else 1.0
    with tempfile.TemporaryDirectory(prefix="pipebubble-validate-") as folder:
        csvs = [write_csv(plan, folder, k) for k, plan in enumerate(plans)]
        if machine is None:
            machine = calibrate(plans[0], timeout, csvs[0], repeat, CALIBRATION * scale)
        out = []
        for plan, csv in zip(plans, csvs, strict=True):
            predicted = scaled_prediction(plan, scale, machine)
            result = _run(command(plan, scale, repeat=repeat, csv=csv), timeout)
            here = {"load": machine_load(), "cores": available_cores()}
            if isinstance(result, str):
                out.append(Validation(plan, scale, predicted, None, result, machine, **here))
            else:
                steps = result[0]
                out.append(Validation(plan, scale, predicted, median(steps), None, machine,
                                      steps, **here))
    return out


def model_command(plan: Plan, model: str, model_args: list[str] | tuple[str, ...] = (),
                  seq: int | None = None, warmup: int = WARMUP, repeat: int = 5,
                  csv: str | None = None) -> list[str]:
    """The ``pipebubble run`` command line that runs ``plan`` on the real ``model`` (a
    ``--model`` SPEC): its cut as ``--boundaries``, one replica's batch of
    ``microbatch_size`` samples per microbatch (DualPipe: of both chains)."""
    if csv is None and needs_csv(plan):
        raise ValueError(f"an {plan.schedule} plan runs from its CSV: pass csv=")
    which = (["--csv", csv] if csv is not None
             else ["--schedule", plan.schedule, "--chunks", str(plan.chunks)])
    cuts = plan_cut(plan).flag
    extra = [x for a in model_args for x in ("--model-arg", a)]
    extra += ["--seq", str(seq)] if seq is not None else []
    return [sys.executable, "-m", "pipebubble", "run", "--model", model, *extra, *which,
            "--ranks", str(plan.pp), "--microbatches", str(plan.microbatches),
            "--dp", str(plan.dp),
            "--batch", str(plan.microbatch_size * plan.schedule_obj.total_microbatches),
            *(["--boundaries", cuts] if cuts else []),
            "--warmup", str(warmup), "--repeat", str(repeat), "--json"]


def plan_cut(plan: Plan) -> Cut:
    """The plan's cut of one model copy, as the ``run --boundaries`` value that runs it."""
    return Cut.of_ranges(plan.ranges, "the plan's cut")


def validate_on_model(plans: list[Plan], model: str, model_args: list[str] | tuple[str, ...] = (),
                      seq: int | None = None, repeat: int = 5,
                      timeout: float = 600.0) -> list[Validation]:
    """Run each plan on the real ``model`` (see the module doc): scale 1, the prediction is
    the simulated pipeline step of the plan's own costs (no data-parallel all-reduce)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="pipebubble-validate-") as folder:
        for k, plan in enumerate(plans):
            csv = write_csv(plan, folder, k)
            predicted = scaled_prediction(plan, 1.0)
            result = _run(model_command(plan, model, model_args, seq, repeat=repeat, csv=csv),
                          timeout)
            here = {"load": machine_load(), "cores": available_cores()}
            if isinstance(result, str):
                out.append(Validation(plan, 1.0, predicted, None, result, model=model, **here))
            else:
                out.append(Validation(plan, 1.0, predicted, median(result[0]), None,
                                      Machine(), result[0], model, **here))
    return out


# ---- the verdict ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """One validated plan against the tolerance: ``passed`` and, in words, why."""

    passed: bool
    relative_error: float | None  # measured / predicted - 1 on the medians; None: no run
    tolerance: float
    note: str  # the miss, set against the run's spread and the machine's load

    def as_json(self) -> dict:
        return {"verdict": "PASS" if self.passed else "FAIL", "passed": self.passed,
                "relative_error": self.relative_error, "tolerance": self.tolerance,
                "note": self.note}


def explain(v: Validation, tolerance: float) -> str:
    """Why a plan missed, or that it did not: the miss against the tolerance, the run's spread
    (warm-up excluded) and the machine's load, blaming the cost model last."""
    err = v.relative_error
    where, busy = load_words(v.load, v.cores, v.processes, v.model is not None)
    if err is None:
        return f"the run failed: {v.error or 'no step measured'}"
    spread = v.spread
    over = (f"spread {spread:.1%} over {len(v.steps)} steps, {v.warmup} warm-up step(s) "
            "excluded" if spread is not None else f"{len(v.steps)} step(s) measured")
    head = f"{err:+.1%} against a tolerance of {tolerance:.0%} ({over}; {where})"
    if abs(err) <= tolerance:
        return head
    if spread is not None and abs(err) <= spread:
        return head + ": within the run-to-run spread: noise, not a model error (more " \
            "--repeat or a quieter machine narrow it)"
    if busy:
        return head + ": the machine was loaded, which the prediction does not include; " \
            "rerun on a quieter machine (or with fewer processes) before blaming the cost model"
    return head + ": the machine was not busy, so the cost model misses something here"


def verdict(v: Validation, tolerance: float = DEFAULT_TOLERANCE) -> Verdict:
    """PASS when the plan ran and its median is within ``tolerance`` of its prediction."""
    err = v.relative_error
    return Verdict(err is not None and abs(err) <= tolerance, err, tolerance,
                   explain(v, tolerance))


@dataclass(frozen=True)
class Ranking:
    """The validated plans' predicted order against their measured order (plan numbers are
    the ``plan`` table's, 1 = predicted fastest)."""

    predicted: list[int]  # plan numbers, fastest prediction first
    measured: list[int]  # the same plans, fastest median first
    kendall_tau: float | None  # +1: same order, -1: reversed; None: under two pairs' worth
    top_fastest: bool  # the plan predicted fastest measured fastest
    swapped: list[tuple[int, int]]  # (faster predicted, faster measured) beyond the tolerance
    tolerance: float

    @property
    def held(self) -> bool:
        """No two plans swapped places by more than the tolerance."""
        return not self.swapped

    def as_json(self) -> dict:
        return {"predicted_order": self.predicted, "measured_order": self.measured,
                "kendall_tau": self.kendall_tau, "top_plan_fastest": self.top_fastest,
                "swapped": [list(p) for p in self.swapped], "held": self.held,
                "tolerance": self.tolerance}


def ranking(validations: list[Validation], numbers: list[int] | None = None,
            tolerance: float = DEFAULT_TOLERANCE) -> Ranking | None:
    """Whether the measured order of the plans that ran is the predicted one (module doc).

    ``numbers``: each validation's plan number (1, 2, ... by default). Kendall's tau is
    ``(concordant - discordant) / (concordant + discordant)`` over the pairs whose
    predictions and medians both differ (tau-a without the ties). A pair *swapped* is one
    whose faster prediction measured slower by more than ``tolerance`` of the other's median.
    None when fewer than one plan ran."""
    numbers = numbers or list(range(1, len(validations) + 1))
    ran = [(n, v.predicted, v.measured) for n, v in zip(numbers, validations, strict=True)
           if v.measured is not None]
    if not ran:
        return None
    by_pred = [n for n, _, _ in sorted(ran, key=lambda r: (r[1], r[0]))]
    by_meas = [n for n, _, _ in sorted(ran, key=lambda r: (r[2], r[0]))]
    agree = disagree = 0
    swapped = []
    for i, (ni, pi, mi) in enumerate(ran):
        for nj, pj, mj in ran[i + 1:]:
            if pi == pj or mi == mj:
                continue
            if (pi < pj) == (mi < mj):
                agree += 1
                continue
            disagree += 1
            (fast, fm), (slow, sm) = ((ni, mi), (nj, mj)) if pi < pj else ((nj, mj), (ni, mi))
            if fm > sm * (1 + tolerance):
                swapped.append((fast, slow))
    tau = (agree - disagree) / (agree + disagree) if agree + disagree else None
    return Ranking(by_pred, by_meas, tau, by_pred[0] == by_meas[0], sorted(swapped),
                   tolerance)
