"""Every schedule runs for real: gradients and loss equal the unsplit model's on the whole batch.

Float64 models, so "equal" means equal to ~1e-12: pipelining only reorders the same sums.
Registered schedules are covered as they are added (``schedule_names()``); hand-built ones
prove the executor on what the registry may not have yet: I/W, Overlap steps, two chunks per
rank with loop and V placement, recomputation.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import CostModel, Pipeline, simulate
from pipebubble.ir.schedule import Action, ScheduleError, make_schedule
from pipebubble.runtime.local import run_local
from pipebubble.schedules import get_schedule, lookup, schedule_names
from pipebubble.sim.kernel import Deadlock
from runtime_helpers import (
    assert_grads_equal,
    assert_timeline_invariants,
    greedy_schedule,
    mlp_problem,
    reference_grads,
    transformer_problem,
)
from strategies import random_valid_schedule

# (ranks, microbatches, batch): m not a multiple of p, batch not a multiple of m
GRID = [(2, 3, 7), (3, 5, 11), (4, 6, 13), (2, 4, 9), (4, 8, 17), (1, 2, 3)]


def check_run(schedule, problem, recompute=False):
    stages, ref, x, y, loss_fn = problem
    ref_loss, ref_grads = reference_grads(ref, x, y, loss_fn)
    result = run_local(schedule, stages, x, y, loss_fn, recompute=recompute)
    where = f"{schedule.name} p={schedule.num_ranks} v={schedule.chunks} " \
            f"m={schedule.num_microbatches} recompute={recompute}"
    assert result.loss == pytest.approx(ref_loss, rel=1e-12, abs=1e-12), where
    assert_grads_equal(stages, ref_grads, where=where)
    assert_timeline_invariants(result.timeline, schedule)
    assert [it.held_bytes for it in result.interpreters] == [0] * schedule.num_ranks, where
    assert not any(it.saved or it.kept for it in result.interpreters), where
    return result


def model_stages(schedule):
    """Stages of one model copy: DualPipe's two chains run copies of the same stages, and
    run_local adds the copies' gradients into the originals."""
    return schedule.num_stages // schedule.chains


def chunk_options(name):
    spec = lookup(name)
    if spec.fixed_chunks:
        return [spec.chunks]
    return sorted({max(spec.min_chunks, spec.chunks), max(spec.min_chunks, 2)})


@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_every_registered_schedule_matches_unsplit_model(name):
    ran = []
    for p, m, batch in GRID:
        for v in chunk_options(name):
            try:
                schedule = get_schedule(name, p, m, v)
            except ScheduleError:
                continue  # this schedule does not take (p, m, v); others in the grid do
            check_run(schedule, mlp_problem(model_stages(schedule), batch, seed=p * 10 + m))
            ran.append((p, m, v))
    assert len(ran) >= 2, f"{name} ran only for {ran}"


@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_every_registered_schedule_with_transformer_and_recompute(name):
    for p, m, batch in [(2, 3, 5), (2, 4, 6), (4, 8, 9)]:
        v = chunk_options(name)[-1]
        try:
            schedule = get_schedule(name, p, m, v)
        except ScheduleError:
            continue
        check_run(schedule, transformer_problem(model_stages(schedule), batch), recompute=True)
        return
    pytest.fail(f"{name} accepts none of the (p, m) tried")


