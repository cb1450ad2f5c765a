"""The configurations of one point: every (pp, dp, microbatch size, recompute, schedule,
chunks) the request allows, each with a lower bound on its step that holds for every cut
and every order (:meth:`Configs.config_bound`, needing neither a schedule nor a cut):

- **the mean rank**: the step is ``max_r (end_r + exposed_r + optimizer_r)``, at least the
  mean over ranks. Rank r starts no sooner than ``head_r`` (microbatch 0's forward through
  the stages before its first one) and then works ``busy_r``, so the mean is at least
  ``m x (F + I + W of the model) / pp + mean head + optimizer(parameters / pp)`` (the
  optimizer step is linear in the parameters; tied copies only add). The ranks' first
  stages are distinct places of a chain, so the k-th earliest is at place ``k // chains``
  or later, after at least that many layers' forwards (and, with one chain, as many hops:
  each rank's first stage follows another rank's stage);
- **one microbatch**: its forward through every layer and its input gradient back, with
  (one chain, which visits all ``pp`` ranks) a hop each way between consecutive ranks:
  ``F + I of the model + 2 (pp - 1) hops``.

A hop is priced at the smallest boundary activation (the cut's is the largest it sends).
The data-parallel traffic may all hide. The search visits the configurations in order of an
estimate (:meth:`Configs.estimate`) and skips those whose bound cannot beat the K-th best
plan. :class:`Configs` is the part of :class:`~pipebubble.plan.scoring.Searcher` that lists
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from .. import limits
from ..errors import UserError, param
from .analytic import RECOMPUTE_MODES
from .axes import Axes, axis_flag
from .cut_price import OPT_MARGIN
from .families import chunk_options, schedule_list
from .layercosts import ProfileSet
from .network import p2p
from .plans import Config, Request
from .search_cache import PointCache, SearchCache


def chains_of(name: str) -> int:
    """Independent stage chains of a family's schedules (``Schedule.chains``), from its spec:
    DualPipe runs two model copies, every other family one (tests/test_plan_scale_bounds.py
    checks it against every registered family)."""
    from ..schedules import lookup

    return lookup(name).chains


def settle_recompute(profiles: ProfileSet, req: Request) -> Request:
    """``req`` with its recomputation modes checked against ``profiles``, and set where the
    request leaves them open (None: none, and full where the profile has it)."""
    modes = profiles.recompute_modes()
    if req.recompute is None:
        req = replace(req, recompute=("none", "full") if "full" in modes else ("none",))
    for r in req.recompute:
        if r not in RECOMPUTE_MODES:
            raise UserError(f"unknown {param('recompute')} {r!r}; valid are "
                            f"{', '.join(RECOMPUTE_MODES)}")
        if r not in modes:
            profiles.at(1, r)  # raises the profile's message
    return req


def visit_estimate(work: float, m: int, pp: int, v: int) -> float:
    """A rough step that only orders the search's visit: the mean rank's work with a
    1F1B-like fill and drain, ``m x (F + I + W) / pp x (1 + (pp - 1) / (m v))`` (``work``:
    one microbatch's F + I + W over the model)."""
    return m * work / pp * (1 + (pp - 1) / (m * v))


class Configs:
    """Enumeration (module doc): a part of :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the ``profiles`` (the layers' sums each bound needs), the ``req`` (the axes'
    allowed values; :attr:`req` is it with its recomputation modes settled,
    :func:`settle_recompute`), the point's ``axes`` (its degrees, hop and optimizer) and
    its ``point`` cache (the bounds, once per what they depend on). Of the request's GPUs,
    :attr:`gpus` are left to the pipeline and data parallelism."""

    def __init__(self, profiles: ProfileSet, req: Request, axes: Axes,
                 point: PointCache | None = None, shared: SearchCache | None = None):
        req = settle_recompute(profiles, req)
        self.p, self.req, self.axes, self.L = profiles, req, axes, len(profiles)
        self.point = axes.point
        self.gpus = req.gpus // self.point.dims.model_parallel  # pipeline x data parallel
        self.names = schedule_list(req.schedules)
        point = PointCache() if point is None else point
        self._config_bounds = point.config_bounds
        # the layer sums and the pipeline's part of each bound depend on the layer costs
        # (and the hop), not on the sharding: shared by the points of one costs object
        self._layer_sums = (point.layer_sums if shared is None
                            else shared.listing_of(profiles))

    def configs(self) -> Iterator[Config]:
        """Every configuration of this point, with its bound (module doc)."""
        sharding = self.point.sharding
        for dims, size, m, rec, kinds, bounds in self.groups():
            for name, v, ch in kinds:
                yield Config(dims, size, m, name, v, rec, bounds[ch], sharding)

    def groups(self) -> Iterator[tuple]:
        """The configurations of :meth:`configs`, in its order, grouped by what they share:
        ``(dims, microbatch size, microbatches, recompute, kinds, bounds)``, ``kinds`` the
        group's ``(schedule, chunks, chains)`` in order (one list shared by the groups of a
        pp) and ``bounds`` the bound by chains (the search builds a :class:`Config` only
        for those it visits)."""
        req, L, pt, G = self.req, self.L, self.point, self.gpus
        chains = {name: chains_of(name) for name in self.names}  # once, not per config
        options = {name: chunk_options(name, req.max_chunks) for name in self.names}
        for pp in limits.divisors(G):  # O(sqrt N), not N
            dp = G // pp
            if (req.pp is not None and pp not in req.pp) or (
                    req.dp is not None and dp not in req.dp):
                continue
            if not self.axes.ep_fits(dp):
                continue  # EP is carved out of dp (or dp_shard) x cp (plan/dims.py ep_from)
            dims = self.axes.dims(dp, pp)
            if pt.sharding.shards_optimizer and dims.data_context == 1:
                continue  # nothing to shard: the same plan as ddp, shown once
            if pt.sharding.hybrid and not self.axes.shard(dp):
                continue  # the shard group would be 1 or all of dp: ddp or fsdp
            # (schedule, chunks, chains) of this pp: the same for every size and recompute
            kinds = [(name, v, chains[name]) for name in self.names for v in options[name]
                     if (req.chunks is None or v in req.chunks) and pp * v <= L
                     and not (pp == 1 and v > 1)]
            for size in req.microbatch_sizes:
                if req.global_batch % (dp * size):
                    continue
                m = req.global_batch // (dp * size)
                if not limits.plan_microbatches_ok(m):  # bounded work per configuration
                    continue
                # one rank: only the orders pp1 keeps (the others give the same plan)
                pp1 = (req.pp1_schedules(self.names, m, self.split_apart(size))
                       if pp == 1 else ())
                here = kinds if pp > 1 else [k for k in kinds if k[0] in pp1]
                if not here:
                    continue
                used = list(dict.fromkeys(ch for _, _, ch in here))  # first seen first
                for rec in req.recompute:
                    yield dims, size, m, rec, here, {
                        ch: self.config_bound(pp, dp, size, m, rec, ch) for ch in used}

    def split_apart(self, size: int) -> bool:
        """Whether a backward split into I and W prices apart from B at this point and
        microbatch size: some layer's backward hides work behind its W (TP's collectives,
        ``LayerCosts.hidden``) under some recompute asked for."""
        for rec in self.req.recompute:
            hidden = self.p.at(size, rec).hidden
            if hidden is not None and bool(np.any(hidden > 0)):
                return True
        return False

    def config_bound(self, pp: int, dp: int, size: int, m: int, rec: str, chains: int
                     ) -> float:
        """No cut and no order of such a configuration takes less (module doc)."""
        key = (pp, dp, size, m, rec, chains)
        memo = self._config_bounds
        got = memo.get(key)
        if got is None:
            sums = self._layer_sums  # shared by the points of these layer costs
            if (size, rec) not in sums:
                lc = self.p.at(size, rec)
                sums[(size, rec)] = (float(lc.work.sum()), float(lc.f.sum() + lc.i.sum()),
                                     np.concatenate(([0.0], np.cumsum(lc.f))),
                                     float(lc.params.sum()),
                                     float(lc.out[:-1].min()) if len(lc.out) > 1 else 0.0)
            work, path, pref_f, params, out = sums[(size, rec)]
            if pp > 1 and chains == 1:  # (the hop and the optimizer read dp and the sums)
                hop = memo.get(("hop", dp, out))
                if hop is None:
                    hop = memo[("hop", dp, out)] = p2p(out, self.axes.hop(dp))
            else:
                hop = 0.0
            pipe_key = (size, rec, pp, m, chains, hop)  # what the pipeline's part reads
            pipe = sums.get(pipe_key)
            if pipe is None:
                places = np.arange(pp) // chains
                head = float((pref_f[np.minimum(places, len(pref_f) - 1)]
                              + places * hop).sum())
                pipe = sums[pipe_key] = (m * work / pp + head / pp, path + 2 * (pp - 1) * hop)
            opt = memo.get(("optimizer", dp, params / pp))
            if opt is None:
                opt = memo[("optimizer", dp, params / pp)] = (
                    self.axes.optimizer_time(dp, params / pp) * OPT_MARGIN)
            got = memo[key] = max(pipe[0] + opt, pipe[1])
        return got

    def work(self, size: int, rec: str) -> float:
        """The model's F + I + W of one microbatch at ``size`` and ``rec`` (known once a
        bound at them is: :meth:`config_bound`)."""
        return self._layer_sums[(size, rec)][0]

    def estimate(self, c: Config) -> float:
        """A rough step of ``c`` that only orders the visit (:func:`visit_estimate`)."""
        return visit_estimate(self.work(c.microbatch_size, c.recompute), c.microbatches, c.pp,
                              c.chunks)

    def nothing_divides(self) -> str:
        """The error when no configuration exists: the limit that rules every split out
        (a pipeline deeper than the layers, too many microbatches), else the global batches
        that would split."""
        r, G = self.req, self.gpus
        splits = [(pp, G // pp, s) for pp in limits.divisors(G) for s in r.microbatch_sizes
                  if not r.global_batch % (G // pp * s)]
        if splits:
            return _why_no_split(r, G, self.L, splits, self.point, self.axes)
        pairs = sorted({(G // pp) * s for pp in limits.divisors(G)
                        for s in r.microbatch_sizes})
        B = r.global_batch
        below = max((B // d * d for d in pairs if B // d), default=None)
        above = min((B // d + 1) * d for d in pairs)
        near = f"{below} or {above}" if below else str(above)
        sizes = ",".join(map(str, r.microbatch_sizes))
        return (f"{param('global_batch')} {B} cannot be split into microbatches: it must be a "
                f"multiple of dp x microbatch size for some dp dividing {param('gpus')} "
                f"{r.gpus} and {param('microbatch_sizes')} {sizes}, i.e. of one of "
                f"{', '.join(map(str, pairs))} (nearest: {near})")


def _why_no_split(r, G: int, L: int, splits: list, pt, axes) -> str:
    """The batch splits (``splits``: (pp, dp, microbatch size)), but each split is ruled
    out: name the first limit every one of them breaks."""
    mp = pt.dims.model_parallel
    B, ranks = r.global_batch, f"{param('gpus')} {r.gpus}" + (f" / (tp x cp = {mp})"
                                                              if mp > 1 else "")
    batch = param("global_batch")
    if all(pp > L for pp, _, _ in splits):
        dp = max(d for _, d, _ in splits)
        need = min(d for d in limits.divisors(G) if G // d <= L)
        return (f"{ranks} leaves a pipeline of at least {G // dp} stages: {batch} {B} "
                f"allows at most dp = {dp} (dp x microbatch size must divide it), and pp = "
                f"GPUs / dp must be at most the profile's {L} layers; use at most "
                f"{pt.dims.with_split(L, dp, 1).world} GPUs or a {batch} that is a "
                f"multiple of "
                f"{need} x microbatch size (dp >= {need})")
    if all(not limits.plan_microbatches_ok(B // (d * s)) for _, d, s in splits):
        return (f"{batch} {B} over these GPUs gives more than "
                f"{limits.MAX_PLAN_MICROBATCHES:,} microbatches per pipeline for every split: "
                f"use larger {param('microbatch_sizes')} values or more GPUs")
    if pt.sharding.shards_optimizer and all(pt.dims.with_split(1, d, 1).data_context == 1
                                    for _, d, _ in splits):
        return (f"{param('shardings')} {pt.sharding} shards the model states over dp x cp "
                "ranks, but "
                f"every split of {ranks} has one; use {param('shardings')} ddp or more GPUs")
    given = [axis_flag(r, a, v) for a, v in (("pp", r.pp), ("dp", r.dp)) if v]
    asked = sorted({d for pp, d, _ in splits if pp <= L and (r.pp is None or pp in r.pp)
                    and (r.dp is None or d in r.dp)})
    if pt.sharding.hybrid and asked and not any(axes.shard(d) for d in asked):
        node = axes.net.gpus_per_node
        return (f"{param('shardings')} hsdp shards over the data-parallel ranks of a node "
                f"and replicates across nodes, but at dp {', '.join(map(str, asked))} "
                f"(tp x cp = {mp}, {node} GPUs a node) its shard group would be 1 or all of "
                f"dp, which is ddp or fsdp: use {param('shardings')} fsdp or ddp, or dp "
                f"above {max(node // mp, 1)} (more GPUs)")
    return (f"no configuration of {ranks} and {batch} {B} passes "
            f"{' and '.join(given) or 'the limits'}: pp x chunks stages must be at most the "
            f"profile's {L} layers")
