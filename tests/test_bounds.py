"""Every bound comes from limits.py and holds at the CLI and the library entry points: layers,
GPUs, global batch, planner microbatches, processes, validation time, actions, integer sizes,
list items. Each refusal is one line, exit 2, fast (no work linear in the bad value)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipebubble import limits as L
from pipebubble.limits import LimitError

HUGE = "9" * 400
A = ["--hidden", "64", "--ffn", "256", "--heads", "4", "--vocab", "100", "--seq", "16",
     "--tflops", "100", "--mfu", "0.5"]


@pytest.fixture
def profile(tmp_path, run_cli):
    path = tmp_path / "p.json"
    rc, _, err = run_cli("profile", "--analytic", "--layers", "4", *A, "--out", path)
    assert rc == 0, err
    return str(path)


@given(st.integers(1, 10**6))
def test_divisors_match_brute_force(n):
    got = L.divisors(n)
    assert got == sorted(set(got))
    assert all(n % d == 0 for d in got)
    if n <= 5000:
        assert got == [d for d in range(1, n + 1) if n % d == 0]
    else:  # every divisor pairs with its cofactor
        assert set(got) == {n // d for d in got}


def test_divisors_refuse_above_the_gpu_limit():
    assert L.divisors(L.MAX_GPUS)[-1] == L.MAX_GPUS
    with pytest.raises(LimitError, match=r"^gpus must be an integer in 1\.\.1048576"):
        L.divisors(L.MAX_GPUS + 1)


@pytest.mark.parametrize("flags, needle", [
    (["--gpus", "10000000000", "--global-batch", "64"], "--gpus must be <= 1048576"),
    (["--gpus", "100000000000000000", "--global-batch", "64"], "--gpus must be <= 1048576"),
    (["--gpus", "8", "--global-batch", "100000000000000000"], "--global-batch must be <="),
    (["--gpus", "1", "--global-batch", "1000000"],
     "makes at least 250,000 microbatches per pipeline"),
    (["--gpus", "8", "--global-batch", "64", "--validate", "1", "--target-step", "1e9"],
     "--target-step must be a number in (0, 60]"),
    (["--gpus", "8", "--global-batch", "64", "--validate", "16", "--target-step", "60"],
     "runs about 5,760 s of steps, over the limit of 1,800 s"),
    (["--gpus", "8", "--global-batch", "64", "--validate", HUGE], "a 400-digit number"),
    (["--gpus", "8", "--global-batch", "64", "--exhaustive-cuts", HUGE], "a 400-digit number"),
    (["--gpus", "8", "--global-batch", "64", "--max-chunks", "1000000"],
     "--max-chunks must be <= 64"),
    (["--gpus", "8", "--global-batch", "64", "--microbatch-size", "1,,2"], "'1,,2'"),
    (["--gpus", "8", "--global-batch", "64", "--schedules", "gpipe,,1f1b"], "item 2 is empty"),
    (["--gpus", "8", "--global-batch", "64", "--recompute", "none,"], "item 2 is empty"),
])
def test_plan_bounds_are_one_line(run_cli, profile, flags, needle):
    rc, out, err = run_cli("plan", "--profile", profile, *flags)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("pipebubble: error: ")
    assert needle in err


def test_the_library_planner_checks_the_same_bounds(profile):
    from pipebubble.plan.layercosts import ProfileSet
    from pipebubble.plan.planner import search
    from pipebubble.plan.plans import Request
    from pipebubble.plan.profile import Profile

    ps = ProfileSet([Profile.load(profile)])
    for req, needle in [(Request(gpus=10**17, gpu_memory=1e12, global_batch=64), "gpus"),
                        (Request(gpus=8, gpu_memory=1e12, global_batch=10**17),
                         "global_batch"),
                        (Request(gpus=8, gpu_memory=1e12, global_batch=64, max_chunks=10**9),
                         "max_chunks")]:
        with pytest.raises(LimitError, match=needle):
            search(ps, req)


def test_the_planner_skips_configurations_over_the_microbatch_limit(profile):
    """A global batch that some (dp, size) splits finely enough is planned, but only with
    pipelines of at most MAX_PLAN_MICROBATCHES microbatches."""
    from pipebubble.plan.layercosts import ProfileSet
    from pipebubble.plan.planner import search
    from pipebubble.plan.plans import Request
    from pipebubble.plan.profile import Profile

    B = 4 * 8 * L.MAX_PLAN_MICROBATCHES  # dp 8 x size 4 gives exactly the limit
    res = search(ProfileSet([Profile.load(profile)]),
                 Request(gpus=8, gpu_memory=1e12, global_batch=B, microbatch_sizes=(1, 4),
                         schedules=("gpipe",), top=3))
    assert res.plans and all(p.config.microbatches <= L.MAX_PLAN_MICROBATCHES
                             for p in res.plans)


def test_profile_layers_bound_at_the_flag_and_the_library(run_cli):
    from pipebubble.plan.analytic import analytic_profile

    rc, _, err = run_cli("profile", "--analytic", "--layers", str(10**18), *A)
    assert rc == 2 and "--layers must be an integer" in err and err.count("\n") == 1
    rc, _, err = run_cli("profile", "--analytic", "--layers", str(10**6), *A)
    assert rc == 2 and "--layers must be an integer in 1..100000, got 1000000" in err
    with pytest.raises(LimitError, match="^layers must be an integer in 1..100000"):
        analytic_profile(layers=10**18, hidden=64, ffn=256, heads=4, vocab=100, seq=16, batch=1,
                         tflops=1, mfu=1)


def test_profile_refuses_to_write_what_partition_refuses(tmp_path, run_cli):
    """A shape whose times overflow the reader's bounds is refused at write: no file."""
    out = tmp_path / "big.json"
    rc, _, err = run_cli("profile", "--analytic", "--layers", "2", "--hidden", str(10**14),
                         *A[2:], "--out", out)
    assert rc == 2 and "the profile: layer 1" in err and "forward must be 0 or between" in err
    assert not out.exists()


