"""The configurations of one point: every (pp, dp, microbatch size, recompute, schedule,
chunks) the request allows, each with the bound ``m x (F + I + W of the model) / pp``.

The busiest rank works at least the mean, and the data-parallel traffic may all hide, so
no cut and no order of a configuration takes less: the search visits the configurations
in order of an estimate and skips those whose bound cannot beat the K-th best plan.
:class:`Configs` is the part of :class:`~pipebubble.plan.scoring.Searcher` that lists them.
"""

from __future__ import annotations

from collections.abc import Iterator

from .. import limits
from .families import chunk_options
from .plans import Config


class Configs:
    """Enumeration (a part of :class:`~pipebubble.plan.scoring.Searcher`)."""

    def configs(self) -> Iterator[Config]:
        """Every configuration of this point, with its bound (module doc)."""
        req, L, pt, G = self.req, self.L, self.point, self.gpus
        for pp in limits.divisors(G):  # O(sqrt N), not N
            dp = G // pp
            if (req.pp is not None and pp not in req.pp) or (
                    req.dp is not None and dp not in req.dp):
                continue
            if pt.sharding != "ddp" and dp * pt.cp == 1:
                continue  # nothing to shard: the same plan as ddp, shown once
            if pt.sharding == "hsdp" and not self.axes.shard(dp):
                continue  # the shard group would be 1 or all of dp: ddp or fsdp
            for size in req.microbatch_sizes:
                if req.global_batch % (dp * size):
                    continue
                m = req.global_batch // (dp * size)
                if not limits.plan_microbatches_ok(m):  # bounded work per configuration
                    continue
                for rec in req.recompute:
                    work = float(self.p.at(size, rec).work.sum())
                    for name in self.names:
                        if pp == 1 and name not in req.pp1_schedules(self.names):
                            continue  # one rank: every schedule is the same plan
                        for v in chunk_options(name, req.max_chunks):
                            if req.chunks is not None and v not in req.chunks:
                                continue
                            if pp * v > L and name not in ("dualpipe",):
                                continue
                            if name == "dualpipe" and pp > L:
                                continue
                            if pp == 1 and v > 1:
                                continue
                            yield Config(pp, dp, size, m, name, v, rec, m * work / pp,
                                         pt.tp, pt.sp, pt.cp, pt.sharding)

    def nothing_divides(self) -> str:
        """The error when no configuration exists: the global batches that would split."""
        r, G = self.req, self.gpus
        pairs = sorted({(G // pp) * s for pp in limits.divisors(G)
                        for s in r.microbatch_sizes})
        B = r.global_batch
        below = max((B // d * d for d in pairs if B // d), default=None)
        above = min((B // d + 1) * d for d in pairs)
        near = f"{below} or {above}" if below else str(above)
        return (f"--global-batch {B} cannot be split into microbatches: it must be a multiple "
                f"of dp x microbatch size for some dp dividing --gpus {r.gpus} and "
                f"--microbatch-size {','.join(map(str, r.microbatch_sizes))}, i.e. of one of "
                f"{', '.join(map(str, pairs))} (nearest: {near})")
