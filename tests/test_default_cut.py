"""The default cut outside ``run``: ``profile --ranks``, ``partition`` and ``plan --validate``
cut by the one rule (pipebubble/cut_rule.py) whatever the layer count, print the cut as the
``--boundaries`` value that reproduces it, and refuse more stages than layers in run's words.

Checked by hand: every contiguous cut of 7 layers is tried (brute force), and the printed
value is handed back to ``run --boundaries``.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from pipebubble.cut_rule import Cut, balanced_cut, profile_costs, profile_cut
from pipebubble.plan.profile import LayerProfile, Profile

TOO_MANY = ("the model has 7 layers, fewer than the 8 stages (ranks x chunks); at most 7 "
            "stages can run it (every stage needs a layer)")


def _worst(costs, cuts) -> float:
    edges = [0, *cuts, len(costs)]
    return max(sum(costs[a:b]) for a, b in zip(edges, edges[1:], strict=False))


def _best(costs, stages) -> float:
    return min(_worst(costs, c) for c in itertools.combinations(range(1, len(costs)), stages - 1))


@pytest.mark.parametrize("stages", [2, 3])
def test_seven_layers_cut_as_well_as_any_cut_can(stages):
    costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0]
    cut = balanced_cut(costs, stages, "FLOPs")
    assert cut.by == "FLOPs" and len(cut.boundaries) == stages - 1
    assert _worst(costs, cut.boundaries) == _best(costs, stages)  # 14 on 2 stages, 11 on 3
    assert [b - a + 1 for a, b in cut.ranges(7)] == [
        y - x for x, y in zip([0, *cut.boundaries], [*cut.boundaries, 7], strict=False)]
    assert Cut.of_ranges(cut.ranges(7), "FLOPs") == cut  # ranges and flag: the same cut
    equal = balanced_cut([1.0] * 7, stages, "FLOPs").boundaries  # sizes differ by one
    assert equal == {2: [3], 3: [2, 5]}[stages]


def test_a_profile_is_cut_by_its_time_else_flops_else_params():
    def prof(time, flops, params):
        return Profile([LayerProfile(str(i), t / 3, 2 * t / 3, p, 0, f)
                        for i, (t, f, p) in enumerate(zip(time, flops, params, strict=True))])

    assert profile_costs(prof([1, 2, 3], [0, 0, 0], [5, 5, 5]))[1] == "the profiled time"
    assert profile_costs(prof([0, 0, 0], [4, 0, 4], [5, 5, 5])) == ([4, 0, 4], "FLOPs")
    assert profile_costs(prof([0, 0, 0], [0, 0, 0], [1, 9, 1])) == ([1, 9, 1], "parameter counts")
    assert profile_cut(prof([0, 0, 0], [0, 0, 0], [0, 0, 0]), 2).by == "layer count"
    with pytest.raises(ValueError, match=re.escape(TOO_MANY.replace("7", "3").replace("8", "4"))):
        profile_cut(prof([1, 1, 1], [0, 0, 0], [0, 0, 0]), 4)


def _flag(text: str) -> list[int]:
    m = re.search(r"cut --boundaries ([0-9,]+) \(balanced by the profiled time\)", text)
    assert m, text
    return [int(x) for x in m.group(1).split(",")]


@pytest.mark.parametrize("ranks", [2, 3])
def test_profile_prints_the_cut_and_run_reproduces_it(run_cli, tmp_path, ranks):
    out_file = tmp_path / "p.json"
    rc, out, err = run_cli("profile", "--model", "mlp", "--layers", "7", "--width", "8",
                           "--warmup", "0", "--repeats", "1", "-p", ranks, "--json",
                           "--out", out_file)
    assert rc == 0, err
    flag = _flag(err)  # --json owns stdout: the cut is a note on stderr
    prof = Profile.from_dict(json.loads(out))
    times = prof.column("time")
    assert _worst(times, flag) == pytest.approx(_best(times, ranks), rel=1e-9)
    rc, out, err = run_cli("run", "--local", "--schedule", "1f1b", "-p", ranks, "-m", ranks,
                           "--layers", "7", "--width", "8", "--warmup", "0", "--repeat", "1",
                           "--boundaries", ",".join(map(str, flag)), "--json")
    assert rc == 0, err
    assert json.loads(out)["boundaries"] == flag  # the printed value runs that cut
    rc, out, err = run_cli("partition", "--profile", out_file, "--ranks", ranks, "--method",
                           "time,uniform")
    assert rc == 0, err
    text = " ".join(out.split())
    assert _flag(text) == flag  # partition's default cut line: the same rule, the same cut
    pasted = re.findall(r"pipebubble run: --boundaries ([0-9,]+)", text)
    assert pasted[0] == ",".join(map(str, flag))  # the time method's cut is the rule's
    assert pasted[1] == {2: "3", 3: "2,5"}[ranks]  # uniform: sizes differing by one


def test_partition_json_says_each_cut_as_boundaries(run_cli, tmp_path):
    rc, out, err = run_cli("profile", "--model", "mlp", "--layers", "7", "--width", "8",
                           "--warmup", "0", "--repeats", "1", "--out", tmp_path / "p.json")
    assert rc == 0, err
    rc, out, err = run_cli("partition", "--profile", tmp_path / "p.json", "--ranks", "3",
                           "--json")
    assert rc == 0, err
    for plan in json.loads(out):
        assert plan["boundaries"] == [s["first_layer"] for s in plan["stages"][1:]]


@pytest.mark.parametrize("args", [
    ["profile", "--model", "mlp", "--layers", "7", "--width", "8", "-p", "8"],
    ["profile", "--model", "mlp", "--layers", "7", "--width", "8", "-p", "4", "--chunks", "2"],
    ["partition", "--profile", "{p}", "--ranks", "8"],
    ["partition", "--profile", "{p}", "--ranks", "4", "--chunks", "2"],
    ["run", "--local", "--schedule", "1f1b", "-p", "8", "-m", "8", "--layers", "7"],
])
def test_more_stages_than_layers_is_one_line_in_every_command(run_cli, tmp_path, args):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"layers": [
        {"name": str(i), "forward": 1e-3, "backward": 2e-3, "params": 1, "activation_bytes": 1,
         "flops": 1} for i in range(7)]}))
    rc, out, err = run_cli(*[a.replace("{p}", str(prof)) for a in args])
    assert rc == 2 and err == f"pipebubble: error: {TOO_MANY}\n"
    assert not (tmp_path / "out.json").exists()


def test_profile_chunks_without_ranks_is_one_line(run_cli):
    rc, _, err = run_cli("profile", "--model", "mlp", "--layers", "3", "--chunks", "2")
    assert rc == 2 and err.count("\n") == 1 and "--chunks applies with --ranks" in err


@pytest.mark.parametrize("pp", [2, 3])
def test_plan_validate_runs_the_plans_cut_as_boundaries(run_cli, pp):
    # an analytic transformer of 5 blocks: 7 layers (embedding, 5 blocks, head), as the
    # built-in --model transformer --layers 5 has them
    from pipebubble.plan.analytic import analytic_profile
    from pipebubble.plan.layercosts import ProfileSet
    from pipebubble.plan.planner import Request, search
    from pipebubble.plan.validate import Validation, model_command, plan_cut

    prof = analytic_profile(layers=5, hidden=64, ffn=128, heads=4, vocab=256, seq=16, batch=1,
                            tflops=100, mfu=0.5)
    assert len(prof) == 7
    plans = search(ProfileSet([prof]), Request(gpus=pp, gpu_memory=2**34, global_batch=8,
                                               top=4, microbatch_sizes=(1,),
                                               recompute=("none",), schedules=("1f1b",),
                                               pp=(pp,))).plans
    plan = plans[0]
    cut = plan_cut(plan)
    assert cut.ranges(7) == list(plan.ranges) and len(cut.boundaries) == pp - 1
    cmd = model_command(plan, "transformer")
    assert cmd[cmd.index("--boundaries") + 1] == cut.flag
    assert Validation(plan, 1.0, 1.0, None, "x").as_json()["boundaries"] == cut.boundaries
    rc, out, err = run_cli("run", "--local", "--model", "transformer", "--layers", "5",
                           "--width", "16", "--vocab", "64", "--seq", "8", "--schedule", "1f1b",
                           "-p", pp, "-m", pp, "--boundaries", cut.flag, "--warmup", "0",
                           "--repeat", "1", "--json")
    assert rc == 0, err
    assert json.loads(out)["boundaries"] == cut.boundaries
