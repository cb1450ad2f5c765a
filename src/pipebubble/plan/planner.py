"""Choose pp, dp, microbatch size, schedule, chunks and recomputation under a memory budget.

The planner is a loop around two exact pieces (DESIGN.md): the min-max partitioner and the
simulator. A *configuration* is (pp, dp = gpus / pp, microbatch size, schedule, chunks,
recompute); the global batch fixes ``m = global_batch / (dp x size)``. For each one:

1. **Cut** the layers into the schedule's stages. When there are at most ``exhaustive_cuts``
   ways to cut, every cut is scored; otherwise (a) the min-max cut of what each layer adds
   to its rank's step, ``m x (F + I + W)`` plus its share of the all-reduce
   (:func:`~pipebubble.plan.partition.min_max_partition`), and when ranks hold several
   stages its refinement by :func:`~pipebubble.plan.scoring.balance_ranks` (the faster that
   fits); if neither fits, (b) the same
   with a memory cap per stage (``budget / stages per rank``; a stage's memory bound is its
   weights plus the most microbatches it holds at once times its activation bytes), which
   then fits by construction. ``auto`` is searched on the min-max cut (a) only. Each plan's
   ``cut_search`` says which it got (``exhaustive``, ``min-max``, ``min-max-capped``). When
   nothing fits, the error names the least budget at which some configuration has a plan:
   the least peak over every cut, or over cut (a) and (b) (bisection on the cap for (b)),
   and for ``auto`` its cut's static bytes plus one microbatch of each stage per rank
   (``schedules.auto.bounds.min_limits``: below it no order exists, at it one does).

What the search claims is exact for its candidates: the K fastest plans over every
configuration, each with the cuts above (every cut up to ``exhaustive_cuts``, the rule
beyond); ``tests/test_plan.py`` checks it against brute force over every configuration and
every cut (small instances) and over every candidate of the rule (beyond 64 cuts). The rule
is not a proof of the best cut: ``bench/bench_plan.py --cut-gap`` measures how far it is.
2. **Price** it: per stage F, I (recomputation included), W, activation bytes M_B and M_W;
   P2P time per hop = bytes sent / ``p2p_bandwidth`` + ``latency``; the data-parallel ring
   all-reduce of each stage's gradients, ``2 (D-1)/D x bytes / allreduce_bandwidth +
   2 (D-1) x latency`` (:mod:`pipebubble.sim.dataparallel`), after the rank's last action.
3. **Simulate** it (:func:`pipebubble.sim.simulate`): step time = ``max_r (end_r +
   all-reduce of r's stages)``; peak memory per rank = its weights, gradients and optimizer
   state (``bytes_per_param`` x parameters) + the simulated activation peak + what
   recomputation re-materialises during one layer's backward. It fits if every rank's peak
   is within ``gpu_memory``.

Closed forms only prune, and only with true lower bounds: no configuration can take less
than ``m x (F + I + W of the whole model) / pp`` plus its share of the all-reduce, nor less
than any rank's work after the cut plus the fill before it and the drain after it
(:meth:`Searcher._price <pipebubble.plan.scoring.Searcher._price>`).
Configurations whose bound passes the K-th best step found so far are skipped; a rough
estimate of their step (the bound and a 1F1B-like bubble) only orders the visit.

Four equal layers (F = 1 s, B = 2 s per microbatch, no weights) on 2 GPUs, global batch 4:
pp = 1, dp = 2 runs m = 2 microbatches in 2 x 4 x 3 = 24 s; pp = 2 (1F1B, two layers per
stage, m = 4) takes (m + p - 1)(F + B) = 5 x 6 = 30 s.

>>> from pipebubble.plan.profile import Profile
>>> layer = {"forward": 1, "backward": 2, "params": 0, "activation_bytes": 0, "flops": 0}
>>> prof = Profile.from_dict({"batch": 1, "layers": [{"name": str(i), **layer}
...                                                   for i in range(4)]})
>>> res = search(ProfileSet([prof]), Request(gpus=2, gpu_memory=1, global_batch=4,
...              microbatch_sizes=(1,), schedules=("1f1b",), recompute=("none",), latency=0))
>>> [(p.pp, p.dp, p.microbatches, p.step_time) for p in res.plans]
[(1, 2, 2, 24.0), (2, 1, 4, 30.0)]
"""

from __future__ import annotations

import math
import time

from ..errors import UserError
from .families import _auto_function, chunk_options, held_per_stage, schedule_list
from .layercosts import ProfileSet
from .plans import AUTO, Config, NoPlanFits, Plan, Request, Result, fmt_gib
from .scoring import Searcher

__all__ = ["AUTO", "Config", "NoPlanFits", "Plan", "Request", "Result", "Searcher",
           "chunk_options", "fmt_gib", "held_per_stage", "schedule_list", "search",
           "_auto_function"]


# ---- the search -------------------------------------------------------------------------------

def search(profiles: ProfileSet, req: Request) -> Result:
    """The ``req.top`` fastest plans that fit, fastest first (see the module doc)."""
    req.check()
    t0 = time.perf_counter()
    s = Searcher(profiles, req)
    configs = list(s.configs())
    if not configs:
        raise UserError(s.nothing_divides())
    # Likely winners first (the bound plus a 1F1B-like fill and drain of (pp - 1) / (m v)),
    # so the K-th best step, below which everything else must come, drops early.
    configs.sort(key=lambda c: c.bound * (1 + (c.pp - 1) / (c.microbatches * c.chunks)))
    best: list[Plan] = []
    for c in configs:
        full = req.prune and len(best) >= req.top
        if full and c.bound >= best[-1].step_time:
            continue  # no cut of c can enter the top K
        threshold = best[-1].step_time if full else math.inf
        plan = s.evaluate(c, threshold, req.gpu_memory)
        if plan is not None:
            best.append(plan)
            best.sort(key=_order)
            del best[req.top:]
    if not best:
        raise s.no_fit(configs)
    return Result(best, len(configs), s.simulated, time.perf_counter() - t0, s.req)


def _order(p: Plan) -> tuple:
    c = p.config
    return (p.step_time, max(p.peak_memory), c.pp, c.schedule, c.chunks, c.microbatch_size,
            c.recompute)