HAND_BUILT = {
    "split, W right after I": dict(ranks=3, chunks=1, microbatches=5, split=True),
    "split, every W at the end": dict(ranks=2, chunks=1, microbatches=3, split=True, defer_w=True),
    "overlapped F&B": dict(ranks=3, chunks=1, microbatches=4, overlap=True),
    "2 chunks, loop placement": dict(ranks=2, chunks=2, microbatches=3),
    "3 ranks x 2 chunks, loop, split": dict(ranks=3, chunks=2, microbatches=4, split=True),
    "V placement, split, overlap": dict(ranks=2, chunks=2, microbatches=3, placement="v",
                                        split=True, overlap=True),
    "V placement, 3 ranks, overlap": dict(ranks=3, chunks=2, microbatches=5, placement="v",
                                          overlap=True),
}


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("case", list(HAND_BUILT))
def test_hand_built_schedules(case, recompute):
    kw = HAND_BUILT[case]
    schedule = greedy_schedule(**kw)
    text = schedule.to_text()
    if kw.get("split"):
        assert "I" in text and "W" in text
    if kw.get("overlap"):
        assert "(" in text  # at least one Overlap step
    S = schedule.num_stages
    check_run(schedule, mlp_problem(S, 2 * kw["microbatches"] + 1, layers_per_stage=2),
              recompute)
    check_run(schedule, transformer_problem(S, kw["microbatches"] + 2), recompute)


def test_recompute_on_some_stages_only():
    schedule = greedy_schedule(3, 1, 4, split=True)
    check_run(schedule, mlp_problem(3, 9), recompute=[True, False, True])


def test_overlap_events_are_flagged_and_back_to_back():
    schedule = greedy_schedule(3, 1, 4, overlap=True)
    stages, _, x, y, loss_fn = mlp_problem(3, 8)
    tl = run_local(schedule, stages, x, y, loss_fn).timeline
    pairs = [(s.forward, s.backward) for order in schedule.orders for s in order
             if isinstance(s, tuple) and len(s) == 2 and hasattr(s, "forward")]
    ev = {(e.stage, e.kind, e.microbatch): e for e in tl.events()}
    assert pairs
    for f, b in pairs:
        ef, eb = ev[tuple(f)], ev[tuple(b)]
        assert ef.overlapped and eb.overlapped
        assert eb.start == ef.end  # the two parts run one after the other
    assert sum(tl.overlapped) == 2 * len(pairs)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), ranks=st.integers(1, 3), chunks=st.integers(1, 2),
       m=st.integers(1, 4), split=st.booleans(), placement=st.sampled_from(["loop", "random"]),
       recompute=st.booleans())
def test_random_valid_schedules(seed, ranks, chunks, m, split, placement, recompute):
    schedule = random_valid_schedule(seed, ranks, chunks, m, split, placement)
    check_run(schedule, mlp_problem(ranks * chunks, m + 1), recompute)


@pytest.mark.parametrize("costs", [
    CostModel(f=1, b=3, w=1, comm=0.25, overlap=0.5),
    # an all-to-all in F and the backward: a pair hides one half's behind the other's compute
    CostModel(f=1, b=3, w=1, comm=0.25, a2a_f=0.75, a2a_b=1.5)], ids=["overlap", "a2a"])
def test_cost_model_clock_reproduces_the_simulator_for_split_and_overlap(costs):
    from pipebubble.runtime.clock import VirtualClock

    for kw in HAND_BUILT.values():
        schedule = greedy_schedule(**kw)
        stages, _, x, y, loss_fn = mlp_problem(schedule.num_stages, kw["microbatches"])
        sc = costs.resolve(schedule.num_stages, schedule.chunks)
        clock = VirtualClock(schedule.num_ranks, sc)
        tl = run_local(schedule, stages, x, y, loss_fn, clock=clock).timeline
        sim = simulate(schedule, costs)
        real = {(e.stage, e.kind, e.microbatch): (e.start, e.end) for e in tl.events()}
        model = {(e.stage, e.kind, e.microbatch): (e.start, e.end) for e in sim.events()}
        assert real.keys() == model.keys()
        for k in model:
            assert real[k] == pytest.approx(model[k]), k
        assert tl.step_time == pytest.approx(sim.step_time)


def test_pipeline_runs_registered_schedule_with_chunks():
    name = next((n for n in schedule_names(searched=False) if not lookup(n).fixed_chunks), None)
    if name is None:
        pytest.skip("no registered schedule takes a variable number of chunks yet")
    stages, ref, x, y, loss_fn = mlp_problem(4, 9)
    try:
        pipe = Pipeline(stages, 4, schedule=name, chunks=2, loss_fn=loss_fn)
    except ScheduleError as exc:
        pytest.skip(f"{name} does not take p=2 m=4 v=2: {exc}")
    assert pipe.schedule.num_ranks == 2 and pipe.schedule.chunks == 2
    result = pipe.step(x, y)
    loss, grads = reference_grads(ref, x, y, loss_fn)
    assert result.loss == pytest.approx(loss, rel=1e-12)
    assert_grads_equal(stages, grads)


