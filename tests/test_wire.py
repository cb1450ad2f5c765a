"""The wire pass and the blocking-P2P simulator (pure, no processes)."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipebubble import CostModel, get_schedule, schedule_names, simulate
from pipebubble.cli import main
from pipebubble.ir.schedule import Action, ScheduleError, make_schedule
from pipebubble.sim.wire import Batch, Comm, WireDeadlock, lower, pair_order_mismatches, run_wire
from strategies import random_valid_schedule, schedules_and_costs


def test_naive_and_parity_text_for_1f1b():
    s = get_schedule("1f1b", ranks=2, microbatches=2)
    assert lower(s, "parity").to_text().splitlines() == [
        "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",  # even: send, then receive
        "1RECV_F0 1F0 1B0 1RECV_F1 1SEND_B0 1F1 1B1 1SEND_B1",  # odd: receive, then send
    ]
    batched = lower(s, "batched").orders
    assert batched[1][3] == Batch((Comm(1, "SEND_B", 0, 0, ("grad", 0, 0)),
                                   Comm(1, "RECV_F", 1, 0, ("act", 1, 1))))


def test_every_message_sent_once_and_received_once():
    for name in schedule_names(searched=False):
        for p in (2, 3, 4):
            try:
                s = get_schedule(name, p, 2 * p)
            except ScheduleError:  # e.g. dualpipe needs an even p
                continue
            w = lower(s, "naive")
            sent = [(r, c.peer, c.key) for r in range(p) for c in w.comms(r) if c.is_send]
            got = [(c.peer, r, c.key) for r in range(p) for c in w.comms(r) if not c.is_send]
            assert sorted(sent) == sorted(got) and len(set(sent)) == len(sent)
            # one activation and one gradient per cross-rank stage boundary and microbatch
            where = s.stage_to_rank
            starts = getattr(s, "chain_starts", (0,))  # DualPipe: two independent chains
            cross = sum(where[i] != where[i + 1] and i + 1 not in starts
                        for i in range(s.num_stages - 1))
            assert len(sent) == 2 * cross * s.num_microbatches
            if s.placement == "loop":  # messages between two ranks come in consumption order
                assert pair_order_mismatches(w) == [], name


def test_v_schedules_need_tags_for_order():
    # zbv p=2: rank 0 sends activations to stage 1 and gradients to stage 2 interleaved in
    # one order, rank 1 consumes them in another: fine for gloo (tags), not for NCCL
    bad = pair_order_mismatches(lower(get_schedule("zbv", 2, 4)))
    assert len(bad) == 1 and bad[0].startswith("rank 0 -> rank 1")


def test_v_placement_hands_over_locally():
    # rank 0 holds stages 0 and 3, rank 1 holds 1 and 2: the 1 -> 2 edge is local
    orders = [[Action(0, "F", 0), Action(3, "F", 0), Action(3, "B", 0), Action(0, "B", 0)],
              [Action(1, "F", 0), Action(2, "F", 0), Action(2, "B", 0), Action(1, "B", 0)]]
    s = make_schedule("v", orders, 4, 1, placement="v")
    w = lower(s, "naive")
    assert w.to_text().splitlines() == [
        "0F0 0SEND_F0 3RECV_F0 3F0 3B0 3SEND_B0 0RECV_B0 0B0",
        "1RECV_F0 1F0 2F0 2SEND_F0 2RECV_B0 2B0 1B0 1SEND_B0",
    ]
    # one chain of 4 F then 4 B; with 2 chunks per rank each stage takes F/2 = 0.5, B/2 = 1
    assert run_wire(w, CostModel(f=1, b=2)).timeline.step_time == 6


def test_naive_blocking_deadlocks_1f1b_naming_each_rank():
    s = get_schedule("1f1b", ranks=2, microbatches=4)
    with pytest.raises(WireDeadlock) as info:
        run_wire(lower(s, "naive"), blocking=True)
    # rank 0 sends activation 1 forward while rank 1 sends gradient 0 back: neither receives
    assert info.value.stuck[0][0] == "0SEND_F1"
    assert info.value.stuck[1][0] == "1SEND_B0"
    assert "rank 1 to post the matching receive" in info.value.stuck[0][1]


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_parity_and_batched_complete_1f1b_naive_does_not(p):
    for m in (p, 2 * p + 1):
        s = get_schedule("1f1b", p, m)
        with pytest.raises(WireDeadlock) as info:
            run_wire(lower(s, "naive"), blocking=True)
        assert set(info.value.stuck) == set(range(p))  # every rank is named
        for ordering in ("parity", "batched"):
            run_wire(lower(s, ordering), blocking=True)  # completes


def test_parity_is_not_universal_gpipe_turn():
    """At GPipe's turn from forwards to backwards an odd rank would receive the gradient of
    microbatch 0 before sending the activation the next rank needs to produce it."""
    run_wire(lower(get_schedule("gpipe", 2, 4), "parity"))
    with pytest.raises(WireDeadlock) as info:
        run_wire(lower(get_schedule("gpipe", 3, 4), "parity"))
    assert info.value.stuck[1][0] == "1RECV_B0"
    run_wire(lower(get_schedule("gpipe", 3, 4), "naive"))  # naive is fine there


def test_blocking_timing_by_hand():
    # GPipe p=2 m=2, F=1 B=2, comm 0.5; buffered: 10, as simulate. Naive, blocking: rank 0's
    # 0SEND_F1 (posted at 2) waits for rank 1 to post 1RECV_F1 after its F0 (at 2.5): both
    # finish at 3.0, so 1F1 runs 3-4, 1B0 4-6, 1B1 6.5-8.5 (after 1SEND_B0 completes at 6.5);
    # rank 0 runs 0B0 6.5-8.5 and 0B1 9-11 (0RECV_B1 posted at 8.5). Step 11.
    s = get_schedule("gpipe", 2, 2)
    c = CostModel(f=1, b=2, comm=0.5)
    assert simulate(s, c).step_time == 10
    assert run_wire(lower(s, "naive"), c, blocking=False).timeline.step_time == 10
    res = run_wire(lower(s, "naive"), c, blocking=True)
    assert res.timeline.step_time == 11
    assert res.comm_done[1, Comm(1, "RECV_F", 1, 0, ("act", 1, 1))] == 3.0
    assert res.comm_done[0, Comm(0, "RECV_B", 0, 1, ("grad", 0, 0))] == 6.5
    # batched posts each receive one batch early: every message flows when it is sent
    assert run_wire(lower(s, "batched"), c, blocking=True).timeline.step_time == 10


def times(timeline):
    return {(e.stage, e.kind, e.microbatch): (e.start, e.end) for e in timeline.events()}


@given(schedules_and_costs(), st.sampled_from(["naive", "batched"]))
def test_buffered_wire_equals_simulate(sc, ordering):
    """With buffered sends the wire program times every action as simulate does, Overlap
    pairs (both outputs leave when the pair ends) and several chains included."""
    schedule, costs = sc
    ref = times(simulate(schedule, costs))
    got = times(run_wire(lower(schedule, ordering), costs, blocking=False).timeline)
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k] == pytest.approx(ref[k]), k


def test_a_pairs_forward_output_is_ready_when_the_pair_ends():
    """Rank 0 runs 0F0, then the pair (0F1;0B0), then 0B1; rank 1 runs 1F0 1B0 1F1 1B1.
    F=1, B=2, comm=0.5, overlap=0.75. 0F0 runs 0-1; 1F0 1.5-2.5 (after the hop); 1B0
    2.5-4.5. The pair waits for 1B0's gradient: 4.5 + 0.5 = 5.0; its parts run back to
    back, 0F1 5.0-5.75 (0.75 x 1) and 0B0 5.75-7.25 (0.75 x 2). 1F1 needs 0F1's output,
    which exists when the pair ends: 7.25 + 0.5 = 7.75 (not 5.75 + 0.5 = 6.25). Then 1F1
    7.75-8.75, 1B1 8.75-10.75, 0B1 11.25-13.25: step time 13.25. The simulator, the
    reference, the wire program (sends after the pair) all say so."""
    from pipebubble.ir.deps import Signal, signal_sources
    from pipebubble.ir.schedule import Overlap
    from pipebubble.sim.reference import simulate_reference

    a = Action
    s = make_schedule("pair", [[a(0, "F", 0), Overlap(a(0, "F", 1), a(0, "B", 0)), a(0, "B", 1)],
                               [a(1, "F", 0), a(1, "B", 0), a(1, "F", 1), a(1, "B", 1)]], 2, 2)
    c = CostModel(f=1, b=2, comm=0.5, overlap=0.75)
    expected = {(0, "F", 0): (0, 1), (1, "F", 0): (1.5, 2.5), (1, "B", 0): (2.5, 4.5),
                (0, "F", 1): (5.0, 5.75), (0, "B", 0): (5.75, 7.25),
                (1, "F", 1): (7.75, 8.75), (1, "B", 1): (8.75, 10.75), (0, "B", 1): (11.25, 13.25)}
    timelines = [simulate(s, c), simulate_reference(s, c)] + [
        run_wire(lower(s, o), c, blocking=False).timeline for o in ("naive", "batched")]
    for t in timelines:
        assert times(t) == expected
        assert t.step_time == 13.25
    # timeline consumers (the measured message delays of runtime/dist/report.py) read
    # 0F1's output at the pair's end: the event of 0B0
    events = list(timelines[0].events())
    at = events[signal_sources(events)[Signal(0, "F", 1)]]
    assert (at.stage, at.kind, at.microbatch, at.end) == (0, "B", 0, 7.25)


@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 3), st.integers(1, 6),
       st.booleans())
def test_batched_never_deadlocks_a_valid_schedule(seed, p, v, m, split):
    s = random_valid_schedule(seed, p, v, m, split, "loop")
    t = run_wire(lower(s, "batched"), CostModel(comm=0.25), blocking=True).timeline
    assert t.step_time >= simulate(s, CostModel(comm=0.25)).step_time - 1e-9


def test_wire_command(capsys):
    assert main(["wire", "--schedule", "1f1b", "-p", "2", "-m", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["p2p"]: r for r in out["orderings"]}
    assert rows["naive"]["deadlock"] and rows["naive"]["stuck"]["0"]["at"] == "0SEND_F1"
    assert not rows["parity"]["deadlock"] and not rows["batched"]["deadlock"]
    assert out["compute_only_step_time"] == 15  # (4 + 2 - 1) x 3


@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_registered_schedules_buffered_equal_simulate(name):
    # overlapped pairs (DualPipe's F&B) stay one step: both inputs first, both outputs after
    s = get_schedule(name, 4, 8)
    c = CostModel(f=1, b=2, w=1, comm=0.25, overlap=0.8)
    ref = simulate(s, c)
    for ordering in ("naive", "batched"):
        got = run_wire(lower(s, ordering), c, blocking=False).timeline
        assert got.step_time == pytest.approx(ref.step_time)
        assert sorted(got.start) == pytest.approx(sorted(ref.start))
    run_wire(lower(s, "batched"), c, blocking=True)  # completes with blocking sends too


def test_compute_deadlock_names_what_the_step_waits_for():
    # V placement: rank 1 holds stages 1 and 2 and runs 2F0 before 1F0, whose output 2F0
    # needs (a local hand-over). Rank 0 waits for rank 1 to receive 0F0's activation
    # (naive: its blocking send) or to send 2F0's (batched: its receive).
    orders = [[Action(0, "F", 0), Action(3, "F", 0), Action(3, "B", 0), Action(0, "B", 0)],
              [Action(2, "F", 0), Action(1, "F", 0), Action(2, "B", 0), Action(1, "B", 0)]]
    s = make_schedule("v", orders, 4, 1, placement="v")
    rank0 = {"naive": ("0SEND_F0", "rank 1 to post the matching receive of 0SEND_F0"),
             "batched": ("[0SEND_F0 3RECV_F0]", "rank 1 to post the matching send of 3RECV_F0")}
    for ordering, stuck in rank0.items():
        with pytest.raises(WireDeadlock) as info:
            run_wire(lower(s, ordering))
        assert info.value.stuck[1] == ("2F0", "1F0")  # the rule of ir.deps, in its words
        assert info.value.stuck[0] == stuck
    with pytest.raises(ScheduleError, match="rank 1 stuck at 2F0 waiting for 1F0"):
        simulate(s)  # the simulator says the same


def test_wire_edges_are_the_crossing_dependencies():
    # every receive is a crossing producer of the step after it, every send a crossing
    # hand-over of the step before it (ir.deps), for every registered schedule
    from pipebubble.ir.deps import handovers, producers

    for name in schedule_names(searched=False):
        s = get_schedule(name, 4, 8)
        w = lower(s, "naive")
        want_recv = sum(d.crosses for r in range(4) for a in s.actions(r)
                        for d in producers(a, s))
        want_send = sum(h.crosses for r in range(4) for a in s.actions(r)
                        for h in handovers(a, s))
        got = [c for r in range(4) for c in w.comms(r)]
        assert sum(not c.is_send for c in got) == want_recv, name
        assert sum(c.is_send for c in got) == want_send == want_recv, name


def test_wire_model_by_hand():
    from pipebubble.sim.wire import WireModel

    w = lower(get_schedule("gpipe", 2, 1), "naive")  # 0F0 0SEND_F0 ... / 1RECV_F0 1F0 ...
    send, recv = w.orders[0][1], w.orders[1][0]
    assert (str(send), str(recv)) == ("0SEND_F0", "1RECV_F0")
    assert send.key == recv.key == ("act", 1, 0)
    rendezvous = WireModel(comm=0.5, blocking=True)
    rendezvous.post(send, 1.0)
    assert rendezvous.done(send) is None and not rendezvous.peer_posted(send)
    rendezvous.post(recv, 3.0)
    assert rendezvous.done(send) == rendezvous.done(recv) == 3.5  # both: later post + comm
    buffered = WireModel(comm=0.5, blocking=False)
    buffered.post(send, 1.0)
    assert buffered.done(send) == 1.0  # a buffered send completes when posted
    buffered.post(recv, 0.25)
    buffered.post(recv, 9.0)  # a second post (prefetched before) keeps the first time
    assert buffered.done(recv) == 1.5  # max(posted 0.25, sent 1.0 + comm 0.5)


def chained_schedule_with_overlaps(seed: int, ranks: int, chunks: int, chains: int, m: int,
                                   split: bool, loop: bool, pairs: bool = True):
    """A deadlock-free random schedule with ``chains`` independent chains of
    ``ranks x chunks`` stages and overlapped F&B pairs: repeatedly take a random ready
    action (in a global order) and append it to its rank's order; a ready backward is
    sometimes paired with a ready forward of the same rank as one Overlap step."""
    import random

    from pipebubble.ir.schedule import Overlap

    rng = random.Random(seed)
    per = ranks * chunks
    S = per * chains
    where = [s % ranks for s in range(S)]
    if not loop:
        rng.shuffle(where)
    starts = tuple(range(0, S, per))
    first = set(starts)
    last = {c + per - 1 for c in starts}
    ready = {Action(c, "F", mb) for c in starts for mb in range(m)}
    orders: list[list] = [[] for _ in range(ranks)]

    def finish(a):
        s, k, mb = a
        if k == "F":
            ready.add(Action(s + 1, "F", mb) if s not in last else
                      Action(s, "I" if split else "B", mb))
        elif k in ("B", "I"):
            if split:
                ready.add(Action(s, "W", mb))
            if s not in first:
                ready.add(Action(s - 1, "I" if split else "B", mb))

    while ready:
        a = rng.choice(sorted(ready))
        ready.discard(a)
        r = where[a.stage]
        partner = None
        if pairs and a.kind in ("B", "I") and rng.random() < 0.5:
            fwds = sorted(f for f in ready if f.kind == "F" and where[f.stage] == r)
            partner = rng.choice(fwds) if fwds else None
        if partner is None:
            orders[r].append(a)
        else:
            ready.discard(partner)
            orders[r].append(Overlap(partner, a))
            finish(partner)
        finish(a)
    return make_schedule("random-chains", orders, S, m, placement=where, chain_starts=starts)


@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(1, 2), st.integers(1, 3),
       st.integers(1, 4), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([0.0, 0.5]), st.sampled_from([1.0, 0.75]))
def test_buffered_wire_against_simulate_with_chains_and_overlaps(seed, p, v, chains, m, split,
                                                                 loop, pairs, comm, overlap):
    """Several chains and Overlap pairs: the wire with buffered sends times every action as
    simulate does (an Overlap is one step of the wire program, its outputs sent after it:
    the simulator makes them ready at the pair's end too)."""
    from pipebubble.ir.schedule import validate

    s = chained_schedule_with_overlaps(seed, p, v, chains, m, split, loop, pairs)
    validate(s)
    c = CostModel(f=1, b=2, w=1, comm=comm, overlap=overlap)
    ref = simulate(s, c)
    theirs = times(ref)
    for ordering in ("naive", "batched"):
        got = run_wire(lower(s, ordering), c, blocking=False).timeline
        assert got.chain_starts == ref.chain_starts == s.chain_starts
        mine = times(got)
        assert mine.keys() == theirs.keys()
        for k in theirs:
            assert mine[k] == pytest.approx(theirs[k]), k
    run_wire(lower(s, "batched"), c, blocking=True)  # batched never deadlocks


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1"])
def test_a_boundary_rule_of_ones_own_gives_the_named_orderings_it_restates(name):
    """``lower(..., recv_first=rule)``: a rule that never receives first is ``naive``, one
    that receives first on odd ranks is ``parity`` (the same steps, in the same order)."""
    s = get_schedule(name, ranks=4, microbatches=6)
    never = lower(s, "mine", recv_first=lambda r, before, after: False)
    odd = lower(s, "mine", recv_first=lambda r, before, after: r % 2 == 1)
    assert never.orders == lower(s, "naive").orders
    assert odd.orders == lower(s, "parity").orders
    assert never.ordering == "mine"
