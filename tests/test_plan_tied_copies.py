"""A tied embedding's copy beside the head, by placement: the head's rank keeps a copy (its
weights, gradients, optimizer state, and an all-reduce of its gradient with the embedding's
rank) only where it holds no embedding already. Loop placements (1F1B, interleaved): the
head is on rank pp - 1, which holds no first stage: one copy. V (ZB-V): rank 0 holds the
first and the last stage: none. DualPipe: rank pp - 1 holds chain 0's head and chain 1's
first stage (the same weights), rank 0 chain 1's head and chain 0's first stage: none."""

import pytest

from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.cut_price import copy_partners, embedding_copies
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.network import allreduce
from pipebubble.plan.planner import Request, build_points
from pipebubble.plan.scoring import SearchCache, Searcher

PP = 4
# the ranks that keep a copy, counted by hand from each placement (stage -> rank):
# 1f1b 0 1 2 3; interleaved 0 1 2 3 0 1 2 3; zbv 0 1 2 3 3 2 1 0; dualpipe 0 1 2 3 | 3 2 1 0
COPIES = {"1f1b": [3], "interleaved-1f1b": [3], "zbv": [], "dualpipe": []}


def _searcher(shape):
    prof = ProfileSet([shape_profile(shape, 512, 1)])
    req = Request(gpus=PP, gpu_memory=1e15, global_batch=16, microbatch_sizes=(1,),
                  recompute=("none",), tp=(1,), cp=(1,), pp=(PP,), dp=(1,),
                  shardings=("ddp",), max_chunks=2, schedules=tuple(COPIES))
    (_, costs, axes), = build_points(prof, req, get_hardware("a100-80gb"))
    return Searcher(costs, req, axes, SearchCache())


def test_the_copies_follow_the_placement():
    assert embedding_copies((0, 1, 2, 3), (0,)) == ((0, 3),)
    assert embedding_copies((0, 1, 2, 3, 0, 1, 2, 3), (0,)) == ((0, 3),)
    assert embedding_copies((0, 1, 2, 3, 3, 2, 1, 0), (0,)) == ()
    assert embedding_copies((0, 1, 2, 3, 3, 2, 1, 0), (0, 4)) == ()
    assert embedding_copies((0, 1), (0,)) == ((0, 1),)
    # two chains whose heads sit on ranks without a first stage: one copy each rank
    assert embedding_copies((0, 1, 0, 1), (0, 2)) == ((0, 1),)


@pytest.mark.parametrize("name", sorted(COPIES))
def test_tied_memory_and_allreduce_by_hand(name):
    """Each rank's static bytes are ``bytes/param x`` (its stages' parameters, plus the
    vocabulary x hidden copy on the ranks of COPIES); its exposed traffic at dp = 1 is only
    the copy's all-reduce, on the copy's rank and on rank 0 (the embedding's)."""
    shape = TransformerShape(layers=8, hidden=256, ffn=1024, heads=8, vocab=30000,
                             tied_embeddings=True, swiglu=False)
    s = _searcher(shape)
    lc = s.p.at(1, "none")
    assert lc.tied == shape.vocab * shape.hidden and not lc.transient.any()
    c = next(c for c in s.configs() if c.schedule == name and c.pp == PP
             and (c.chunks == 2 or name != "interleaved-1f1b"))
    sched = s.schedule(c)
    S_c = sched.num_stages // sched.chains
    L = len(lc.params)
    ranges = [(k * L // S_c, (k + 1) * L // S_c - 1) for k in range(S_c)]
    pr = s.pricing.price(c, sched, lc, ranges)
    bpp = s.axes.bytes_per_param(c.dp, c.pp)
    copies = COPIES[name]
    for r in range(PP):
        mine = [ranges[st % S_c] for st, q in enumerate(sched.stage_to_rank) if q == r]
        held = sum(float(lc.params[a:b + 1].sum()) for a, b in mine)
        assert pr.static[r] == pytest.approx(bpp * (held + lc.tied * (r in copies)), rel=1e-12)
        assert pr.rank_params[r] == pytest.approx(held + lc.tied * (r in copies), rel=1e-12)
    t = s.axes.tied_allreduce(c.dp, c.pp, lc.tied)
    assert t > 0
    want = [t * (r in copies or (bool(copies) and r == 0)) for r in range(PP)]
    if sched.chains == 2:  # DualPipe: rank r and rank PP-1-r hold the same two stages, and
        # all-reduce their gradients (dp = 1: all of them), PP-1-2r stages apart
        for r in range(PP):
            link = s.axes.net.hop(abs(PP - 1 - 2 * r))  # tp = cp = dp = 1: ranks apart
            want[r] += allreduce(s.axes.grad_bytes * pr.rank_params[r], 2, link)
    assert pr.exposed == pytest.approx(want, rel=1e-12, abs=1e-15)
    # cut (b)'s memory rows: the copy on the head's layer where (and only where) it is kept
    held = s.held(sched)
    rows = s.cuts.memory_matrix(lc, c, sched, held)
    plain = s.cuts.memory_matrix(type(lc)(**{**lc.__dict__, "tied": 0.0}), c, sched, held)
    extra = rows - plain
    assert extra[-1, -1] == pytest.approx(bpp * lc.tied if copies else 0.0)
    extra[-1, -1] = 0.0
    assert not extra.any()


def test_the_copy_partners_follow_the_chains():
    """Ranks that hold the same stage of DualPipe's two chains sum their gradients."""
    assert copy_partners((0, 1, 2, 3, 3, 2, 1, 0), (0, 4)) == ((0, 3), (1, 2))
    assert copy_partners((0, 1, 1, 0), (0, 2)) == ((0, 1),)
    for one_chain in ((0, 1, 2, 3), (0, 1, 2, 3, 3, 2, 1, 0)):
        assert copy_partners(one_chain, (0,)) == ()