def test_pipeline_with_hand_built_schedule_and_recompute():
    schedule = greedy_schedule(2, 2, 3, placement="v", split=True)
    stages, ref, x, y, loss_fn = mlp_problem(4, 7)
    result = Pipeline(stages, 3, schedule=schedule, loss_fn=loss_fn, recompute=True).step(x, y)
    loss, grads = reference_grads(ref, x, y, loss_fn)
    assert result.loss == pytest.approx(loss, rel=1e-12)
    assert_grads_equal(stages, grads)


def test_invalid_schedule_is_rejected_and_deadlock_is_named():
    stages, _, x, y, loss_fn = mlp_problem(2, 4)
    swapped = make_schedule("swapped", [[Action(0, "F", 0), Action(0, "B", 0)],
                                        [Action(1, "B", 0), Action(1, "F", 0)]], 2, 1)
    with pytest.raises(ScheduleError, match="backward before its forward"):
        run_local(swapped, stages, x, y, loss_fn)
    # rank 0 waits for 1B0's gradient before its 0F1; rank 1 wants 1F1 (needs 0F1) first
    stuck = make_schedule("stuck", [
        [Action(0, "F", 0), Action(0, "B", 0), Action(0, "F", 1), Action(0, "B", 1)],
        [Action(1, "F", 1), Action(1, "F", 0), Action(1, "B", 0), Action(1, "B", 1)],
    ], 2, 2)
    with pytest.raises(Deadlock) as err:
        run_local(stuck, stages, x, y, loss_fn)
    # named by the one dependency rule (ir.deps), in the simulator's words: only what is
    # missing (0B0's own forward is done, the gradient from 1I0 or 1B0 is not)
    assert "rank 0 stuck at 0B0 waiting for 1I/B0;" in str(err.value)
    assert str(err.value).endswith("rank 1 stuck at 1F1 waiting for 0F1")


def test_bad_recompute_flags():
    stages, _, x, y, loss_fn = mlp_problem(2, 4)
    with pytest.raises(ValueError, match="recompute has 3 flags; expected 2"):
        run_local(get_schedule("gpipe", 2, 2), stages, x, y, loss_fn, recompute=[True] * 3)


def test_float32_gradients_close():
    stages, ref, x, y, loss_fn = mlp_problem(2, 8)
    for s in stages:
        s.float()
    ref.float()
    x, y = x.float(), y.float()
    _, grads = reference_grads(ref, x, y, loss_fn)
    run_local(greedy_schedule(2, 1, 4, split=True), stages, x, y, loss_fn)
    assert_grads_equal(stages, grads, rtol=1e-5, atol=1e-6)


def test_pipeline_runs_dualpipe_over_one_model_copy():
    # 4 stages of one model: DualPipe on 4 ranks (1 chunk per rank per chain), its second
    # chain a copy; after the step each stage holds the gradient of the whole batch (both
    # copies' contributions summed), equal to the unsplit model's.
    stages, ref, x, y, loss_fn = mlp_problem(4, 8)
    pipe = Pipeline(stages, 8, schedule="dualpipe", loss_fn=loss_fn)
    assert (pipe.schedule.num_ranks, pipe.schedule.chunks, pipe.schedule.num_stages) == (4, 1, 8)
    result = pipe.step(x, y)
    loss, grads = reference_grads(ref, x, y, loss_fn)
    assert result.loss == pytest.approx(loss, rel=1e-12)
    assert_grads_equal(stages, grads)
    with pytest.raises(ValueError, match="expected 8 or 4"):
        Pipeline(stages[:3], 8, schedule=pipe.schedule)
