import itertools
import json
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipebubble.cli import main
from pipebubble.costs import CostModel
from pipebubble.ir.schedule import Action, make_schedule
from pipebubble.models import mlp
from pipebubble.plan.balance import (
    SIM_METHOD,
    Options,
    balance,
    best_by_simulation,
    calibrate_profile,
    cut,
    inflight_per_stage,
    make_plan,
    rebalance,
)
from pipebubble.plan.layouts import megatron_flags, megatron_layout, torchtitan_fqns
from pipebubble.plan.measured import measure_plans
from pipebubble.plan.partition import (
    TIE_BREAKS,
    PartitionError,
    bottleneck,
    min_max_partition,
    min_max_partition_dp,
    ranges_from_ends,
)
from pipebubble.plan.profile import LayerProfile, Profile
from pipebubble.schedules import get_schedule
from pipebubble.sim.kernel import simulate


def brute_force(costs, stages, first=0.0, last=0.0, memory=None, caps=None):
    """Min over every cut of the slowest stage (None when no cut fits the memory caps)."""
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
        ranges = ranges_from_ends([*cuts, len(costs)])
        if memory is not None and any(sum(memory[k][a:b + 1]) > caps[k]
                                      for k, (a, b) in enumerate(ranges)):
            continue
        value = bottleneck(costs, ranges, first, last)
        best = value if best is None else min(best, value)
    return best


@st.composite
def instances(draw, integer=True):
    L = draw(st.integers(1, 8))
    S = draw(st.integers(1, L))
    if integer:
        costs = draw(st.lists(st.integers(0, 30), min_size=L, max_size=L))
    else:
        costs = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=L, max_size=L))
    first = draw(st.sampled_from([0, 0, 2, 7]))
    last = draw(st.sampled_from([0, 0, 3, 11]))
    memory = caps = None
    if draw(st.booleans()):
        # Stage-dependent memory like 1F1B's: weights + (S - k) in-flight activations.
        weights = draw(st.lists(st.integers(0, 6), min_size=L, max_size=L))
        acts = draw(st.lists(st.integers(0, 4), min_size=L, max_size=L))
        memory = [[w + (S - k) * a for w, a in zip(weights, acts, strict=True)]
                  for k in range(S)]
        caps = draw(st.lists(st.integers(0, 40), min_size=S, max_size=S))
    return costs, S, first, last, memory, caps


@given(instances(), st.sampled_from(TIE_BREAKS))
def test_bottleneck_equals_brute_force(inst, tie_break):
    costs, S, first, last, memory, caps = inst
    best = brute_force(costs, S, first, last, memory, caps)
    kwargs = dict(first_extra=first, last_extra=last, memory=memory, memory_cap=caps)
    if best is None:
        with pytest.raises(PartitionError, match="memory"):
            min_max_partition(costs, S, tie_break=tie_break, **kwargs)
        return
    ranges = min_max_partition(costs, S, tie_break=tie_break, **kwargs)
    assert len(ranges) == S and ranges[0][0] == 0 and ranges[-1][1] == len(costs) - 1
    assert all(a <= b for a, b in ranges)
    assert all(ranges[k + 1][0] == ranges[k][1] + 1 for k in range(S - 1))
    assert bottleneck(costs, ranges, first, last) == best
    if memory is not None:
        assert all(sum(memory[k][a:b + 1]) <= caps[k] for k, (a, b) in enumerate(ranges))
    dp = min_max_partition_dp(costs, S, **kwargs)
    assert bottleneck(costs, dp, first, last) == best


@given(instances(integer=False))
def test_real_costs_match_brute_force(inst):
    costs, S, first, last, _, _ = inst
    ranges = min_max_partition(costs, S, first_extra=first, last_extra=last)
    assert bottleneck(costs, ranges, first, last) == pytest.approx(
        brute_force(costs, S, first, last), rel=1e-9, abs=1e-12)


