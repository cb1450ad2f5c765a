"""Hypothesis strategies shared by the property tests: random valid schedules and costs."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from pipebubble.costs import CostModel
from pipebubble.ir.schedule import Action, make_schedule


def random_valid_schedule(seed: int, ranks: int, chunks: int, microbatches: int, split: bool,
                          placement: str):
    """A deadlock-free schedule: repeatedly pick a random action whose dependencies are done
    (in a global order) and append it to its rank's list."""
    rng = random.Random(seed)
    S = ranks * chunks
    if placement == "loop":
        where = [s % ranks for s in range(S)]
    else:
        where = list(range(S))
        rng.shuffle(where)
        where = [w % ranks for w in where]
    done: set[Action] = set()
    ready = {Action(0, "F", m) for m in range(microbatches)}
    orders = [[] for _ in range(ranks)]
    while ready:
        a = rng.choice(sorted(ready))
        ready.discard(a)
        done.add(a)
        orders[where[a.stage]].append(a)
        s, k, m = a
        if k == "F":
            if s + 1 < S:
                ready.add(Action(s + 1, "F", m))
            else:
                ready.add(Action(s, "I" if split else "B", m))
        elif k in ("B", "I"):
            if split:
                ready.add(Action(s, "W", m))
            if s > 0:
                ready.add(Action(s - 1, "I" if split else "B", m))
    return make_schedule("random", orders, S, microbatches, placement=where)


@st.composite
def schedules_and_costs(draw):
    ranks = draw(st.integers(1, 5))
    chunks = draw(st.integers(1, 3))
    m = draw(st.integers(1, 6))
    split = draw(st.booleans())
    placement = draw(st.sampled_from(["loop", "random"]))
    seed = draw(st.integers(0, 2**31))
    schedule = random_valid_schedule(seed, ranks, chunks, m, split, placement)
    S = ranks * chunks
    times = st.floats(0.0, 5.0, allow_nan=False)
    f = draw(st.lists(times, min_size=S, max_size=S))
    b = draw(st.lists(st.floats(0.01, 5.0), min_size=S, max_size=S))
    w = [x * draw(st.floats(0.0, 1.0)) for x in b]
    comm = draw(st.sampled_from([0.0, 0.5, 1.0]))
    return schedule, CostModel(f=f, b=b, w=w, comm=comm)
