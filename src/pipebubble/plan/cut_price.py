"""A cut, priced: its per-stage CostModel and what is known before simulating it.

For a cut (the layers of each stage) :meth:`Pricing.stage_costs` sums the layers' F, I, W,
activation bytes M_B and M_W, parameters and recomputation transient per stage, and prices
the hop between stages (the largest boundary activation on the link between consecutive
pipeline ranks, :func:`~pipebubble.plan.network.p2p`) and each stage's data-parallel
traffic (:mod:`~pipebubble.plan.sharding`). The sums depend on the layers and the cut only:
they are computed once per cut and shared by every sharding and microbatch count. FSDP
resharded ``always`` moves its traffic every microbatch: each stage's F and B carry what the
per-layer prefetch does not hide of it (:meth:`Pricing._traffic_extra`), and each rank's
static memory the gathered layers in flight (:func:`~pipebubble.plan.sharding.gathered_bytes`).

:meth:`Pricing.price` adds each rank's static memory (model states under the sharding,
the largest recomputation transient) and a **lower bound** on the step that holds for
every order of the schedule: rank r starts no sooner than ``head_r``, the forwards of
microbatch 0 through the stages before its first one (and the hops between ranks); then
works ``busy_r``, exposes its data-parallel traffic and runs its optimizer step. Its last
backward of an input gradient (I or B) comes no sooner than ``head_r + busy_r - W_r``
(every W may follow it), and the gradient still has to reach its chain's first stage:
``tail_r``, the I (or B) of every stage before r's stage, and the hops; that stage's rank
then still exposes its traffic and steps (at least the least of any rank). The search
skips a cut whose bound cannot beat the K-th best plan.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..costs import CostModel
from ..ir.deps import Layout, precedences
from ..ir.schedule import Action, Kind, Schedule
from .axes import Axes
from .layercosts import LayerCosts
from .network import p2p
from .partition import Ranges
from .plans import Config, Priced
from .schedule_facts import ScheduleFacts
from .search_cache import PointCache, SearchCache
from .sharding import gathered_bytes

OPT_MARGIN = 1 - 1e-12  # the optimizer term, linear here, rounds apart from the scored one


@lru_cache(maxsize=256)
def fill_drain_links(stage_to_rank: tuple[int, ...], chain_starts: tuple[int, ...]
                     ) -> tuple[tuple[int, int, bool, int, bool], ...]:
    """The edges the bound's fill and drain follow, from the dependency rule
    (:func:`~pipebubble.ir.deps.precedences` of one microbatch's F and I): per stage ``s``,
    ``(s, fill_from, crosses, drain_to, crosses)``: the stage whose F its F waits for (-1:
    it starts a chain; its fill is that stage's fill plus its F), and the stage whose I
    waits for its I, the gradient's next stage on its way back (-1: a chain's first stage;
    its drain is that stage's drain plus its I), each with whether the edge crosses ranks.
    In an order where both come before ``s``; once per placement.

    >>> [link[1:4] for link in fill_drain_links((0, 1, 1, 0), (0,))]
    [(-1, False, -1), (0, True, 0), (1, False, 1), (2, True, 2)]
    """
    S = len(stage_to_rank)
    one = [Action(s, k, 0) for k in (Kind.F, Kind.I) for s in range(S)]
    fill: list[tuple[int, bool]] = [(-1, False)] * S
    drain: list[tuple[int, bool]] = [(-1, False)] * S
    for e in precedences(one, Layout(S, stage_to_rank, chain_starts)):
        a, b = e.before, e.after
        if a.stage == b.stage:
            continue  # F before its own I: not on either way
        if a.kind == b.kind == Kind.F:
            fill[b.stage] = (a.stage, e.crosses)
        elif a.kind == b.kind == Kind.I:  # I(b) waits for I(a): a drains through b
            drain[a.stage] = (b.stage, e.crosses)
    out, state = [], [0] * S  # predecessors first, depth first (0 new, 1 open, 2 placed)
    for first in range(S):
        stack = [first]
        while stack:
            s = stack[-1]
            if state[s] == 2:
                stack.pop()
                continue
            state[s] = 1
            wait = [q for q in (fill[s][0], drain[s][0]) if q >= 0 and state[q] != 2]
            if any(state[q] == 1 for q in wait):
                raise ValueError("the rule's fill and drain edges form a cycle")
            if wait:
                stack += wait
                continue
            state[s] = 2
            out.append((s, *fill[s], *drain[s]))
            stack.pop()
    return tuple(out)


@lru_cache(maxsize=256)
def embedding_copies(stage_to_rank: tuple[int, ...], chain_starts: tuple[int, ...]
                     ) -> tuple[tuple[int, int], ...]:
    """Where a tied embedding needs a copy beside its head: per head whose rank holds no
    embedding yet, ``(the rank of its chain's first stage, the head's rank)``, each such
    head rank once. Every chain is a whole copy of the model cut the same way (DualPipe's
    two chains share the weights), so a rank holds the embedding when it holds a chain's
    first stage. The head (in its chain's last stage) needs no copy when its rank holds
    one: a V placement (rank 0 holds the chain's first and last stage) or DualPipe (the
    head of one chain sits on the rank of the other chain's first stage, whose embedding
    the copies' own sync keeps equal). Each copy's gradient is all-reduced with the
    embedding's rank (:meth:`~pipebubble.plan.axes.Axes.tied_allreduce`).

    >>> embedding_copies((0, 1, 2, 3, 0, 1, 2, 3), (0,))  # loop: a copy on rank 3
    ((0, 3),)
    >>> embedding_copies((0, 1, 1, 0), (0,)), embedding_copies((0, 1, 1, 0), (0, 2))
    ((), ())
    """
    S = len(stage_to_rank)
    ends = list(chain_starts) + [S]
    holds = {stage_to_rank[s] for s in chain_starts}
    out: list[tuple[int, int]] = []
    for k, first in enumerate(chain_starts):
        head = stage_to_rank[ends[k + 1] - 1]
        if head not in holds and all(b != head for _, b in out):
            out.append((stage_to_rank[first], head))
    return tuple(out)


@lru_cache(maxsize=256)
def copy_partners(stage_to_rank: tuple[int, ...], chain_starts: tuple[int, ...]
                  ) -> tuple[tuple[int, int], ...]:
    """The rank pairs holding the same stage of different chains: per pair ``(r, q)``,
    ``r < q``, once. Every chain is a whole copy of the model cut the same way (DualPipe:
    stage ``j`` of the first chain on rank ``j``, of the second on rank ``p - 1 - j``), so
    the two copies' gradients of a stage are summed before the optimizer steps
    (:meth:`~pipebubble.plan.axes.Axes.copy_allreduce`; DualPipe's example sums each rank's
    two stages with rank ``p - 1 - r``'s).

    >>> copy_partners((0, 1, 2, 3, 3, 2, 1, 0), (0, 4))  # DualPipe, 4 ranks
    ((0, 3), (1, 2))
    >>> copy_partners((0, 1, 2, 3, 0, 1, 2, 3), (0,)), copy_partners((0, 1, 1, 0), (0,))
    ((), ())
    """
    if len(chain_starts) < 2:
        return ()
    first = chain_starts[0]
    size = chain_starts[1] - first
    pairs: set[tuple[int, int]] = set()
    for start in chain_starts[1:]:
        for j in range(size):
            r, q = stage_to_rank[first + j], stage_to_rank[start + j]
            if r != q:
                pairs.add((min(r, q), max(r, q)))
    return tuple(sorted(pairs))


class Pricing:
    """Pricing cuts (module doc): a part of :class:`~pipebubble.plan.scoring.Searcher`.

    Inputs: the point's ``axes`` (its traffic, bytes per parameter and optimizer), the
    search's ``cache`` (sums per layer costs and cut, shared by every point), the point's
    own ``point`` cache (what depends on its sharding) and the schedules' ``facts`` (whether
    a schedule splits its backward). Each is made fresh when not given."""

    def __init__(self, axes: Axes, cache: SearchCache | None = None,
                 point: PointCache | None = None, facts: ScheduleFacts | None = None):
        self.axes = axes
        cache = SearchCache() if cache is None else cache
        point = PointCache() if point is None else point
        self.facts = ScheduleFacts(cache) if facts is None else facts
        self._prefixes, self._sums, self._ranks = cache.prefixes, cache.sums, cache.ranks
        self._sync_times, self._exposures = point.sync_times, point.exposures
        self._stage_costs, self._tails = point.stage_costs, point.tails
        self._fsdp_layers = point.fsdp_layers

    def _prefix(self, lc: LayerCosts) -> dict[str, np.ndarray]:
        """Prefix sums of the layers' columns (once per layer costs)."""
        got = self._prefixes.get(id(lc))
        if got is None or got[0] is not lc:
            sums = {k: np.concatenate(([0.0], np.cumsum(getattr(lc, k))))
                    for k in ("params", "f", "i", "w", "act", "act_w")
                    + tuple(k for k in ("hidden", "expert", "a2a_f", "a2a_b")
                            if getattr(lc, k) is not None)}
            got = self._prefixes[id(lc)] = (lc, sums)
        return got[1]

    def _cut_sums(self, lc: LayerCosts, S: int, ranges: Ranges, rkey: tuple | None = None
                  ) -> tuple:
        """Per stage (all ``S``; stage s holds ``ranges[s mod len(ranges)]``): parameters,
        F, I, W, M_B, M_W, transient; and the largest boundary activation (bytes sent)."""
        key = (id(lc), S, tuple(ranges) if rkey is None else rkey)
        got = self._sums.get(key)
        if got is not None and got[0] is lc:
            return got[1]
        S_c = len(ranges)
        idx = [ranges[s % S_c] for s in range(S)]
        q = self._prefix(lc)

        def total(name: str) -> list[float]:
            p = q[name]
            return [float(p[b + 1] - p[a]) for a, b in idx]

        params = np.array(total("params"))
        f, i, w, act, act_w = (total(k) for k in ("f", "i", "w", "act", "act_w"))
        transient = np.array([float(lc.transient[a:b + 1].max()) for a, b in idx])
        sent = max((float(lc.out[b]) for k, (a, b) in enumerate(ranges) if k < S_c - 1),
                   default=0.0)
        out = (params, f, [x + y for x, y in zip(i, w, strict=True)], w, act,
               [min(x, y) for x, y in zip(act_w, act, strict=True)], transient, sent)
        self._sums[key] = (lc, out)
        return out

    def _sync_time(self, c: Config, params: float) -> float:
        """Both parts of the data-parallel traffic of ``params`` (before + after)."""
        key = (c.dp, c.pp, params)
        got = self._sync_times.get(key)
        if got is None:
            got = self._sync_times[key] = self.axes.sync(c.dp, c.pp).times(params, c.pp)
        return got

    def _expert_sync_time(self, c: Config, params: float) -> tuple[float, float]:
        """Both parts of the experts' traffic over their expert-data-parallel group."""
        if params <= 0:
            return 0.0, 0.0
        key = ("experts", c.dp, c.pp, params)
        got = self._sync_times.get(key)
        if got is None:
            got = self._sync_times[key] = self.axes.expert_sync(c.dp, c.pp).times(params, c.pp)
        return got

    def _stage_column(self, lc: LayerCosts, name: str, ranges: Ranges, S: int
                      ) -> list[float] | None:
        """Per stage, the sum of the optional column ``name`` (None when absent)."""
        if getattr(lc, name) is None:
            return None
        q = self._prefix(lc)[name]
        S_c = len(ranges)
        return [float(q[ranges[s % S_c][1] + 1] - q[ranges[s % S_c][0]]) for s in range(S)]

    def rank_optimizer(self, c: Config, params: float, expert: float = 0.0) -> float:
        """The optimizer step of a rank's ``params`` local parameters, ``expert`` of them
        experts' (sharded over the expert-data-parallel group)."""
        if expert <= 0:
            return self.axes.optimizer_time(c.dp, params)
        return (self.axes.optimizer_time(c.dp, params - expert)
                + self.axes.expert_optimizer_time(c.dp, expert))

    def _layer_traffic(self, c: Config, lc: LayerCosts) -> tuple | None:
        """Under FSDP resharded ``always`` (:mod:`~pipebubble.plan.sharding`), per layer
        ``l``: one gather ``AG_l`` and one reduce-scatter ``RS_l`` of its parameters, and
        the prefix sums of what the prefetch does not hide, ``max(0, AG_l - F_{l-1})``
        (forward) and ``max(0, AG_l + RS_{l+1} - B_{l+1})`` (backward); None otherwise."""
        sync = self.axes.sync(c.dp, c.pp)
        if not sync.per_microbatch:
            return None
        memo = self._fsdp_layers
        key = (id(lc), c.dp, c.pp)
        got = memo.get(key)
        if got is None or got[0] is not lc:
            ex = lc.expert if lc.expert is not None else [0.0] * len(lc.params)
            es = self.axes.expert_sync(c.dp, c.pp)  # the experts' own group (plan/axes.py)
            traffic = []
            for P, E in zip(lc.params, ex, strict=True):
                g, r = sync.layer_traffic(float(P - E))
                if E > 0:
                    eg, er = es.layer_traffic(float(E))
                    g, r = g + eg, r + er
                traffic.append((g, r))
            ag = np.array([t[0] for t in traffic])
            rs = np.array([t[1] for t in traffic])
            f, b = lc.f, lc.i + lc.w
            qf = np.concatenate(([0.0], np.cumsum(np.maximum(0.0, ag[1:] - f[:-1]))))
            qb = np.concatenate(([0.0], np.cumsum(np.maximum(0.0, ag[:-1] + rs[1:] - b[1:]))))
            got = memo[key] = (lc, (ag.tolist(), rs.tolist(), qf.tolist(), qb.tolist()))
        return got[1]

    def _traffic_extra(self, c: Config, lc: LayerCosts, idx: list) -> tuple | None:
        """Per stage (layers ``a..b`` each), the seconds one microbatch's forward and
        backward expose of FSDP's per-microbatch traffic (:mod:`~pipebubble.plan.sharding`):
        ``AG_a + sum_{l=a+1..b} max(0, AG_l - F_{l-1})`` and ``AG_b + sum_{l=a..b-1}
        max(0, AG_l + RS_{l+1} - B_{l+1}) + RS_a``; None when there is none."""
        t = self._layer_traffic(c, lc)
        if t is None:
            return None
        ag, rs, qf, qb = t
        fe = [ag[a] + qf[b] - qf[a] for a, b in idx]
        be = [ag[b] + qb[b] - qb[a] + rs[a] for a, b in idx]
        return fe, be

    def gathered(self, c: Config, lc: LayerCosts, sched: Schedule, ranges: Ranges
                  ) -> list[float] | None:
        """Per rank, the gathered layers FSDP resharded ``always`` holds at once (the
        largest of its stages', :func:`~pipebubble.plan.sharding.gathered_bytes`); None when
        there is no such transient."""
        if not self.axes.sync(c.dp, c.pp).per_microbatch:
            return None
        w, g, _ = self.axes.state_bytes
        S_c = len(ranges)
        out = [0.0] * c.pp
        for s, r in enumerate(sched.stage_to_rank):
            a, b = ranges[s % S_c]
            out[r] = max(out[r], gathered_bytes(lc.params[a:b + 1], w, g))
        return out

    def stage_costs(self, c: Config, sched: Schedule, lc: LayerCosts, ranges: Ranges,
                    split: bool | None = None, rkey: tuple | None = None
                    ) -> tuple[CostModel, np.ndarray, np.ndarray]:
        """The per-stage CostModel for a cut, the stages' parameters and transients; with a
        split backward (``split``, None: ask the schedule) an I also carries what B hides
        behind its W (``LayerCosts.hidden``, as ``CostModel.i_extra``). ``rkey``:
        ``tuple(ranges)``, when the caller has it."""
        S = sched.num_stages
        split = lc.hidden is not None and (self.facts.split(sched) if split is None else split)
        rkey = tuple(ranges) if rkey is None else rkey
        key = (id(lc), S, rkey, c.dp, c.pp, split)  # the placement does not matter
        got = self._stage_costs.get(key)
        if got is not None and got[0] is lc:
            return got[1]
        params, f, b, w, act, act_w, transient, sent = self._cut_sums(lc, S, ranges, rkey)
        S_c = len(ranges)
        extra_fb = self._traffic_extra(c, lc, [ranges[s % S_c] for s in range(S)])
        if extra_fb is not None:  # FSDP's per-microbatch traffic, what prefetch leaves
            f = [x + e for x, e in zip(f, extra_fb[0], strict=True)]
            b = [x + e for x, e in zip(b, extra_fb[1], strict=True)]
        comm = p2p(sent, self.axes.hop(c.dp)) if S > 1 else 0.0
        experts = self._stage_column(lc, "expert", ranges, S)
        if experts is None:
            ar = [sum(self._sync_time(c, p)) for p in params]
        else:  # the experts' gradients reduce over their own group (plan/expert.py)
            ar = [sum(self._sync_time(c, p - e)) + sum(self._expert_sync_time(c, e))
                  for p, e in zip(params, experts, strict=True)]
        if split:
            q = self._prefix(lc)["hidden"].tolist()
            S_c = len(ranges)
            extra = [q[ranges[s % S_c][1] + 1] - q[ranges[s % S_c][0]] for s in range(S)]
        else:
            extra = 0.0
        a2a_f = self._stage_column(lc, "a2a_f", ranges, S) or 0.0
        a2a_b = self._stage_column(lc, "a2a_b", ranges, S) or 0.0
        costs = CostModel(f=f, b=b, w=w, comm=comm, activation_memory=act,
                          weight_memory=act_w, allreduce=ar, i_extra=extra,
                          a2a_f=a2a_f, a2a_b=a2a_b, comm_sms=lc.comm_sms)
        self._stage_costs[key] = (lc, (costs, params, transient))
        return costs, params, transient

    def price(self, c, sched, lc, ranges, split: bool | None = None,
               split_only: bool = False) -> Priced:
        """A cut's costs, each rank's static memory and the lower bound of the module doc.
        ``split``: whether W is split from the backward (None: ask the schedule);
        ``split_only``: the bound of orders with no fused backward (B) at all, whatever
        ``sched``'s orders (auto's searched orders: every backward an I and a W)."""
        rkey = tuple(ranges)
        if split is None:
            split = self.facts.split(sched)
        costs, params, transient = self.stage_costs(c, sched, lc, ranges, split, rkey)
        traffic = ((tuple(costs.f), tuple(costs.b)) if self.axes.sync(c.dp, c.pp).per_microbatch
                   else None)  # F and B then carry FSDP's per-microbatch traffic
        head, tail, busy, late, rank_params, trans, fwd, bwd = self._rank_sums(
            sched, lc, ranges, costs, split, rkey, split_only, traffic)
        # What follows the work (exposed traffic, optimizer, static memory) depends on the
        # costs and the placement only, not on the order or m: once per (costs, placement).
        tkey = (id(costs), sched.stage_to_rank)
        got = self._tails.get(tkey)
        if got is None or got[0] is not costs:
            got = self._tails[tkey] = (costs, *self._rank_tails(
                c, sched, lc, ranges, params, rank_params, trans, fwd, bwd))
        _, ar, done, first, static, rank_params, rank_expert = got
        bound = max(max(h + b + d, h + b - w + t + first) for h, b, d, w, t in
                    zip(head, busy, done, late, tail, strict=True))
        return Priced(ranges, costs, bound, static, ar, rank_params, rank_expert)

    def _rank_tails(self, c, sched, lc, ranges, params, rank_params, trans, fwd, bwd
                    ) -> tuple:
        """Per rank of a priced cut: the exposed data-parallel traffic, what it and the
        optimizer step add after the work (``done``) and their least (``first``), the static
        memory and the parameters (tied copies counted): :meth:`price`'s bound and memory
        beyond the work."""
        where = np.asarray(sched.stage_to_rank)
        ends = embedding_copies(sched.stage_to_rank, sched.chain_starts) if lc.tied else ()
        copies = [b for _, b in ends]  # tied embedding copies, on the heads' ranks
        if copies:  # (layercosts.LayerCosts.tied); Axes.tied_allreduce
            rank_params = [P + lc.tied * copies.count(r) for r, P in enumerate(rank_params)]
        experts = self._stage_column(lc, "expert", ranges, len(where))
        rank_expert = (np.bincount(where, weights=experts, minlength=c.pp).tolist()
                       if experts is not None else None)
        if c.dims.data_context == 1:
            ar = [0.0] * c.pp
        else:
            seen: dict = {}  # ranks alike: asked once
            ar = []
            for key in zip(rank_params, fwd, bwd, rank_expert or [0.0] * c.pp, strict=True):
                x = seen.get(key)
                if x is None:
                    x = seen[key] = self._exposed(c, *key)
                ar.append(x)
        for a, b in ends:
            t = self.axes.tied_allreduce(c.dp, c.pp, lc.tied)
            ar = [x + t * ((r == a) + (r == b)) for r, x in enumerate(ar)]
        for a, b in copy_partners(sched.stage_to_rank, sched.chain_starts):
            # two copies of the same stages: their gradients summed (each rank holds the
            # same parameters as its partner, so either one's counts serve)
            t = self.axes.copy_allreduce(c.dp, c.pp, b - a, rank_params[a],
                                         rank_expert[a] if rank_expert is not None else 0.0)
            ar[a] += t
            ar[b] += t
        k = self._optimizer_rate(c)
        done = [a + k * P for a, P in zip(ar, rank_params, strict=True)]
        if rank_expert is not None:  # experts: their shard of the expert-data-parallel group
            ke = self.axes.expert_optimizer_time(c.dp, 1.0) * OPT_MARGIN - k
            done = [d + ke * E for d, E in zip(done, rank_expert, strict=True)]
        first = min(done)  # the rank the gradient reaches last still exposes and steps
        bpp = self.axes.bytes_per_param(c.dp, c.pp)
        # bincount adds in stage order, as ``static[r] += bpp x params[s]`` would
        static = np.bincount(where, weights=bpp * params, minlength=c.pp).tolist()
        if experts is not None:  # experts' states over the expert-data-parallel group
            more = self.axes.expert_bytes_per_param(c.dp, c.pp) - bpp
            static = [x + more * E for x, E in zip(static, rank_expert, strict=True)]
        for r in copies:
            static[r] += bpp * lc.tied
        gathered = self.gathered(c, lc, sched, ranges)
        if gathered is not None:  # FSDP resharded always: the layers in flight
            static = [x + y for x, y in zip(static, gathered, strict=True)]
        return (ar, done, first, [x + t for x, t in zip(static, trans, strict=True)],
                rank_params, rank_expert)

    def _optimizer_rate(self, c: Config) -> float:
        """Seconds of optimizer step per local parameter at ``c``'s dp (the step is linear in
        the parameters, :mod:`~pipebubble.plan.optimizer`), a hair low for rounding."""
        key = ("optimizer", c.dp)
        got = self._exposures.get(key)
        if got is None:
            got = self._exposures[key] = self.axes.optimizer_time(c.dp, 1.0) * OPT_MARGIN
        return got

    def _rank_sums(self, sched: Schedule, lc: LayerCosts, ranges: Ranges, costs: CostModel,
                   split: bool, rkey: tuple | None = None, split_only: bool = False,
                   traffic: tuple | None = None) -> tuple:
        """Per rank: ``head``, ``tail``, ``busy``, ``late`` of the bound (module doc), its
        parameters, largest transient, and one microbatch's forward and backward. They do
        not depend on the sharding: computed once per (schedule, cut, hop time).
        ``split_only``: for orders whose every backward is split (see :meth:`price`);
        ``traffic``: a key for F and B when they carry FSDP's per-microbatch traffic."""
        rkey = tuple(ranges) if rkey is None else rkey
        key = (id(sched), id(lc), rkey, costs.comm, split, split_only, traffic)
        got = self._ranks.get(key)
        if got is not None and got[0] is sched and got[1] is lc:
            return got[2]
        p, M = sched.num_ranks, sched.num_microbatches
        where = sched.stage_to_rank
        params, _, _, _, _, _, transient, _ = self._cut_sums(lc, sched.num_stages, ranges,
                                                             rkey)
        busy, trans, rank_params = [0.0] * p, [0.0] * p, [0.0] * p
        fwd, bwd = [0.0] * p, [0.0] * p
        late = [0.0] * p  # work that may follow the rank's last input-gradient action
        head, tail = [math.inf] * p, [math.inf] * p
        cf, cb, cw, comm = costs.f, costs.b, costs.w, costs.comm
        ie = costs.i_extra if isinstance(costs.i_extra, list) else [0.0] * len(cb)
        # An I costs ie more than B - W: every backward pays it where none is fused (B).
        every = split and (split_only or (self.facts.split(sched)
                                          and not self.facts.kinds(sched)[1]))
        inc = [x if every else 0.0 for x in ie]
        # The fill and the drain along the rule's edges (fill_drain_links): microbatch 0's
        # forwards up to each stage, and each stage's input gradient down to its chain's
        # first stage; a stage's predecessor on each way comes first.
        fill, drain = [0.0] * len(where), [0.0] * len(where)
        for s, fq, f_cross, dq, d_cross in fill_drain_links(where, sched.chain_starts):
            if fq >= 0:
                fill[s] = fill[fq] + (cf[fq] + (comm if f_cross else 0.0))
            if dq >= 0:
                drain[s] = drain[dq] + ((min(cb[dq], cb[dq] - cw[dq] + ie[dq]) if split
                                         else cb[dq]) + (comm if d_cross else 0.0))
        for s, r in enumerate(where):
            before, after = fill[s], drain[s]
            if before < head[r]:
                head[r] = before
            if after < tail[r]:
                tail[r] = after
            busy[r] += M * (cf[s] + cb[s] + inc[s])
            late[r] += M * cw[s] if split else 0.0
            rank_params[r] += params[s]
            fwd[r] += cf[s]
            bwd[r] += cb[s] + ie[s]  # a split backward's I + W (the bound keeps B's cb)
            trans[r] = max(trans[r], transient[s])
        out = (head, tail, busy, late, rank_params, trans, fwd, bwd)
        self._ranks[key] = (sched, lc, out)
        return out

    def _exposed(self, c: Config, params: float, fwd: float, bwd: float,
                 expert: float = 0.0) -> float:
        """:meth:`~pipebubble.plan.sharding.Sync.exposed` of a rank (ranks alike: once);
        ``expert`` of its ``params`` reduce over the expert-data-parallel group, behind the
        same backward (their times added)."""
        key = (c.dp, c.pp, params, fwd, bwd, expert)
        got = self._exposures.get(key)
        if got is None:
            times = self._sync_time(c, params - expert)
            if expert > 0:
                more = self._expert_sync_time(c, expert)
                times = (times[0] + more[0], times[1] + more[1])
            got = self._exposures[key] = self.axes.sync(c.dp, c.pp).exposed(
                times, fwd, bwd, params)
        return got
