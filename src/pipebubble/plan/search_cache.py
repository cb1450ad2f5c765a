"""The planner's two caches: what one search shares, and what one point keeps.

A search visits points (tp, sp, cp, sharding); each point has its own
:class:`~pipebubble.plan.scoring.Searcher`, made of parts (module doc there). What depends
on a schedule or on a layer-cost object only, never on the point's sharding, is computed
once per search and kept in the one :class:`SearchCache` every searcher of the search is
given. What depends on the point (its data-parallel traffic, its bytes per parameter) is
kept in the point's own :class:`PointCache`, which every part of that searcher shares.

An entry keyed by a schedule's or a layer-cost object's ``id`` keeps that object beside the
value and is checked against it on the way out: an id is reused once its object dies.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SearchCache:
    """What the searchers of one search (one per point) share: what depends on the schedule
    or the layer costs only, not on the point's sharding (module doc)."""

    schedules: dict = field(default_factory=dict)  # (family, pp, m, v) -> Schedule | None
    held: dict = field(default_factory=dict)  # per schedule: microbatches held per stage
    split: dict = field(default_factory=dict)  # per schedule: split / fused backward
    in_order: dict = field(default_factory=dict)  # per schedule: microbatches in order
    peaks: dict = field(default_factory=dict)  # per order and stage memory: simulated peaks
    ranks: dict = field(default_factory=dict)  # per schedule and cut: Pricing's rank sums
    prefixes: dict = field(default_factory=dict)  # per layer costs: prefix sums
    sums: dict = field(default_factory=dict)  # per layer costs and cut: per-stage sums
    why_not: dict = field(default_factory=dict)  # "family pp=N" -> why it has no schedule
    # The pipeline's timeline depends on the schedule and the stage costs only: points that
    # differ in sharding alone (same layers, same cut) share their simulations.
    runs: dict = field(default_factory=dict)
    # Orders-free schedules of a placement (pp, m, stages): bounds before generating.
    shapes: dict = field(default_factory=dict)
    # Cuts (a) depend on the layer costs only: per layer-cost object (the shardings of one
    # (tp, sp, cp) share it), the object and its cuts.
    cuts: dict = field(default_factory=dict)

    # Configs' layer sums and the pipeline's part of its bounds, per layer-cost object.
    listing: dict = field(default_factory=dict)

    def listing_of(self, profiles) -> dict:
        """The listing cache of ``profiles`` (kept beside it: never another object's)."""
        got = self.listing.get(id(profiles))
        if got is None or got[0] is not profiles:
            got = self.listing[id(profiles)] = (profiles, {})
        return got[1]

    def cuts_of(self, profiles) -> dict:
        """The cut cache of ``profiles`` (kept beside it: never another object's)."""
        got = self.cuts.get(id(profiles))
        if got is None or got[0] is not profiles:
            got = self.cuts[id(profiles)] = (profiles, {})
        return got[1]


@dataclass
class PointCache:
    """What one point's parts keep: values that depend on its sharding (its data-parallel
    traffic, its bytes per parameter), so never shared with another point."""

    sync_times: dict = field(default_factory=dict)  # (dp, pp, params) -> traffic times
    exposures: dict = field(default_factory=dict)  # a rank's exposed traffic; optimizer rate
    stage_costs: dict = field(default_factory=dict)  # per cut: CostModel, params, transients
    tails: dict = field(default_factory=dict)  # per (stage costs, placement): Pricing.price
    fsdp_layers: dict = field(default_factory=dict)  # per layer costs: FSDP's layer traffic
    auto_cuts: dict = field(default_factory=dict)  # auto's priced cut and its floors
    config_bounds: dict = field(default_factory=dict)  # Configs.config_bound
    layer_sums: dict = field(default_factory=dict)  # per (microbatch size, recompute)
    weight_bounds: dict = field(default_factory=dict)  # MemoryBounds.weight_bound
    memory_bounds: dict = field(default_factory=dict)  # MemoryBounds.memory_bound
