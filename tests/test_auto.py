"""``auto``: the fastest order found under a memory limit, checked against every registered
schedule of the same placements, the closed forms, and its own lower bound."""

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auto_cases import peaks, same_placement_rivals
from pipebubble import CostModel, ScheduleError, auto_schedule, get_schedule, simulate, validate
from pipebubble.cli import main
from pipebubble.interop.torch_csv import parse_torch_csv
from pipebubble.schedules.auto.bounds import lower_bound, min_limits


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_zero_bubble_within_every_span_without_limit(p):
    m = 2 * p + 1
    for placement in ("loop", "any"):
        t = simulate(auto_schedule(p, m, CostModel(f=1, b=2, w=1), placement=placement))
        for r in t.rank_stats():
            assert r.span - r.busy == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_at_zb_h1_and_zb_h2_memory_at_least_as_fast(p):
    m = 3 * p
    costs = CostModel(f=1, b=2.5, w=1, comm=0.1)
    for name in ("zb-h1", "zb-h2"):
        rival = simulate(get_schedule(name, p, m), costs)
        auto = auto_schedule(p, m, costs, memory_limit=max(peaks(rival)), placement="loop")
        assert simulate(auto, costs).step_time <= rival.step_time + 1e-9


def test_limit_below_the_smallest_names_it():
    with pytest.raises(ScheduleError, match="below the smallest feasible limit 1 "):
        auto_schedule(4, 8, CostModel(), memory_limit=0.9)
    # per rank: rank 1 is short
    with pytest.raises(ScheduleError, match="on rank 1 is below the smallest feasible limit 2"):
        auto_schedule(2, 4, CostModel(activation_memory=[2, 2]), memory_limit=[2, 1.5],
                      placement="loop")
    # at the smallest limit it runs one microbatch at a time
    auto = auto_schedule(4, 8, CostModel(), memory_limit=1)
    assert max(peaks(simulate(auto))) == 1


def test_lower_bound_by_hand_and_min_limits():
    sc = CostModel(f=1, b=2, w=1).resolve(4)
    assert lower_bound(sc, (0, 1, 2, 3), 8) == 3 * 8 + 4 - 1  # ZB-H1/H2 reach it
    assert simulate(get_schedule("zb-h1", 4, 8)).step_time == 27
    sc = CostModel(activation_memory=[1, 2, 3, 4]).resolve(4)
    assert min_limits(sc, (0, 1, 1, 0)) == [5, 5]


@pytest.mark.slow
@given(p=st.integers(1, 4), m=st.integers(1, 6), f=st.floats(0.1, 3), i=st.floats(0.1, 3),
       w=st.floats(0, 3), comm=st.floats(0, 1), limit=st.sampled_from([None, 1, 2, 3.5]))
def test_auto_is_valid_fits_and_respects_its_lower_bound(p, m, f, i, w, comm, limit):
    # A sixth of the default budget: every stage still runs (the invariants hold for any
    # budget), at a sixth of the time; test_auto_optimal.py runs the default one.
    costs = CostModel(f=f, b=i + w, w=w, comm=comm, weight_memory=0.5)
    auto = auto_schedule(p, m, costs, memory_limit=limit, mip_windows=False,
                         search_seconds=0.1)
    validate(auto)
    t = simulate(auto, costs)
    if limit is not None:
        assert max(peaks(t)) <= limit + 1e-9
    assert auto.options["auto"]["lower_bound"] <= t.step_time + 1e-9


# ---- the commands ----------------------------------------------------------------------------

