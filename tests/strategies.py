"""Hypothesis strategies shared by the property tests: random valid schedules and costs."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from pipebubble.costs import CostModel
from pipebubble.ir.schedule import Action, Overlap, make_schedule


def random_valid_schedule(seed: int, ranks: int, chunks: int, microbatches: int, split: bool,
                          placement: str, chains: int = 1, overlap: float = 0.0):
    """A deadlock-free schedule: repeatedly pick a random action whose dependencies are done
    (in a global order) and append it to its rank's list.

    ``chains`` > 1 cuts the stages into that many independent chains (as DualPipe's two
    model copies), each running every microbatch. With probability ``overlap``, a picked
    forward is paired with a backward ready on the same rank into one Overlap step (both are
    ready at that moment, so the pair cannot deadlock)."""
    rng = random.Random(seed)
    S = ranks * chunks
    if placement == "loop":
        where = [s % ranks for s in range(S)]
    else:
        where = list(range(S))
        rng.shuffle(where)
        where = [w % ranks for w in where]
    chains = max(1, min(chains, S))
    starts = sorted({0} | set(rng.sample(range(1, S), chains - 1))) if chains > 1 else [0]
    first = set(starts)
    last = {s - 1 for s in starts[1:]} | {S - 1}
    back = "I" if split else "B"
    ready = {Action(c, "F", m) for c in starts for m in range(microbatches)}
    orders = [[] for _ in range(ranks)]

    def run(a):
        ready.discard(a)
        s, k, m = a
        if k == "F":
            ready.add(Action(s + 1, "F", m) if s not in last else Action(s, back, m))
        elif k in ("B", "I"):
            if split:
                ready.add(Action(s, "W", m))
            if s not in first:
                ready.add(Action(s - 1, back, m))

    while ready:
        a = rng.choice(sorted(ready))
        partners = sorted(b for b in ready if b.kind == back and where[b.stage] == where[a.stage])
        if overlap and a.kind == "F" and partners and rng.random() < overlap:
            b = rng.choice(partners)
            orders[where[a.stage]].append(Overlap(a, b))
            run(a)
            run(b)
        else:
            orders[where[a.stage]].append(a)
            run(a)
    return make_schedule("random", orders, S, microbatches, placement=where, chain_starts=starts)


@st.composite
def schedules_and_costs(draw):
    """A random valid schedule (Overlap pairs and several chains included) and per-stage
    costs: durations, communication, an overlap factor, memory, recomputation and (half the
    time) an all-to-all part of F and of the backward."""
    ranks = draw(st.integers(1, 5))
    chunks = draw(st.integers(1, 3))
    m = draw(st.integers(1, 6))
    split = draw(st.booleans())
    placement = draw(st.sampled_from(["loop", "random"]))
    seed = draw(st.integers(0, 2**31))
    chains = min(chunks, draw(st.sampled_from([1, 1, 2, 3])))  # Schedule.chunks >= 1
    overlap = draw(st.sampled_from([0.0, 0.5]))
    schedule = random_valid_schedule(seed, ranks, chunks, m, split, placement, chains, overlap)
    S = ranks * chunks
    times = st.floats(0.0, 5.0, allow_nan=False)
    f = draw(st.lists(times, min_size=S, max_size=S))
    b = draw(st.lists(st.floats(0.01, 5.0), min_size=S, max_size=S))
    w = [x * draw(st.floats(0.0, 1.0)) for x in b]
    comm = draw(st.sampled_from([0.0, 0.5, 1.0]))
    fold = draw(st.sampled_from([1.0, 0.75]))  # an Overlap pair's time over F + B
    mem = draw(st.lists(st.floats(0.0, 4.0), min_size=S, max_size=S))
    mem_w = [x * draw(st.floats(0.0, 1.0)) for x in mem]
    recompute = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    # the all-to-all inside F and inside B or I (expert parallelism): none, or a random part
    a2a = draw(st.booleans())
    part = st.floats(0.0, 1.0)
    a2a_f = [x * draw(part) for x in f] if a2a else 0.0
    a2a_b = [(x - y) * draw(part) for x, y in zip(b, w, strict=True)] if a2a else 0.0
    return schedule, CostModel(f=f, b=b, w=w, comm=comm, overlap=fold, activation_memory=mem,
                               weight_memory=mem_w, input_memory=[x / 4 for x in mem],
                               recompute=recompute, a2a_f=a2a_f, a2a_b=a2a_b)
