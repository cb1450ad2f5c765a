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
times. They are measured once, before the plans run, by running the first plan with layers
that sleep 0 s (:func:`calibrate`): ``overhead`` is the median time of an empty action (the
interpreter, autograd), added to every F, I, W and B; ``hop`` is the P2P delay per message
at which the simulator reproduces that empty run's step (bisection; the simulator's step
grows with the delay). On a loaded two-core machine a gloo message between processes takes
milliseconds, so without this the prediction would miss by far more than the schedule does.
The all-reduce of the sleep model's few weights is not part of the measured pipeline step.
The measured step is the fastest of ``repeat`` steps after a warm-up (the least disturbed
by other work on a shared machine), as ``pipebubble run`` reports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace

from ..errors import UserError
from ..sim.kernel import simulate
from .planner import Plan


@dataclass(frozen=True)
class Machine:
    """This machine's cost of running a schedule: per action, and per P2P message."""

    overhead: float = 0.0
    hop: float = 0.0
    empty_step: float | None = None  # the calibration run's measured step


@dataclass
class Validation:
    plan: Plan
    scale: float  # seconds slept per second of the plan
    predicted: float  # simulated pipeline step at that scale, seconds
    measured: float | None  # fastest measured step, seconds (None: the run failed)
    error: str | None = None
    machine: Machine = Machine()

    @property
    def measured_step_time(self) -> float | None:
        """The measured step in the plan's own time (divided by ``scale``)."""
        return None if self.measured is None else self.measured / self.scale

    def as_json(self) -> dict:
        return {"scale": self.scale, "predicted_scaled": self.predicted,
                "measured_scaled": self.measured, "action_overhead": self.machine.overhead,
                "hop_delay": self.machine.hop, "empty_step": self.machine.empty_step,
                "relative_error": (None if self.measured is None
                                   else self.measured / self.predicted - 1),
                "error": self.error}


def fits_here(plan: Plan, max_processes: int) -> bool:
    """Whether the plan's ``pp x dp`` processes fit this machine (and ``pipebubble run`` can
    run its schedule by name: an ``auto`` order depends on the costs it was searched with)."""
    return plan.pp * plan.dp <= max_processes and plan.schedule != "auto"


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


def calibrate(plan: Plan, timeout: float = 600.0) -> Machine:
    """Run ``plan`` with layers that sleep 0 s; fit the per-message delay (module doc)."""
    result = _run(command(plan, 0.0), timeout)
    if isinstance(result, str):
        raise UserError(f"--validate: the calibration run (empty layers) failed: {result}")
    step, events = result
    durations = sorted(e["end"] - e["start"] for e in events)
    overhead = durations[len(durations) // 2] if durations else 0.0
    lo, hi = 0.0, max(step, 1e-9)
    if scaled_prediction(plan, 0.0, Machine(overhead, 0.0)) >= step:
        return Machine(overhead, 0.0, step)
    for _ in range(50):
        mid = (lo + hi) / 2
        if scaled_prediction(plan, 0.0, Machine(overhead, mid)) < step:
            lo = mid
        else:
            hi = mid
    return Machine(overhead, (lo + hi) / 2, step)


def _run(cmd: list[str], timeout: float) -> tuple[float, list[dict]] | str:
    """(measured step, events) of a ``pipebubble run --json``, or why it failed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"exit code {proc.returncode}: {why}"
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        return float(out["step_time"]), list(out.get("events", []))
    except (ValueError, KeyError, IndexError) as exc:
        return f"unreadable output: {exc}"


def command(plan: Plan, scale: float, warmup: int = 1, repeat: int = 3) -> list[str]:
    """The ``pipebubble run`` command line that runs ``plan`` for real, sleeping."""
    f, b, w = sleep_times(plan, scale)
    fmt = lambda xs: ",".join(f"{x:.6g}" for x in xs)  # noqa: E731
    return [sys.executable, "-m", "pipebubble", "run", "--model", "sleep",
            "--schedule", plan.schedule, "--ranks", str(plan.pp),
            "--microbatches", str(plan.microbatches), "--chunks", str(plan.chunks),
            "--dp", str(plan.dp), "--layers", str(len(plan.ranges)),
            "--sleep-f", fmt(f), "--sleep-b", fmt(b), "--sleep-w", fmt(w),
            "--warmup", str(warmup), "--repeat", str(repeat), "--json"]


def validate(plans: list[Plan], target: float = 1.0, repeat: int = 3,
             timeout: float = 600.0, machine: Machine | None = None) -> list[Validation]:
    """Run each plan (see the module doc); the first plan sets the scale and, unless
    ``machine`` is given, is first run empty to measure this machine's overheads."""
    if not plans:
        return []
    scale = target / plans[0].pipeline_time if plans[0].pipeline_time > 0 else 1.0
    if machine is None:
        machine = calibrate(plans[0], timeout)
    out = []
    for plan in plans:
        predicted = scaled_prediction(plan, scale, machine)
        result = _run(command(plan, scale, repeat=repeat), timeout)
        if isinstance(result, str):
            out.append(Validation(plan, scale, predicted, None, result, machine))
        else:
            out.append(Validation(plan, scale, predicted, result[0], None, machine))
    return out
