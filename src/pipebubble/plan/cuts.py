"""Where the planner cuts the layers into a schedule's stages: the rule of
:mod:`pipebubble.plan.planner` beyond ``exhaustive_cuts``.

(a) The min-max cut of what each layer adds to its rank's step, ``m x (F + I + W)``
(:func:`~pipebubble.plan.partition.min_max_partition`), and, when ranks hold several stages,
its rank-balanced refinement (:func:`~pipebubble.plan.partition.balance_ranks`). The
data-parallel traffic mostly hides behind the backward, so it is left out of the cut (a
rule, not a bound): the sharding never changes the cut, and the cut does not depend on m
(the costs only scale), so one cut serves every sharding and microbatch count of a
(tp, sp, cp, microbatch size, recompute).

(b) When no (a) cut fits: the same min-max cut with a memory cap per stage, ``budget /
stages per rank``, where a layer's memory in stage s is its model states and recomputation
transient plus ``held_s x`` its activation bytes (``held_s``: the most microbatches stage s
holds at once); the last layer also carries a tied embedding's copy where the last stage's
rank holds no embedding (:func:`~pipebubble.plan.cut_price.embedding_copies`). Each
rank's peak is then at most the sum of its stages' caps: (b) fits by construction.

Most configurations of a large model have no (b) cut at all (the activations of the
microbatches in flight do not fit). :meth:`Cuts.capped_possible` proves that cheaply first:
the first layer must fit the first stage and the last layer the last; stage k can hold only
layers k to L - S + k (every stage holds one), and n of them weigh at least its n lightest
there, so it holds at most as many layers as the running sum of those, sorted, stays within
the cap: when those counts sum to fewer than the layers, no capped cut exists.
"""

from __future__ import annotations

import math

import numpy as np

from ..costs import fit_bound
from ..ir.schedule import Schedule
from .axes import Axes
from .cut_price import embedding_copies
from .families import placement_of
from .layercosts import LayerCosts, ProfileSet
from .partition import Ranges, balance_ranks, capped_partition, capped_within, min_max_partition
from .plans import Config
from .search_cache import SearchCache


