"""Rank 0's side of a distributed run: align clocks, build the Timeline, estimate comm.

**Clock alignment.** Every rank leaves the same barrier at the start of a step and takes
that moment as its time origin, so its events are in seconds since the barrier. That is the
barrier-based alignment: its error is how far apart the ranks leave the barrier (tens of
microseconds on one machine with gloo; one network latency across machines). When all
ranks run on one host they also share its monotonic clock (``time.perf_counter``), so rank
0 shifts each rank's events by the difference of the origins, which removes the barrier's
skew altogether; the spread of the origins is reported as ``barrier_skew`` (what the
barrier alone would have left). Across hosts only the barrier is used.

**Message delay.** :func:`measured_comm` is the median delay of a message whose receiver
was already waiting; the ``run`` command calibrates a CostModel with it (median F, B or
I/W per stage, see :mod:`pipebubble.plan.calibrate`) and the measured all-reduce time per
stage when ``--dp`` > 1, and simulates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import torch

from ...ir.deps import Signal, producers, signal_sources
from ...ir.schedule import Action, Schedule
from ...timeline import Event, Timeline
from ..ep import Rows


@dataclass
class Alignment:
    method: str  # "shared host clock" or "barrier"
    barrier_skew: float | None  # spread of barrier exits (seconds), when measurable

    def as_dict(self) -> dict:
        return {"method": self.method, "barrier_skew": self.barrier_skew}


def measured_timeline(schedule: Schedule, results: list) -> tuple[Timeline, Alignment]:
    """Replica 0's events from every pipeline rank, on one aligned clock."""
    mine = [r for r in results if r.replica == 0]
    hosts = {r.host for r in results}
    if len(hosts) == 1:
        base = min(r.origin for r in results)
        skew = max(r.origin for r in results) - base
        shift = {r.rank: r.origin - base for r in mine}
        align = Alignment("shared host clock", skew)
    else:
        shift = {r.rank: 0.0 for r in mine}
        align = Alignment("barrier", None)
    events = [
        Event(e.rank, e.stage, e.kind, e.microbatch, e.start + shift[r.rank],
              e.end + shift[r.rank], e.mem_start, e.mem_end, e.overlapped)
        for r in mine for e in r.events
    ]
    tl = Timeline.from_events(
        events, schedule=schedule.name, num_ranks=schedule.num_ranks,
        num_stages=schedule.num_stages, num_microbatches=schedule.num_microbatches,
        stage_to_rank=schedule.stage_to_rank, source="measured",
        chain_starts=schedule.chain_starts,
    )
    return tl, align


def step_span(results: list) -> float:
    """Replica 0's step time on the shared host clock (or each rank's own, across hosts)."""
    ts = [(r.origin + e.start, r.origin + e.end) for r in results if r.replica == 0
          for e in r.events]
    return max(b for _, b in ts) - min(a for a, _ in ts) if ts else 0.0


def measured_comm(timeline: Timeline) -> float:
    """Median delay between a producer's end and its consumer's start on another rank,
    over the messages whose consumer was already idle (so the delay is the message's).
    Who produces what for whom is :func:`pipebubble.ir.deps.producers` (the timeline
    carries the schedule's ``chain_starts``: no message into the first stage of a chain);
    a pair's outputs leave when the pair ends (:func:`~pipebubble.ir.deps.signal_sources`)."""
    events = list(timeline.events())
    done: dict[Signal, Event] = {sig: events[i] for sig, i in signal_sources(events).items()}
    gaps = []
    for r in range(timeline.num_ranks):
        idle_from = 0.0  # when the rank finished its previous action
        for e in timeline.events(r):
            for dep in producers(Action(e.stage, e.kind, e.microbatch), timeline):
                src = done.get(dep.signal)
                if dep.crosses and src is not None and idle_from <= src.end:
                    gaps.append(max(0.0, e.start - src.end))
            idle_from = e.end
    return median(gaps) if gaps else 0.0


def grad_diffs(results: list, ref_loss: float, ref: dict[int, list[torch.Tensor]],
               loss: float) -> dict:
    """Largest |gradient - reference| and |loss - reference loss|.

    ``ref`` has one entry per stage of the model; with several chains (DualPipe) stage s
    runs a copy of model stage ``s mod len(ref)``, and after the step every copy holds the
    sum over the copies (the workers synchronise them), so each copy is compared as it is.
    """
    per = len(ref)
    total = [(s % per, grads) for r in results for s, grads in (r.grads or {}).items()]
    diff = 0.0
    for s, grads in total:
        for a, b in zip(grads, ref[s], strict=True):  # None: another rank's expert (--ep)
            if isinstance(a, Rows):  # an HF fused expert tensor's own rows (--ep)
                a, b = a.value, a.of(b)
            if a is not None and a.numel():
                diff = max(diff, float((a - b).abs().max()))
    return {"grad_max_abs_diff": diff, "loss_abs_diff": abs(loss - ref_loss)}