def test_hand_checked_cuts():
    # 1+2+3 | 4+5 | 6: slowest 9; any other cut has a stage of at least 10 or 11.
    assert min_max_partition([1, 2, 3, 4, 5, 6], 3) == [(0, 2), (3, 4), (5, 5)]
    # A fixed extra of 2 on the first stage pushes layers to the second.
    assert min_max_partition([1, 1, 1, 1], 2, first_extra=2) == [(0, 0), (1, 3)]
    # One stage per layer, and one stage for everything.
    assert min_max_partition([5, 1, 1], 3) == [(0, 0), (1, 1), (2, 2)]
    assert min_max_partition([5, 1, 1], 1) == [(0, 2)]
    # Zero-cost layers still each need a stage of their own when stages = layers.
    assert min_max_partition([0, 0, 0, 0], 2, tie_break="balanced") == [(0, 1), (2, 3)]


def test_extreme_magnitudes():
    assert min_max_partition([1.1125369292536007e-308], 1) == [(0, 0)]  # subnormal total
    assert min_max_partition([1e-310, 3e-310, 2e-310], 2) == [(0, 1), (2, 2)]
    assert min_max_partition([1e308, 1e308, 1e308], 2) in ([(0, 0), (1, 2)], [(0, 1), (2, 2)])
    assert min_max_partition([0.0, 0.0, 0.0], 3) == [(0, 0), (1, 1), (2, 2)]


def test_larger_instance_matches_the_dp():
    g = torch.Generator().manual_seed(3)
    costs = torch.rand(300, generator=g).tolist()
    fast = min_max_partition(costs, 17)
    slow = min_max_partition_dp(costs, 17)
    assert bottleneck(costs, fast) == pytest.approx(bottleneck(costs, slow), rel=1e-12)


@pytest.mark.parametrize("L, S", [(3, 4), (1, 2)])
def test_more_stages_than_layers(L, S):
    with pytest.raises(PartitionError, match=f"cannot cut {L} layers into {S} stages"):
        min_max_partition([1.0] * L, S)


def test_bad_costs_named():
    with pytest.raises(PartitionError, match="cost of layer 1 must be finite and >= 0, got -1"):
        min_max_partition([1, -1, 2], 2)
    with pytest.raises(PartitionError, match="unknown tie_break 'x'"):
        min_max_partition([1, 2], 2, tie_break="x")


def test_memory_cap_error_is_clear():
    with pytest.raises(PartitionError) as exc:
        min_max_partition([1, 1, 1], 2, memory=[[5, 5, 5]], memory_cap=6)
    msg = str(exc.value)
    assert "no cut of 3 layers into 2 stages" in msg and "cap 6 per stage" in msg
    assert "15 in all" in msg


# ---- plans ----------------------------------------------------------------------------------

def layer(name, f, params=0, act=0.0, flops=0.0, kind=None):
    return LayerProfile(name, float(f), 2.0 * f, params, act, flops, kind)


def lm_profile():
    """Embedding (many params, no compute), 6 equal blocks, a head: the lesson's model."""
    layers = [layer("tok_embeddings", 0.0, 600, 0, 0, "Embedding")]
    layers += [layer(f"layers.{i}", 1.0, 100, 10, 6, "Block") for i in range(6)]
    layers.append(layer("output", 2.0, 600, 20, 12, "Head"))
    return Profile(layers, {"device": "test"})