@pytest.mark.parametrize("value, needle", [
    (str(10**18), "--max-actions must be an integer in 1..200000000"),
    (HUGE, "a 400-digit number"),
])
def test_max_actions_is_bounded(run_cli, value, needle):
    rc, _, err = run_cli("simulate", "--schedule", "1f1b", "-p", "2", "-m", "2",
                         "--max-actions", value)
    assert rc == 2 and needle in err


def test_max_actions_is_bounded_by_free_memory(monkeypatch):
    monkeypatch.setattr(L, "free_memory_bytes", lambda: 1 << 30)  # 1 GiB free
    with pytest.raises(LimitError, match="more than the 1.0 GiB free here; use at most"):
        L.check_max_actions(100_000_000)
    assert L.check_max_actions(L.MAX_ACTIONS) == L.MAX_ACTIONS  # the default always fits
    with pytest.raises(LimitError):  # the library entry point too
        L.check_actions(2, 2, limit=100_000_000)


def test_processes_are_bounded_by_cores_and_memory(monkeypatch):
    monkeypatch.setattr(L, "available_cores", lambda: 2)
    monkeypatch.setattr(L, "free_memory_bytes", lambda: 1 << 30)
    assert L.check_processes(8) == 8
    with pytest.raises(LimitError, match="9 processes, over 4 per CPU core"):
        L.check_processes(9)
    assert L.check_processes(9, allow_oversubscribe=True) == 9
    with pytest.raises(LimitError, match="more than the 1.0 GiB free here"):
        L.check_processes(15, allow_oversubscribe=True)  # 15 x 70 MiB > 1 GiB


def test_run_refuses_too_many_processes_before_starting_any(run_cli):
    p = 4 * L.available_cores() + 1
    rc, out, err = run_cli("run", "--schedule", "1f1b", "-p", str(p), "-m", str(p))
    assert rc == 2 and "--allow-oversubscribe" in err and err.count("\n") == 1


@given(st.lists(st.sampled_from(["a", "b", " c ", ""]), min_size=1, max_size=6))
def test_split_list_refuses_every_empty_item(items):
    text = ",".join(items)
    if any(not i.strip() for i in items):
        with pytest.raises(LimitError, match="is empty"):
            L.split_list(text, "--x")
    else:
        assert L.split_list(text, "--x") == [i.strip() for i in items]


def test_check_validation_estimate():
    assert L.check_validation(2, 1.0, steps_per_plan=6) == 12.0
    for bad in (0.0, -1.0, math.nan, math.inf, 61.0):
        with pytest.raises(LimitError, match="^target_step"):
            L.check_validation(1, bad)


def test_bounds_are_documented_in_the_module_doc():
    for name in ("MAX_GPUS", "MAX_GLOBAL_BATCH", "MAX_PLAN_MICROBATCHES", "MAX_LAYERS",
                 "MAX_VALIDATE", "MAX_TARGET_STEP", "MAX_VALIDATION_SECONDS",
                 "PROCESSES_PER_CORE", "HARD_MAX_ACTIONS", "MAX_LIST_ITEMS"):
        assert f":data:`{name}`" in L.__doc__, name
    json.dumps({k: v for k, v in vars(L).items() if k.isupper()})  # plain numbers


def test_a_measured_profile_over_the_layer_limit_is_refused_before_building(run_cli):
    rc, _, err = run_cli("profile", "--model", "transformer", "--layers", str(L.MAX_LAYERS),
                         "--dim", "8", "--heads", "1", "--vocab", "16", "--seq", "4")
    assert rc == 2 and f"builds {L.MAX_LAYERS + 2:,} layers" in err


@pytest.mark.parametrize("tflops, mfu, needle", [
    # refused by the flag's range (params.REALS) before any FLOP count: a product that
    # underflows to 0, one that overflows to inf, sub-picosecond layers
    ("1e-300", "1e-300", "--tflops must be a number in [0.001, 1e+06] TFLOP/s, got '1e-300'"),
    ("1e300", "1", "--tflops must be a number in [0.001, 1e+06] TFLOP/s, got '1e300'"),
    ("1e9", "1", "--tflops must be a number in [0.001, 1e+06] TFLOP/s, got '1e9'"),
    ("1", "1e-300", "--mfu must be"),
])
def test_analytic_rates_that_underflow_or_overflow_are_one_line(run_cli, tflops, mfu, needle):
    args = ["profile", "--analytic", "--layers", "2", *A[:10], "--tflops", tflops, "--mfu", mfu,
            "--json"]
    rc, out, err = run_cli(*args)
    assert rc == 2 and out == "" and needle in err and err.count("\n") == 1
