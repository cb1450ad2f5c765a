"""``plan --validate``'s verdict: PASS/FAIL per plan against the tolerance, whether the ranking
held, and the note that names the machine's load before blaming the cost model.

All in-process on synthetic measurements (plan/validate.py's ``verdict``, ``ranking``,
``explain``; ``plan --validate`` with the runs replaced by made-up medians): no process is
started. ``tests/test_plan_cli.py::test_validate_runs_the_top_plan`` runs one plan for real.
"""

from __future__ import annotations

import json
from itertools import combinations

import pytest

from pipebubble.cli import main
from pipebubble.plan import validate as V
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import Request, search


@pytest.fixture(scope="module")
def plans():
    prof = ProfileSet([analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, vocab=8000,
                                        seq=512, batch=1, tflops=100, mfu=0.5)])
    return search(prof, Request(gpus=4, gpu_memory=2**34, global_batch=8, top=4,
                                schedules=("1f1b", "gpipe"))).plans


def made(plan, predicted, steps, load=0.5, cores=4, model=None, error=None):
    """A Validation as a run would report it: the median of ``steps``."""
    from statistics import median

    return V.Validation(plan, 1.0, predicted, median(steps) if steps else None, error,
                        V.Machine(), list(steps), model, load, cores)


def test_a_plan_passes_within_the_tolerance_and_fails_beyond_it(plans):
    p = plans[0]
    inside = made(p, 1.0, [1.10, 1.14, 1.12])  # +12 %
    beyond = made(p, 1.0, [1.19, 1.20, 1.21])  # +20 %
    below = made(p, 1.0, [0.80, 0.81, 0.79])  # -20 %: too fast is a miss too
    assert V.verdict(inside, 0.15).passed and inside.relative_error == pytest.approx(0.12)
    assert not V.verdict(beyond, 0.15).passed and V.verdict(beyond, 0.25).passed
    assert not V.verdict(below, 0.15).passed
    assert V.verdict(beyond).tolerance == V.DEFAULT_TOLERANCE == 0.15
    failed = made(p, 1.0, [], error="exit code 1: boom")
    x = V.verdict(failed)
    assert not x.passed and x.relative_error is None and "boom" in x.note
    assert x.as_json()["verdict"] == "FAIL" and V.verdict(inside).as_json()["verdict"] == "PASS"


def test_the_spread_is_over_the_measured_steps_only(plans):
    v = made(plans[0], 1.0, [1.0, 1.2, 1.1])  # the warm-up step is not among them
    assert v.spread == pytest.approx(0.2) and v.warmup == V.WARMUP == 1
    assert "spread 20.0% over 3 steps, 1 warm-up step(s) excluded" in V.explain(v, 0.15)
    assert made(plans[0], 1.0, [1.0]).spread is None


def test_the_note_blames_the_load_before_the_model(plans):
    p = plans[0]  # pp x dp processes
    procs = p.pp * p.dp
    quiet = made(p, 1.0, [1.40, 1.41, 1.42], load=0.3, cores=procs)
    loaded = made(p, 1.0, [1.40, 1.41, 1.42], load=2.5 * procs, cores=procs)
    crowded = made(p, 1.0, [1.40, 1.41, 1.42], load=0.3, cores=1, model="hf:x")
    sleeping = made(p, 1.0, [1.40, 1.41, 1.42], load=0.3, cores=1)  # sleeping ranks: no CPU
    noisy = made(p, 1.0, [1.0, 1.6, 1.5], load=0.3, cores=procs)  # +50 % miss, 60 % spread
    assert "cost model misses something" in V.explain(quiet, 0.15)
    note = V.explain(loaded, 0.15)
    assert "machine was loaded" in note and "cost model misses" not in note
    assert f"load average {2.5 * procs:.2g} on {procs} cores (2.5 per core)" in note
    assert f"{procs} processes (1 per core)" in note
    assert "machine was loaded" in V.explain(crowded, 0.15)
    assert f"{procs} processes ({procs:.2g} per core)" in V.explain(crowded, 0.15)
    assert "cost model misses something" in V.explain(sleeping, 0.15)
    assert "within the run-to-run spread" in V.explain(noisy, 0.15)
    j = loaded.as_json()
    assert j["load_average"] == 2.5 * procs and j["processes_per_core"] == 1.0
    assert j["warmup_steps"] == 1 and j["spread"] == pytest.approx(0.02 / 1.40)


def kendall_by_hand(pred, meas):
    """tau over the pairs that differ in both (brute force)."""
    s = [(1 if (pred[i] < pred[j]) == (meas[i] < meas[j]) else -1)
         for i, j in combinations(range(len(pred)), 2)
         if pred[i] != pred[j] and meas[i] != meas[j]]
    return sum(s) / len(s) if s else None


