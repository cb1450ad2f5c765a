"""The default cut, one rule for every command: balanced by the layers' cost.

Without ``--boundaries`` every command that cuts a model into stages (``run`` on every path,
``profile --ranks``, ``partition``, ``plan --validate``) cuts it the same way: the exact
min-max partitioner (:func:`pipebubble.partition.min_max_partition`, Pinar & Aykanat 2004)
over one cost per layer, so that the slowest stage is as light as any contiguous cut can
make it, ties broken towards even stages. What a layer costs is the best measure the command
has (:data:`BY` names each):

- a profile (``profile``, ``partition``, ``plan``): its measured forward + backward seconds
  (``"the profiled time"``); a profile without times (an analytic one, hardware free) by
  its FLOPs (``"FLOPs"``), else its parameter counts (``"parameter counts"``):
  :func:`profile_cut`;
- a model and no profile (``run``): the sleep model's stated seconds, else the forward
  FLOPs of its matrix products on a 2-sample batch, the same numbers in every process
  (:func:`pipebubble.runtime.cut.choose_cut`, which counts them);
- nothing counted: one per layer, stage sizes differing by at most one (``"layer count"``).

Any number of layers runs on any number of stages up to the layer count; more stages than
layers is one line naming both (:func:`check_stage_count`). The cut is reported as the
``--boundaries`` value that reproduces it (:attr:`Cut.flag`) and what it balanced by
(:meth:`Cut.describe`): ``run --boundaries`` with that value runs the same stages.

>>> cut = balanced_cut([1, 1, 1, 1, 1, 1, 1], 2, "FLOPs")   # 7 equal layers: 3 | 4
>>> cut.boundaries, cut.flag, cut.describe()
([3], '3', 'cut --boundaries 3 (balanced by FLOPs)')
>>> balanced_cut([0, 0, 0, 0, 0, 0, 0], 3, "FLOPs")          # nothing counted
Cut(boundaries=[2, 5], by='layer count')
>>> Cut.of_ranges([(0, 1), (2, 4), (5, 6)], "the plan's cut").flag
'2,5'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .partition import check_stage_count, min_max_partition

BY = ("given", "sleep times", "FLOPs", "the profiled time", "parameter counts", "layer count",
      "the plan's cut")
"""What chose a cut: ``--boundaries`` itself, or the cost it balanced."""


@dataclass(frozen=True)
class Cut:
    """A cut of a model's layers: the first layer of every stage after the first, and what
    chose it (one of :data:`BY`)."""

    boundaries: list[int]
    by: str

    @property
    def flag(self) -> str:
        """The ``--boundaries`` value that reproduces this cut ('' for one stage)."""
        return ",".join(str(b) for b in self.boundaries)

    def describe(self) -> str:
        """``cut --boundaries 4 (balanced by FLOPs)``, for a header or a note."""
        how = ("given" if self.by == "given" else self.by if self.by == "the plan's cut"
               else f"balanced by {self.by}")
        return (f"cut --boundaries {self.flag} ({how})" if self.boundaries
                else "one stage")

    def ranges(self, num_layers: int) -> list[tuple[int, int]]:
        """(first, last) layer of each stage, inclusive."""
        edges = [0, *self.boundaries, num_layers]
        return [(a, b - 1) for a, b in zip(edges, edges[1:], strict=False)]

    @classmethod
    def of_ranges(cls, ranges: Sequence[tuple[int, int]], by: str) -> Cut:
        """The cut whose stages are ``ranges`` ((first, last) layer, inclusive)."""
        return cls([a for a, _ in list(ranges)[1:]], by)


def balanced_cut(costs: Sequence[float] | None, num_stages: int, by: str) -> Cut:
    """The min-max cut of ``costs`` (one per layer, what ``by`` says they are) into
    ``num_stages`` stages; with no costs, or all 0, by layer count. More stages than layers
    is a one-line UserError (:func:`check_stage_count`)."""
    n = len(costs) if costs is not None else 0
    check_stage_count(n, num_stages)
    if num_stages == 1:
        return Cut([], by)
    if costs is None or not any(costs):
        costs, by = [1.0] * n, "layer count"
    return Cut.of_ranges(min_max_partition(list(costs), num_stages), by)


class _Columns(Protocol):
    def column(self, name: str) -> list[float]: ...

    def __len__(self) -> int: ...


def profile_costs(profile: _Columns) -> tuple[list[float], str]:
    """A profile's cost per layer and its name in :data:`BY`: the measured forward +
    backward seconds, else (no times: an analytic profile) FLOPs, else parameter counts,
    else one per layer."""
    for column, by in (("time", "the profiled time"), ("flops", "FLOPs"),
                       ("params", "parameter counts")):
        costs = [float(c) for c in profile.column(column)]
        if all(math.isfinite(c) and c >= 0 for c in costs) and any(costs):
            return costs, by
    return [1.0] * len(profile), "layer count"


def profile_cut(profile: _Columns, num_stages: int) -> Cut:
    """The default cut of a profiled model into ``num_stages`` stages (the module's rule)."""
    check_stage_count(len(profile), num_stages)
    costs, by = profile_costs(profile)
    return balanced_cut(costs, num_stages, by)


__all__ = ["BY", "Cut", "balanced_cut", "check_stage_count", "profile_costs", "profile_cut"]