def test_simulate_auto_json(capsys):
    assert main(["simulate", "--schedule", "auto", "-p", "4", "-m", "8", "--memory-limit", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True and out["memory_limit"] == 2
    info = out["auto"]
    assert {"placement", "chunks", "lower_bound", "seconds"} <= set(info)
    assert info["lower_bound"] <= out["step_time"]
    assert max(r["peak_memory"] for r in out["per_rank"]) <= 2


def test_export_auto_reads_back(capsys):
    assert main(["export", "--schedule", "auto", "-p", "3", "-m", "6", "--chunks", "1",
                 "--memory-limit", "2", "--csv", "-"]) == 0
    back = parse_torch_csv(capsys.readouterr().out)
    assert back.num_stages == 3 and back.num_microbatches == 6
    assert max(peaks(simulate(back))) <= 2


def test_run_local_auto_exact_gradients(capsys):
    assert main(["run", "--local", "--schedule", "auto", "-p", "2", "-m", "4", "--check",
                 "--memory-limit", "1.5", "--width", "16", "--warmup", "0", "--repeat", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5


def test_limit_nothing_fits_is_one_line_exit_2(capsys):
    assert main(["simulate", "--schedule", "auto", "-p", "4", "-m", "8",
                 "--memory-limit", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smallest feasible limit 1" in err[0]


def test_torch_loads_the_auto_csv(tmp_path):
    """torch's own runtime accepts the exported order (it adds the sends and receives)."""
    from unittest import mock

    from torch.distributed.pipelining import schedules as pipelining
    from torch.distributed.pipelining.stage import PipelineStage

    from pipebubble.interop.torch_csv import write_torch_csv

    for placement in ("loop", "v"):
        s = auto_schedule(3, 6, CostModel(weight_memory=0.5), memory_limit=2,
                          placement=placement)
        path = tmp_path / f"auto-{placement}.csv"
        write_torch_csv(s, path)
        stage = mock.create_autospec(PipelineStage, instance=True)
        stage.group_rank, stage.group_size, stage.submod = 0, 3, None
        stage.num_stages = s.num_stages
        runtime = pipelining._PipelineScheduleRuntime([stage] * s.chunks, 6)
        runtime._load_csv(str(path))
        placed = runtime.stage_index_to_group_rank
        assert [placed[i] for i in range(s.num_stages)] == list(s.stage_to_rank)


@pytest.mark.distributed
def test_distributed_auto_exact_gradients():
    """Two processes over gloo running the auto order the launcher searched (under torchrun
    each worker searches it from the same flags, deterministically)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "pipebubble", "run", "--schedule", "auto", "-p", "2", "-m", "4",
         "--mem-w", "0.5", "--memory-limit", "1.5", "--check", "--width", "8", "--warmup", "0",
         "--repeat", "1", "--json"],
        capture_output=True, text=True, timeout=170, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["schedule"] == "auto"
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5


@given(p=st.integers(1, 5), m=st.integers(1, 8), comm=st.floats(0, 1),
       f=st.lists(st.floats(0.1, 3), min_size=10, max_size=10),
       i=st.lists(st.floats(0.1, 3), min_size=10, max_size=10),
       w=st.lists(st.floats(0, 3), min_size=10, max_size=10))
def test_lower_bound_below_every_registered_schedule(p, m, comm, f, i, w):
    """The bound holds for every order, so for every hand-made schedule of the placement."""
    for placement, stages, where in (("loop", p, tuple(range(p))),
                                     ("v", 2 * p, tuple([*range(p), *reversed(range(p))]))):
        b = [x + y for x, y in zip(i, w, strict=True)][:stages]
        costs = CostModel(f=f[:stages], b=b, w=w[:stages], comm=comm)
        bound = lower_bound(costs.resolve(stages, 1 if placement == "loop" else 2), where, m)
        for name, t in same_placement_rivals(p, m, costs):
            if t.num_stages == stages:
                assert bound <= t.step_time + 1e-9, name


@pytest.mark.parametrize("placement", ["loop", "v"])
def test_greedy_clock_agrees_with_the_simulator(placement):
    # auto scores the greedy's orders with the simulator; the greedy's own clock (which
    # steers its choices) must give the same step, on every knob setting that runs.
    from pipebubble.ir.schedule import Action, loop_placement, make_schedule, v_placement
    from pipebubble.schedules.auto import knob_grid
    from pipebubble.schedules.auto.greedy import greedy_order

    p, m = 3, 6
    where = loop_placement(p, p) if placement == "loop" else v_placement(p)
    chunks = 1 if placement == "loop" else 2
    costs = CostModel(f=1, b=3, w=1, comm=0.2, activation_memory=1, weight_memory=0.5)
    sc = costs.resolve(len(where), chunks)
    ran = 0
    for limit in (None, 2.0 * chunks):
        limits = None if limit is None else [limit] * p
        for knobs in knob_grid(p, m, chunks):
            got = greedy_order(p, m, sc, where, limits, knobs)
            if got is None:
                continue
            orders = [[Action(*a) for a in o] for o in got[0]]
            t = simulate(make_schedule("g", orders, len(where), m, placement=list(where)), sc)
            assert t.step_time == pytest.approx(got[1], abs=1e-9)
            ran += 1
    assert ran >= 4


@pytest.mark.parametrize("f", [1.0, [1.0, 1.5, 1.5, 1.0]])  # lists: the planner's
def test_identical_request_is_remembered_not_searched(monkeypatch, f):
    import pipebubble.schedules.auto as auto

    costs = CostModel(f=f, b=2, w=1, comm=0.1)
    first = auto_schedule(2, 4, costs, memory_limit=3, placement="v", mip_windows=False)

    def no_search(*args, **kwargs):
        raise AssertionError("searched again")

    monkeypatch.setattr(auto, "_search", no_search)
    again = auto_schedule(2, 4, CostModel(f=list(f) if isinstance(f, list) else f, b=2, w=1,
                                          comm=0.1), memory_limit=3.0, placement="v",
                          mip_windows=False)
    assert again == first and again.options["auto"] == first.options["auto"]
    assert again.options is not first.options  # the caller's own options dict
    with pytest.raises(AssertionError, match="searched again"):  # another limit: a search
        auto_schedule(2, 4, costs, memory_limit=2.5, placement="v", mip_windows=False)
