"""The consumers of the dependency rule that keep tables of their own, checked against the
rule itself (``ir/deps``) on every placement the registry makes: the greedy's wake-ups and
tails (``schedules/auto/greedy.rule_links``), the wire's message keys (``sim/wire.Comm.key``)
and the cut price's fill and drain links (``plan/cut_price.fill_drain_links``).

Each expectation is worked out here from ``deps.needs`` / ``deps.handovers`` one action at a
time (paths by enumeration), not from the consumer's own table."""

from __future__ import annotations

import functools

import pytest

from pipebubble import CostModel
from pipebubble.ir.deps import Layout, handovers, message, needs, produces
from pipebubble.ir.schedule import (
    Action,
    Kind,
    ScheduleError,
    loop_placement,
    starts_chain,
    v_placement,
)
from pipebubble.plan.cut_price import fill_drain_links
from pipebubble.schedules import get_schedule, lookup, schedule_names
from pipebubble.schedules.auto.greedy import rule_links
from pipebubble.sim.clock import Clock
from pipebubble.sim.wire import lower

KINDS = "FIW"


@functools.cache
def registry_layouts() -> list[tuple[Layout, int]]:
    """Every (layout, chunks) the registered specs make at 2..4 ranks: the families' own
    placements at each chunk count they take, and a search's (``auto``) loop and V ones."""
    seen: dict[Layout, int] = {}
    for name in schedule_names():
        spec = lookup(name)
        for p in (2, 3, 4):
            for v in spec.chunk_options(3):
                if spec.searched:
                    where = {"loop": loop_placement(p, p * v),
                             "v": v_placement(p)}.get(spec.placement_at(v))
                    if where is not None:
                        seen.setdefault(Layout(len(where), where, (0,)), v)
                    continue
                try:
                    s = get_schedule(name, p, 2 * p, v)
                except ScheduleError:
                    continue
                seen.setdefault(Layout(s.num_stages, s.stage_to_rank, s.chain_starts), v)
    return list(seen.items())


def test_the_registry_gives_every_kind_of_layout():
    layouts = [lay for lay, _ in registry_layouts()]
    assert any(len(lay.chain_starts) == 2 for lay in layouts)  # DualPipe's two chains
    assert any(lay.stage_to_rank == v_placement(4) for lay in layouts)  # V
    assert any(lay.num_stages > 4 and lay.stage_to_rank[4] == 0 for lay in layouts)  # loop v>1


def _waiters(a: Action, lay: Layout) -> list[Action]:
    """The actions of a's microbatch that wait for a's output, by the rule's ``needs``
    (F, I and W only: the greedy's actions)."""
    S = lay.num_stages
    return [b for k in KINDS for b in [Action(t, k, a.microbatch) for t in range(S)]
            if produces(a) in needs(b, lay)]


def _paths(a: Action, lay: Layout, costs, sinks) -> list[float]:
    """The length of every path from a's start to the end of a sink: durations, plus
    ``comm`` on an edge between two ranks."""
    here = costs.duration(a.stage, a.kind)
    out = [here] if a in sinks else []
    for b in _waiters(a, lay):
        lag = costs.comm if lay.stage_to_rank[a.stage] != lay.stage_to_rank[b.stage] else 0.0
        out += [here + lag + rest for rest in _paths(b, lay, costs, sinks)]
    return out


@pytest.mark.parametrize("case", range(len(registry_layouts())))
def test_greedy_links_are_the_rules(case):
    lay, chunks = registry_layouts()[case]
    S, m = lay.num_stages, 3
    costs = CostModel(f=[1.0 + 0.1 * s for s in range(S)], b=[2.5 - 0.05 * s for s in range(S)],
                      w=[0.5 + 0.3 * (s % 3) for s in range(S)], comm=0.35).resolve(S, chunks)
    clock = Clock(costs, lay.stage_to_rank, m, chain_starts=lay.chain_starts)
    links = rule_links(clock)
    sinks = {Action(s, Kind.W, 0) for s in range(S) if starts_chain(lay, s)}
    for k in KINDS:
        for s in range(S):
            a, row = Action(s, k, 0), KINDS.index(k) * S + s
            # the wake-up: the one other rank that waits for this output, and its action
            away = [h for h in handovers(a, lay) if h.crosses]
            if away:
                (h,) = away
                waiter = KINDS.index("F" if k == Kind.F else "I") * S + h.to_stage
                assert (links.wake_rank[row], links.wake_at[row]) == (
                    lay.stage_to_rank[h.to_stage], waiter * m), (lay, a)
            else:
                assert links.wake_rank[row] == -1, (lay, a)
            # the tail: the longest path to the end of the microbatch (its chain's first W)
            paths = _paths(a, lay, costs, sinks)
            if paths:
                assert links.tail[row] == pytest.approx(max(paths), rel=1e-12), (lay, a)
            else:
                assert links.tail[row] is None and k == Kind.W, (lay, a)


@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_wire_keys_name_the_rules_consumer(name):
    """Every SEND's key names a stage, on the peer's rank, whose action needs what the
    sender made; every RECV's names its own stage, and the peer holds the stage whose
    output that action needs (deps.message of that signal)."""
    checked = 0
    for p in (2, 3, 4):
        try:
            s = get_schedule(name, p, 2 * p)
        except ScheduleError:
            continue
        where = s.stage_to_rank
        for r in range(p):
            for c in lower(s, "naive").comms(r):
                kind, consumer, mb = c.key
                assert mb == c.microbatch and kind == ("act" if c.op.endswith("F") else "grad")
                want = Action(consumer, Kind.F if kind == "act" else Kind.I, mb)
                if c.is_send:
                    sig = produces(Action(c.stage, Kind.F if kind == "act" else Kind.I, mb))
                    assert where[consumer] == c.peer and sig in needs(want, s), (name, c)
                else:
                    (sig,) = [g for g in needs(want, s) if g.stage != consumer]
                    assert consumer == c.stage and where[sig.stage] == c.peer, (name, c)
                assert c.key == message(sig, consumer)
                checked += 1
    assert checked


@pytest.mark.parametrize("case", range(len(registry_layouts())))
def test_fill_and_drain_links_are_the_rules(case):
    lay, _ = registry_layouts()[case]
    S, where = lay.num_stages, lay.stage_to_rank
    links = fill_drain_links(where, lay.chain_starts)
    assert sorted(link[0] for link in links) == list(range(S))
    done: set[int] = set()
    for s, fill_from, f_cross, drain_to, d_cross in links:
        before = [g.stage for g in needs(Action(s, Kind.F, 0), lay)]
        assert fill_from == (before[0] if before else -1), (lay, s)
        after = [q for q in range(S) if q != s
                 and produces(Action(s, Kind.I, 0)) in needs(Action(q, Kind.I, 0), lay)]
        assert drain_to == (after[0] if after else -1), (lay, s)
        for q, crosses in ((fill_from, f_cross), (drain_to, d_cross)):
            assert q < 0 or (q in done and crosses == (where[q] != where[s])), (lay, s)
        done.add(s)
