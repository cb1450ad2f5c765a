"""Prove a plan by running it: one process per rank over gloo, sleeping the profiled times.

A plan predicts a step for GPUs this machine does not have. What can be checked here is the
part the planner derives: the schedule, the cut and the simulated order of F, I and W on
every rank. :func:`validate` runs each plan with ``pipebubble run --model sleep`` (one
process per pipeline rank and data-parallel replica, ``pp x dp`` in all, over gloo): stage
``s`` sleeps the sum of its layers' profiled F, I (recomputation included) and W, all scaled
by one factor ``scale`` so that the first plan's step takes about ``target`` seconds (sleeping
costs no CPU, so eight ranks run true to time on two cores). The same factor for every plan
keeps their order.

The prediction it is held against is the simulator's for those scaled stage times with no
P2P or all-reduce time (the processes exchange small tensors over loopback; the all-reduce
of the sleep model's few weights is not part of the measured pipeline step). The measured
step is the fastest of ``repeat`` steps after a warm-up (the least disturbed by other work
on a shared machine), as ``pipebubble run`` reports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace

from ..sim.kernel import simulate
from .planner import Plan


@dataclass
class Validation:
    plan: Plan
    scale: float  # seconds slept per second of the plan
    predicted: float  # simulated pipeline step at that scale, seconds
    measured: float | None  # fastest measured step, seconds (None: the run failed)
    error: str | None = None

    @property
    def measured_step_time(self) -> float | None:
        """The measured step in the plan's own time (divided by ``scale``)."""
        return None if self.measured is None else self.measured / self.scale

    def as_json(self) -> dict:
        return {"scale": self.scale, "predicted_scaled": self.predicted,
                "measured_scaled": self.measured,
                "relative_error": (None if self.measured is None
                                   else self.measured / self.predicted - 1),
                "error": self.error}


def fits_here(plan: Plan, max_processes: int) -> bool:
    """Whether the plan's ``pp x dp`` processes fit this machine."""
    return plan.pp * plan.dp <= max_processes


def sleep_times(plan: Plan, scale: float) -> tuple[list[float], list[float], list[float]]:
    """Per stage of one model copy: F, B (= I + W) and W seconds to sleep."""
    c = plan.costs
    n = len(plan.ranges)
    return ([scale * x for x in c.f[:n]], [scale * x for x in c.b[:n]],
            [scale * x for x in c.w[:n]])


def scaled_prediction(plan: Plan, scale: float) -> float:
    """The simulated pipeline step of the plan's schedule with its stage times scaled and no
    communication: what the sleeping run should measure."""
    c = plan.costs
    costs = replace(c, f=[scale * x for x in c.f], b=[scale * x for x in c.b],
                    w=[scale * x for x in c.w], comm=0.0, allreduce=0.0)
    return simulate(plan.schedule_obj, costs).step_time


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


def validate(plans: list[Plan], target: float = 0.3, repeat: int = 3,
             timeout: float = 600.0) -> list[Validation]:
    """Run each plan (see the module doc); the first plan sets the scale."""
    if not plans:
        return []
    scale = target / plans[0].pipeline_time if plans[0].pipeline_time > 0 else 1.0
    out = []
    for plan in plans:
        predicted = scaled_prediction(plan, scale)
        cmd = command(plan, scale, repeat=repeat)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            out.append(Validation(plan, scale, predicted, None, f"timed out after {timeout:g} s"))
            continue
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            out.append(Validation(plan, scale, predicted, None,
                                  f"exit code {proc.returncode}: {why}"))
            continue
        try:
            measured = float(json.loads(proc.stdout.strip().splitlines()[-1])["step_time"])
        except (ValueError, KeyError, IndexError) as exc:
            out.append(Validation(plan, scale, predicted, None, f"unreadable output: {exc}"))
            continue
        out.append(Validation(plan, scale, predicted, measured))
    return out