class Cuts:
    """Cuts (a) and (b) (module doc): a part of :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the ``profiles`` (the layer costs per microbatch size and recompute), the
    point's ``axes`` (bytes per parameter, for cut (b)'s memory) and the search's ``cache``,
    whose cuts of these profiles every point shares (made fresh when not given)."""

    def __init__(self, profiles: ProfileSet, axes: Axes, cache: SearchCache | None = None):
        self.p, self.axes, self.L = profiles, axes, len(profiles)
        self._cuts: dict[tuple, object] = (SearchCache() if cache is None
                                           else cache).cuts_of(profiles)

    def stage_bound(self, c: Config, lc: LayerCosts | None = None) -> float:
        """No cut of ``c`` takes less than ``m x`` the min-max cut's slowest stage (every
        cut has a stage at least that slow, and its rank works it m times): the first test
        of :meth:`~pipebubble.plan.scoring.Searcher.surely_slow`, also what ``plan
        --config`` ranks with (:mod:`~pipebubble.plan.bound_rank`). 0.0 where the placement
        is not known before generating (``auto``, DualPipe) or the stages outnumber the
        layers."""
        S_c = c.pp * c.chunks
        if placement_of(c.schedule) is None or S_c > self.L:
            return 0.0
        key = ("slowest stage", c.microbatch_size, c.recompute, S_c)
        slowest = self._cuts.get(key)
        if slowest is None:
            if lc is None:
                lc = self.p.at(c.microbatch_size, c.recompute)
            work = self.cut_costs(lc, c, 1)  # the very cut (a) starts from
            slowest = self._cuts[key] = max(float(work[a:b + 1].sum()) for a, b in
                                            min_max_partition(work, S_c))
        return c.microbatches * slowest * (1 - 1e-9)

    def cut_costs(self, lc: LayerCosts, c: Config, microbatches: int) -> np.ndarray:
        """What a layer adds to its rank's step: ``m x (F + I + W)`` (module doc)."""
        return microbatches * lc.work

    def time_cuts(self, lc: LayerCosts, c: Config, stages: int, microbatches: int,
                   where: tuple[int, ...]) -> list[Ranges]:
        """Cuts (a): the min-max cut of :meth:`cut_costs` and, when ranks hold several stages
        (``where``: stage -> rank), its refinement by :func:`balance_ranks` if different.
        Cached per (microbatch size, recompute, stages, placement): the cut of costs that
        only scale with m is the same cut, so it is cut at m = 1 (whatever m asks first)."""
        key = (c.microbatch_size, c.recompute, stages, where)
        got = self._cuts.get(key)
        if got is None:
            costs = self.cut_costs(lc, c, 1)
            got = [min_max_partition(costs, stages)]
            if len(where) > len(set(where)):
                other = balance_ranks(costs, got[0], where)
                if other != got[0]:
                    got.append(other)
            self._cuts[key] = got
        return got

    def memory_matrix(self, lc: LayerCosts, c: Config, sched: Schedule, held: list[int]
                       ) -> np.ndarray:
        """Per stage of one copy, each layer's memory bound in that stage (the worst of the
        copies): ``static + held_s x act`` (module doc), stages x layers."""
        S_c = sched.num_stages // sched.chains
        bpp = self.axes.bytes_per_param(c.dp, c.pp)
        static = bpp * lc.params + lc.transient
        h = np.asarray(held, dtype=np.float64)
        rows = static[None, :] + h[:, None] * lc.act[None, :]
        where = sched.stage_to_rank
        # A tied embedding's copy sits with the head (the last layer, always in the chain's
        # last stage) when the head's rank holds no chain's first stage (embedding_copies).
        heads = {b for _, b in embedding_copies(where, sched.chain_starts)} if lc.tied else ()
        for k in range(sched.chains):
            if where[(k + 1) * S_c - 1] in heads:
                rows[(k + 1) * S_c - 1, -1] += bpp * lc.tied
        out = rows[:S_c]
        for k in range(1, sched.chains):
            out = np.maximum(out, rows[k * S_c:(k + 1) * S_c])
        return out

    def memory_rows(self, lc: LayerCosts, c: Config, sched: Schedule, held: list[int]
                     ) -> list[list]:
        """:meth:`memory_matrix` as lists (what the partitioner takes)."""
        return self.memory_matrix(lc, c, sched, held).tolist()

    def capped_possible(self, lc: LayerCosts, c: Config, sched: Schedule, held: list[int],
                        budget: float) -> bool:
        """False only when no cut (b) exists: an end layer does not fit its stage, or the
        most layers each stage can hold within its cap sum to fewer than the layers (module
        doc; a necessary condition, with a margin for rounding)."""
        rows = self.memory_matrix(lc, c, sched, held)
        cap = fit_bound(budget / (sched.num_stages // c.pp))
        if rows[0, 0] > cap or rows[-1, -1] > cap:
            return False  # the first layer is in the first stage, the last in the last
        if (rows.min(axis=0) > cap).any():
            return False  # a layer no stage can hold
        # Stage k holds layers k .. L - S + k only (every stage holds one), and n of them
        # weigh at least its n lightest there: the most it can hold.
        S, L = rows.shape
        i = np.arange(L)[None, :]
        k = np.arange(S)[:, None]
        inside = np.where((i >= k) & (i <= L - S + k), rows, np.inf)
        room = (np.cumsum(np.sort(inside, axis=1), axis=1) <= cap).sum(axis=1)
        return float(room.sum()) >= self.L

    def capped_cut(self, lc, c, sched, held, budget, below: float = math.inf
                    ) -> Ranges | None:
        """Cut (b), or None when none exists, or (``below`` finite) when none can be faster
        than ``below``: a stage's cost (:meth:`cut_costs`) is part of its rank's work, so a
        cut whose every capped alternative has a stage above ``below`` cannot beat it
        (:func:`~pipebubble.plan.partition.capped_within`, one sweep)."""
        if not self.capped_possible(lc, c, sched, held, budget):
            return None
        S_c = sched.num_stages // sched.chains
        per_rank = sched.num_stages // c.pp
        costs = self.cut_costs(lc, c, sched.num_microbatches)
        rows = self.memory_matrix(lc, c, sched, held)  # (the partitioner reads its doubles)
        if below < math.inf and not capped_within(costs, S_c, rows, budget / per_rank, below):
            return None
        return capped_partition(costs, S_c, rows, budget / per_rank)