@pytest.mark.parametrize("pred,meas", [
    ([1.0, 2.0, 3.0], [1.1, 2.1, 3.1]),       # the same order
    ([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]),       # reversed
    ([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.5, 5.0]),
    ([1.0, 1.0, 2.0], [1.2, 1.1, 2.2]),       # a tie in the prediction
])
def test_kendall_tau_matches_brute_force(plans, pred, meas):
    vs = [made(plans[0], p, [m]) for p, m in zip(pred, meas, strict=True)]
    r = V.ranking(vs)
    assert r.kendall_tau == pytest.approx(kendall_by_hand(pred, meas))
    assert r.predicted == sorted(range(1, len(pred) + 1), key=lambda n: (pred[n - 1], n))
    assert r.measured == sorted(range(1, len(meas) + 1), key=lambda n: (meas[n - 1], n))


def test_the_ranking_holds_unless_a_swap_exceeds_the_tolerance(plans):
    p = plans[0]
    same = V.ranking([made(p, 1.0, [1.0]), made(p, 1.2, [1.25])], [1, 2], 0.15)
    assert same.held and same.top_fastest and same.kendall_tau == 1.0
    # #1 predicted faster but measured 10 % slower than #2: a swap within 15 %, it holds
    small = V.ranking([made(p, 1.0, [1.10]), made(p, 1.05, [1.0])], [1, 2], 0.15)
    assert small.held and not small.top_fastest and small.kendall_tau == -1.0
    # 30 % slower: the ranking did not hold, and the pair is named (faster predicted first)
    big = V.ranking([made(p, 1.0, [1.30]), made(p, 1.05, [1.0])], [3, 5], 0.15)
    assert not big.held and big.swapped == [(3, 5)] and big.as_json()["held"] is False
    # a failed run is left out of the ranking; one plan alone has nothing to swap
    one = V.ranking([made(p, 1.0, [1.0]), made(p, 0.5, [], error="x")])
    assert one.held and one.kendall_tau is None and one.predicted == [1]
    assert V.ranking([made(p, 1.0, [], error="x")]) is None


def fake_runs(monkeypatch, medians):
    """``plan --validate``'s runs replaced by measurements: plan k measured ``medians[k]``
    times its prediction, at load 0.1."""

    def fake(runnable, target=1.0, **_):
        return [made(p, p.pipeline_time, [r * p.pipeline_time] * 3, load=0.1)
                for p, r in zip(runnable, medians, strict=False)]

    monkeypatch.setattr(V, "validate", fake)


ARGS = ["plan", "--gpus", "4", "--global-batch", "8", "--schedules", "1f1b,gpipe",
        "--recompute", "none", "--validate", "2"]


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("verdict") / "p.json"
    analytic_profile(layers=6, hidden=512, ffn=1408, heads=8, vocab=8000, seq=512, batch=1,
                     tflops=100, mfu=0.5).save(path)
    return str(path)


def test_plan_validate_exits_0_when_every_verdict_passes(monkeypatch, capsys, profile_file):
    fake_runs(monkeypatch, [1.05, 1.02])
    assert main([*ARGS, "--profile", profile_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["validation"]["passed"] is True and out["validation"]["tolerance"] == 0.15
    ran = [p for p in out["plans"] if "validation" in p]
    assert [p["validation"]["verdict"] for p in ran] == ["PASS", "PASS"]
    assert ran[0]["validation"]["relative_error"] == pytest.approx(0.05)


def test_plan_validate_exits_1_on_a_miss_and_says_why(monkeypatch, capsys, profile_file):
    fake_runs(monkeypatch, [1.30, 1.0])
    assert main([*ARGS, "--profile", profile_file, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    v = out["validation"]
    assert v["passed"] is False and "#1 outside the 15% tolerance" in v["summary"]
    assert [p["validation"]["verdict"] for p in out["plans"][:2]] == ["FAIL", "PASS"]
    # a looser tolerance passes the same measurements
    assert main([*ARGS, "--profile", profile_file, "--json", "--validate-tol", "0.35"]) == 0
    capsys.readouterr()
    assert main([*ARGS, "--profile", profile_file]) == 1  # the table, and the verdict lines
    cap = capsys.readouterr()
    assert "#1 FAIL: +30.0% against a tolerance of 15%" in cap.out
    assert "load average 0.1" in cap.out and "validation FAIL" in cap.out
    assert "--validate failed: plan #1 outside the 15% tolerance" in cap.err
    assert "Traceback" not in cap.err


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "x"])
def test_a_bad_tolerance_is_one_line(bad, capsys, profile_file):
    assert main([*ARGS, "--profile", profile_file, "--validate-tol", bad]) == 2
    err = capsys.readouterr().err
    assert "--validate-tol" in err and "Traceback" not in err and len(err.splitlines()) == 1
