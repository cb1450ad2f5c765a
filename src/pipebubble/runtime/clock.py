"""Clocks time each action for the Timeline.

- :class:`VirtualClock` is the lesson's per-stage clock for one process: stages run one after
  another for real, but each rank keeps its own clock, and an action starts at
  ``max(rank's clock, arrival of its inputs)``. Its duration is measured (``costs=None``) or
  taken from a cost model, in which case the timeline equals ``simulate``'s (an overlapped
  F&B pair's parts take what :meth:`~pipebubble.costs.StageCosts.pair_parts` gives them:
  ``overlap`` of their sum, with one half's all-to-all hidden behind the other's compute). On CUDA
  (``device``) it synchronises before and after each action so the measured time is the
  kernels', not the launch's.
- :class:`WallClock` records real start and end times (one process per rank), relative to
  an origin set when the step begins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..costs import StageCosts
from ..ir.schedule import Action, Overlap


class Clock(Protocol):
    def time(
        self, rank: int, action: Action, earliest: float, work: Callable[[], Any],
        overlapped: Overlap | None = None,
    ) -> tuple[float, float, Any]:
        """Run ``work``; return (start, end, its result). ``overlapped``: the Overlap pair
        ``action`` is a part of, or None."""

    def arrival(self, t: float, cross_rank: bool) -> float:
        """When a message produced at ``t`` can be consumed."""


class VirtualClock:
    """Per-rank clocks advanced by measured (or modelled) durations.

    ``timer`` measures each action: ``time.perf_counter`` (wall time, the default) or
    ``time.process_time`` (this process's CPU time, which other processes on shared cores
    do not inflate; meaningful with one torch thread on a CPU).
    """

    def __init__(self, ranks: int, costs: StageCosts | None = None, comm: float = 0.0,
                 device: torch.device | str | None = None,
                 timer: Callable[[], float] = time.perf_counter):
        self.timer = timer
        self.now = [0.0] * ranks
        self.costs = costs
        self.comm = costs.comm if costs is not None else comm
        self.durations: dict[Action, float] = {}
        self.source = "measured" if costs is None else "cost-model"
        self._sync = synchronizer(device)

    def time(self, rank: int, action: Action, earliest: float, work: Callable[[], Any],
             overlapped: Overlap | None = None):
        self._sync()
        t0 = self.timer()
        out = work()
        self._sync()
        measured = self.timer() - t0
        self.durations[action] = measured
        if self.costs is None:
            dur = measured
        else:
            dur = self.costs.duration(action.stage, action.kind)
            if overlapped is not None:
                fwd, bwd = overlapped.forward, overlapped.backward
                parts = self.costs.pair_parts(fwd.stage, bwd.stage, bwd.kind)
                dur = parts[0 if action == fwd else 1].duration
        start = max(self.now[rank], earliest)
        end = start + dur
        self.now[rank] = end
        return start, end, out

    def arrival(self, t: float, cross_rank: bool) -> float:
        return t + (self.comm if cross_rank else 0.0)


class WallClock:
    """Real time since ``origin`` (perf_counter seconds). On CUDA (``device``) the kernels
    are waited for around each action, so the end is read after they finish, not after
    their launch."""

    source = "measured"

    def __init__(self, origin: float | None = None, device: torch.device | str | None = None):
        self.origin = time.perf_counter() if origin is None else origin
        self._sync = synchronizer(device)

    def time(self, rank: int, action: Action, earliest: float, work: Callable[[], Any],
             overlapped: Overlap | None = None):
        self._sync()
        start = time.perf_counter() - self.origin
        out = work()
        self._sync()
        return start, time.perf_counter() - self.origin, out

    def arrival(self, t: float, cross_rank: bool) -> float:
        return t


def synchronizer(device: torch.device | str | None) -> Callable[[], None]:
    """A function that waits for ``device``'s queued kernels (CUDA), or does nothing: the
    one CUDA synchroniser, used by the clocks and the profiler."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None