def test_inflight_per_stage():
    assert inflight_per_stage(get_schedule("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert inflight_per_stage(get_schedule("1f1b", 4, 2)) == [2, 2, 2, 1]
    assert inflight_per_stage(get_schedule("gpipe", 3, 5)) == [5, 5, 5]


def test_params_cut_differs_from_time_cut():
    # F+B: embedding 0, each block 3, head 6. Params: 600, 100 each, 600.
    plans = balance(lm_profile(), Options(ranks=3, microbatches=6))
    by = {p.method: p for p in plans}
    # By params, 1800 / 3 = 600 per stage exactly: the embedding alone, all blocks, the head.
    assert by["params"].ranges == [(0, 0), (1, 6), (7, 7)]
    assert [s.time for s in by["params"].stages] == [0.0, 18.0, 6.0]
    # By time, 24 / 3 = 8: the embedding stage takes blocks; 6 | 9 | 9 is optimal.
    assert by["time"].ranges == [(0, 2), (3, 5), (6, 7)]
    assert [s.time for s in by["time"].stages] == [6.0, 9.0, 9.0]
    assert by["uniform"].bottleneck == 12.0  # 2 | 3 | 3 layers: 3, 9, 12
    for p in plans:
        assert p.predicted_step_time == pytest.approx(simulate(
            get_schedule("1f1b", 3, 6), CostModel(
                f=[s.forward for s in p.stages], b=[s.backward for s in p.stages],
                w=[0.5 * s.backward for s in p.stages])).step_time)
    assert by["time"].predicted_step_time < by["params"].predicted_step_time
    # Two stages, 1F1B: step = (m - 1) x slowest + both stages.
    two = {p.method: p for p in balance(lm_profile(), Options(ranks=2, microbatches=4))}
    assert two["params"].ranges == [(0, 3), (4, 7)]  # 900 | 900 params; 9 | 15 seconds
    assert two["time"].ranges == [(0, 4), (5, 7)]  # 12 | 12 seconds
    assert two["time"].predicted_step_time == pytest.approx(3 * 12 + 12 + 12)
    assert two["params"].predicted_step_time == pytest.approx(3 * 15 + 9 + 15)


def test_memory_caps_respected_and_reported():
    prof = lm_profile()
    opts = Options(ranks=3, microbatches=6, bytes_per_param=1)
    free = {p.method: p for p in balance(prof, opts)}
    # Memory = params + in-flight x activations; 1F1B keeps 3, 2, 1 microbatches in flight.
    assert [s.memory for s in free["time"].stages] == [800 + 3 * 20, 300 + 2 * 30, 700 + 30]
    capped = {p.method: p for p in balance(prof, replace(opts, memory_cap=800))}
    for p in capped.values():
        assert all(s.memory <= 800 for s in p.stages), p.method
    # Stage 0 holds the embedding and one block at most, the last stage the head and one:
    # 1 block | 4 blocks | 1 block + head = 3 | 12 | 9.
    assert capped["time"].ranges == [(0, 1), (2, 5), (6, 7)]
    assert capped["time"].bottleneck == 12.0
    with pytest.raises(PartitionError, match=r"time: no cut of 8 layers into 3 stages.*cap 700"):
        balance(prof, replace(opts, memory_cap=700), methods=["time"])


def test_extras_move_layers_off_the_last_stage():
    prof = Profile([layer(str(i), 1.0) for i in range(6)])
    plain = cut(prof, "time", Options(ranks=2))
    loss = cut(prof, "time", Options(ranks=2, last_extra=6.0))
    assert plain == [(0, 2), (3, 5)]
    assert loss == [(0, 3), (4, 5)]  # 12 | 6 + 6
    plan = make_plan(prof, loss, "time", Options(ranks=2, last_extra=6.0))
    assert plan.stages[1].time == 12.0 and plan.stages[1].forward == 2.0 + 2.0


def test_simulation_pick_is_never_slower():
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        f = (torch.rand(10, generator=g) + 0.1).tolist()
        prof = Profile([layer(str(i), x) for i, x in enumerate(f)])
        opts = Options(ranks=3, microbatches=4, schedule="gpipe")
        time_plan = balance(prof, opts, methods=["time"])[0]
        sim = best_by_simulation(prof, opts, top=7)
        assert sim.method == SIM_METHOD
        assert sim.predicted_step_time <= time_plan.predicted_step_time + 1e-12


def interleaved_gpipe(ranks, microbatches):
    """Two chunks per rank, loop placement: all forwards by stage, then all backwards."""
    orders = [[] for _ in range(ranks)]
    S = 2 * ranks
    for s in range(S):
        orders[s % ranks] += [Action(s, "F", m) for m in range(microbatches)]
    for s in reversed(range(S)):
        orders[s % ranks] += [Action(s, "B", m) for m in range(microbatches)]
    return make_schedule("interleaved-gpipe", orders, S, microbatches)


def test_chunks_make_ranks_times_chunks_stages():
    prof = Profile([layer(str(i), 1.0, 10, 4) for i in range(8)])
    sched = interleaved_gpipe(2, 3)
    plan = balance(prof, Options(ranks=2, chunks=2, microbatches=3), methods=["time"],
                   schedule=sched)[0]
    assert plan.ranges == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [s.rank for s in plan.stages] == [0, 1, 0, 1]
    assert plan.timeline.num_stages == 4
    # Each rank holds 2 stages x 20 params x 16 bytes, plus the simulated activation peak.
    assert plan.peak_memory == [2 * 20 * 16 + plan.timeline.rank_stats()[r].peak_memory
                                for r in range(2)]
    assert megatron_flags(prof, plan.ranges, chunks=2) is None
    with pytest.raises(PartitionError, match="the model has 8 layers, fewer than the 10 stages"):
        balance(prof, Options(ranks=5, chunks=2))


def test_json_shape():
    plan = balance(lm_profile(), Options(ranks=3), methods=["time"])[0].as_json()
    assert {"method", "stages", "bottleneck", "predicted_step_time"} <= set(plan)
    assert {"first_layer", "last_layer", "time", "params", "memory"} <= set(plan["stages"][0])
    assert plan["bottleneck"] == max(s["time"] for s in plan["stages"])


def test_layouts():
    prof = lm_profile()
    ranges = [(0, 3), (4, 6), (7, 7)]
    assert megatron_layout(prof, ranges) == "Et*3|t*3|L"
    assert megatron_flags(prof, ranges) is None  # the last stage has no transformer layer
    assert megatron_flags(prof, [(0, 2), (3, 5), (6, 7)]) == (
        "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 1")
    assert megatron_flags(prof, [(0, 1), (2, 3), (4, 6), (7, 7)]) is None  # middle 2 vs 3
    assert torchtitan_fqns(prof, [(0, 3), (4, 7)]) == (
        'module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1", "layers.2"], '
        '["layers.3", "layers.4", "layers.5", "output"]]')


# ---- rebalancing from a measured run ---------------------------------------------------------

def test_calibrate_and_rebalance_by_hand():
    prof = Profile([layer(str(i), 1.0) for i in range(4)])  # the profile says: all equal
    opts = Options(ranks=2, microbatches=4)
    current = make_plan(prof, [(0, 1), (2, 3)], "params", opts)
    # The run says stage 1 is three times slower: F = 1, 3; B = 2, 6.
    measured = simulate(get_schedule("1f1b", 2, 4), CostModel(f=[1, 3], b=[2, 6], w=0))
    cal = calibrate_profile(prof, current.ranges, measured)
    assert cal.column("forward") == [0.5, 0.5, 1.5, 1.5]
    assert cal.column("backward") == [1.0, 1.0, 3.0, 3.0]
    # Several runs: the median of each stage's medians (two runs: their mean).
    slower = simulate(get_schedule("1f1b", 2, 4), CostModel(f=[1, 5], b=[2, 10], w=0))
    assert calibrate_profile(prof, current.ranges, [measured, slower]).column("forward") == [
        0.5, 0.5, 2.0, 2.0]
    _, before, after = rebalance(prof, current, measured)
    assert before.predicted_step_time == pytest.approx(measured.step_time)
    assert after.ranges == [(0, 2), (3, 3)]  # 1.5 + 1.5 + 4.5 | 4.5
    assert after.bottleneck == 7.5 and before.bottleneck == 9.0
    assert after.predicted_step_time < before.predicted_step_time


def test_measured_run_and_rebalance():
    spec = mlp(layers=4, width=8)
    x, y = spec.make_batch(8, torch.Generator().manual_seed(0))
    prof = Profile([layer(str(i), 1.0) for i in range(4)])
    plan = make_plan(prof, [(0, 0), (1, 3)], "uniform", Options(ranks=2, microbatches=4))
    (m,) = measure_plans([plan], spec.layers, x, y, spec.loss_fn, repeats=2, warmup=0)
    assert len(m.step_times) == 2 and m.step_time == pytest.approx(sum(m.step_times) / 2)
    assert m.timeline in m.timelines and len(m.timelines) == 2
    assert m.timeline.num_stages == 2 and len(m.timeline) == 2 * 4 * 2
    cal, before, after = rebalance(prof, plan, m.timeline)
    # Calibration keeps the measured stage totals: the stage of 3 layers is 3 layers' worth.
    times = [sum(cal.column("time")[a:b + 1]) for a, b in plan.ranges]
    assert times == pytest.approx([s.time for s in before.stages])
    # the new cut is the best of the 3 cuts of the calibrated layer times (brute force)
    assert len(after.stages) == 2
    assert after.bottleneck == pytest.approx(brute_force(cal.column("time"), 2))
    assert all(p.grad is None for mod in spec.layers for p in mod.parameters())


# ---- CLI -----------------------------------------------------------------------------------

@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "profile.json"
    lm_profile().save(path)
    return path


def test_cli_partition_json(profile_file, capsys):
    assert main(["partition", "--profile", str(profile_file), "--ranks", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["method"] for o in out] == ["uniform", "params", "flops", "time"]
    time_plan = out[3]
    assert [(s["first_layer"], s["last_layer"]) for s in time_plan["stages"]] == [
        (0, 2), (3, 5), (6, 7)]
    assert time_plan["bottleneck"] == 9.0
    # 1F1B, m=8, stage F+B = 6 | 9 | 9: the slowest stage runs back to back,
    # (m - 1) x 9 + one pass through every stage (6 + 9 + 9) = 87; the simulator agrees.
    assert time_plan["predicted_step_time"] == 87.0
    assert simulate(get_schedule("1f1b", 3, 8), CostModel(f=[2, 3, 3], b=[4, 6, 6], w=0)
                    ).step_time == 87.0


def test_cli_partition_takes_the_schedules_own_chunks(profile_file, capsys):
    """zbv without --chunks: 2 chunks per rank, 2p stages. dualpipe: each rank holds one
    stage of each model copy, so the model is cut into p stages and the second copy (stages
    p..2p-1, on the mirrored ranks) has the same layers; the step is the simulator's."""
    assert main(["partition", "--profile", str(profile_file), "-p", "2", "--schedule", "zbv",
                 "--method", "time", "--json"]) == 0
    zbv = json.loads(capsys.readouterr().out)[0]
    assert zbv["chunks"] == 2 and [s["rank"] for s in zbv["stages"]] == [0, 1, 1, 0]
    assert main(["partition", "--profile", str(profile_file), "-p", "2", "--schedule",
                 "dualpipe", "--method", "time", "--json"]) == 0
    dual = json.loads(capsys.readouterr().out)[0]
    cut = [(s["first_layer"], s["last_layer"]) for s in dual["stages"]]
    assert len(cut) == 4 and cut[:2] == cut[2:] and cut[0][0] == 0 and cut[1][0] == cut[0][1] + 1
    assert [s["rank"] for s in dual["stages"]] == [0, 1, 1, 0]
    stages = dual["stages"]  # W is --w-fraction (0.5) of the backward
    costs = CostModel(f=[s["forward"] for s in stages], b=[s["backward"] for s in stages],
                      w=[0.5 * s["backward"] for s in stages])
    assert dual["predicted_step_time"] == pytest.approx(
        simulate(get_schedule("dualpipe", 2, 8), costs).step_time)


def test_cli_partition_table(profile_file, capsys):
    assert main(["partition", "--profile", str(profile_file), "-p", "2", "--method",
                 "params,time", "--top", "3"]) == 0
    out = capsys.readouterr().out
    for needle in ("params", "time+sim", "step time", "Et*4|t*2L",
                   "--decoder-first-pipeline-num-layers 4", "module_fqns_per_model_part"):
        assert needle in out


def test_cli_rebalance_from_measured_file(tmp_path, capsys):
    prof = tmp_path / "p.json"
    Profile([layer(str(i), 1.0) for i in range(4)]).save(prof)
    measured = simulate(get_schedule("1f1b", 2, 4), CostModel(f=[1, 3], b=[2, 6], w=0))
    tl = tmp_path / "t.json"
    tl.write_text(json.dumps({**measured.summary(), "events": measured.events_json()}))
    # Schedule and microbatches default to the measured run's (1f1b, 4).
    assert main(["partition", "--profile", str(prof), "-p", "2", "--measured",
                 str(tl), "--current-cut", "0-1,2-3", "--json"]) == 0
    before, after = json.loads(capsys.readouterr().out)
    assert before["microbatches"] == 4 and before["schedule"] == "1f1b"
    assert before["bottleneck"] == 9.0 and after["bottleneck"] == 7.5
    assert [(s["first_layer"], s["last_layer"]) for s in after["stages"]] == [(0, 2), (3, 3)]
    assert before["predicted_step_time"] == pytest.approx(measured.step_time)


def bad(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return str(path)


GOOD = {"name": "a", "forward": 1, "backward": 2, "params": 3, "activation_bytes": 4, "flops": 5}


@pytest.mark.parametrize("data, extra, needle", [
    ({"layers": [{**GOOD, "forward": -0.5}]}, [], "layer 0 ('a'): forward must be a finite "
     "number >= 0 (seconds), got -0.5"),
    ({"layers": []}, [], "profile has no layers"),
    ({"device": "cpu"}, [], "without 'layers'"),
    ({"layers": [{k: v for k, v in GOOD.items() if k != "flops"}]}, [],
     "layer 0 ('a') is missing 'flops'"),
    ({"layers": [GOOD, {**GOOD, "name": "b"}]}, ["-p", "3"],
     "the model has 2 layers, fewer than the 3 stages (ranks x chunks); at most 2"),
    ({"layers": [GOOD, {**GOOD, "name": "b"}]}, ["--method", "speed"],
     "unknown --method 'speed'"),
    ({"layers": [GOOD, {**GOOD, "name": "b"}]}, ["--memory-cap", "12 parsecs"],
     "--memory-cap must be bytes like 24GiB"),
    ({"layers": [GOOD, {**GOOD, "name": "b"}]}, ["--memory-cap", "10"],
     "no cut of 2 layers into 1 stages"),
    ({"layers": [GOOD, {**GOOD, "name": "b"}]}, ["--current-cut", "0-1"],
     "--measured and --current-cut go together"),
])
def test_cli_bad_profiles_exit_2(tmp_path, run_cli, data, extra, needle):
    args = ["partition", "--profile", bad(tmp_path, data), *extra]
    if "-p" not in extra:
        args += ["-p", "1"]
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("pipebubble: error: ")


def test_cli_binary_files_exit_2(tmp_path, run_cli, profile_file):
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    code, _, err = run_cli("partition", "--profile", binary, "-p", "2")
    assert code == 2 and f"profile file {str(binary)!r}: not UTF-8 text (byte 0xff" in err
    code, _, err = run_cli("partition", "--profile", profile_file, "-p", "2", "--measured",
                           binary, "--current-cut", "0-3,4-7")
    assert code == 2 and f"--measured {str(binary)!r}: not UTF-8 text (byte 0xff" in err
    assert len(err.splitlines()) == 1


def test_cli_timeline_file_that_disagrees_with_itself_exits_2(tmp_path, run_cli, profile_file):
    event = {"rank": 3, "stage": 0, "kind": "F", "microbatch": 0, "start": 0, "end": 1}
    tl = tmp_path / "t.json"
    tl.write_text(json.dumps({"ranks": 1, "stages": 1, "events": [event]}))
    code, _, err = run_cli("partition", "--profile", profile_file, "-p", "2", "--measured", tl,
                           "--current-cut", "0-3,4-7")
    assert code == 2
    assert err == f"pipebubble: error: --measured {str(tl)!r}: events[0].rank is 3; valid " \
                  "ranks are 0..0\n"
