"""--mem-b, --mem-w, --memory-limit: the cost model's memory fields, what fits, and one-line
errors; ``sweep --memory-limit``."""

import csv
import io
import json

import pytest

from pipebubble import CostModel, ScheduleError, get_schedule, simulate
from pipebubble.cli import main
from pipebubble.plan.sweep import memory_sweep, parse_limits


def run_json(capsys, *args, rc=0):
    assert main([*args, "--json"]) == rc
    return json.loads(capsys.readouterr().out)


def test_mem_b_mem_w_follow_the_f_rules(capsys):
    # scalar: one rank-share split over its chunks; 1F1B on rank 0 holds p = 4 microbatches
    out = run_json(capsys, "simulate", "--schedule", "1f1b", "-p", "4", "-m", "8",
                   "--mem-b", "2.5")
    assert out["per_rank"][0]["peak_memory"] == 4 * 2.5
    # ZB-V: 2 chunks, each holds half of the rank-share
    out = run_json(capsys, "simulate", "--schedule", "zbv", "-p", "2", "-m", "4",
                   "--mem-b", "2")
    zbv = simulate(get_schedule("zbv", 2, 4), CostModel(activation_memory=2))
    assert [r["peak_memory"] for r in out["per_rank"]] == [r.peak_memory
                                                           for r in zbv.rank_stats()]
    # a list is per stage, as is; M_W stays until W: ZB-H1 with M_W = M_B keeps it longer
    out = run_json(capsys, "simulate", "--schedule", "zb-h1", "-p", "2", "-m", "4",
                   "--mem-b", "1,3", "--mem-w", "1,3")
    t = simulate(get_schedule("zb-h1", 2, 4),
                 CostModel(activation_memory=[1, 3], weight_memory=[1, 3]))
    assert [r["peak_memory"] for r in out["per_rank"]] == [r.peak_memory
                                                           for r in t.rank_stats()]
    assert CostModel(activation_memory=2).mem_b == 2 and CostModel(weight_memory=1).mem_w == 1


def test_memory_limit_fits_and_over(capsys):
    out = run_json(capsys, "simulate", "--schedule", "1f1b", "-p", "4", "-m", "8",
                   "--memory-limit", "4")
    assert out["fits"] is True and out["memory_limit"] == 4 and out["over_limit_ranks"] == []
    # over the limit: still simulated and reported, exit 1 (documented)
    out = run_json(capsys, "simulate", "--schedule", "1f1b", "-p", "4", "-m", "8",
                   "--memory-limit", "3", rc=1)
    assert out["fits"] is False and out["over_limit_ranks"] == [0]
    assert out["step_time"] == 33
    # per rank: 1F1B holds 4, 3, 2, 1
    out = run_json(capsys, "simulate", "--schedule", "1f1b", "-p", "4", "-m", "8",
                   "--memory-limit", "4,2,2,1", rc=1)
    assert out["over_limit_ranks"] == [1]
    # no limit: no memory fields
    out = run_json(capsys, "simulate", "--schedule", "1f1b", "-p", "2", "-m", "2")
    assert "fits" not in out


def test_compare_says_what_fits(capsys):
    rows = run_json(capsys, "compare", "-p", "4", "-m", "8", "--memory-limit", "3")
    by_name = {r["schedule"]: r for r in rows}
    assert by_name["1f1b"]["fits"] is False and by_name["v-min"]["fits"] is True
    assert by_name["auto"]["fits"] is True
    fitting = [r["step_time"] for r in rows if r["fits"]]
    assert by_name["auto"]["step_time"] == min(fitting)
    assert main(["compare", "-p", "4", "-m", "8", "--memory-limit", "3"]) == 0
    assert "fits" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["--mem-w", "2"], "weight_memory must be <= activation_memory"),
    (["--mem-b", "1,2,3"], "activation_memory has 3 values; expected 1 or 4"),
    (["--memory-limit", "1,2"], "memory_limit has 2 values; expected 1 or 4"),
    (["--schedule", "auto", "--memory-limit", "0.5"], "smallest feasible limit 1"),
    (["--schedule", "auto", "--chunks", "3"], "auto takes chunks 1"),
])
def test_bad_memory_input_one_line_exit_2(args, needle, capsys):
    base = ["simulate", "-p", "4", "-m", "8"]
    if "--schedule" not in args:
        base += ["--schedule", "1f1b"]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipebubble: error: ") and needle in err[0]


@pytest.mark.parametrize("args, needle", [
    (["--mem-b", "-1"], "--mem-b must be finite and >= 0"),
    (["--memory-limit", "-2"], "--memory-limit must be finite and >= 0"),
    (["--mem-w", "x"], "--mem-w must be a number"),
])
def test_negative_memory_rejected_by_the_parser(args, needle, capsys):
    # main returns argparse's exit code instead of raising SystemExit
    assert main(["simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_rank_limits_checks():
    assert CostModel(memory_limit=[1, 2]).rank_limits(2) == [1.0, 2.0]
    with pytest.raises(ScheduleError, match="finite and >= 0"):
        CostModel(memory_limit=float("nan")).rank_limits(2)


# ---- sweep --memory-limit --------------------------------------------------------------------

def test_parse_limits():
    assert parse_limits("1..2:0.5,4") == [1.0, 1.5, 2.0, 4.0]
    for bad, msg in [("x", "cannot read"), ("2..1", "empty range"), ("1..2:0", "bad step"),
                     ("-1", "finite and >= 0")]:
        with pytest.raises(ValueError, match=msg):
            parse_limits(bad)


@pytest.mark.slow
def test_memory_sweep_auto_is_the_lower_envelope():
    costs = CostModel(f=1, b=2, w=1, weight_memory=0.5)
    limits = [1, 1.5, 2, 3, 4, 8]
    pts = memory_sweep(["auto", "v-min", "v-half", "zbv", "1f1b", "zb-h1", "zb-h2"], 4, 8,
                       limits, costs)
    for limit in limits:
        here = [p for p in pts if p.memory_limit == limit]
        auto = next(p for p in here if p.schedule == "auto")
        assert auto.fits and auto.peak_memory <= limit
        for p in here:
            if p.fits:
                assert p.peak_memory <= limit
                assert auto.step_time <= p.step_time + 1e-9, (p.schedule, limit)
    # 1F1B fits from its own peak (p = 4) on, with the same step time at every limit
    one = [p for p in pts if p.schedule == "1f1b"]
    assert [p.fits for p in one] == [False, False, False, False, True, True]
    assert {p.step_time for p in one} == {33.0}
    # auto never gets slower with more memory
    autos = [p.step_time for p in pts if p.schedule == "auto"]
    assert autos == sorted(autos, reverse=True)


def test_sweep_memory_cli_csv_and_png(tmp_path, capsys):
    png = tmp_path / "m.png"
    assert main(["sweep", "-p", "3", "-m", "6", "--memory-limit", "1..3", "--csv", "-",
                 "--png", str(png), "--schedules", "auto,1f1b"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6 and {r["schedule"] for r in rows} == {"auto", "1f1b"}
    assert [r["fits"] for r in rows if r["schedule"] == "1f1b"] == ["False", "False", "True"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["sweep", "-p", "3", "-m", "6", "--memory-limit", "1..3"]) == 0
    assert "auto" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["-m", "4..8"], "sweeps at one m"),
    (["--memory-limit", "0.1"], "no schedule fits any --memory-limit"),
    (["--memory-limit", "a..b"], "cannot read"),
])
def test_sweep_memory_bad_input(args, needle, capsys):
    base = ["sweep", "-p", "3", "-m", "6", "--memory-limit", "1..3"]
    for i in range(0, len(args), 2):
        j = base.index(args[i])
        base[j + 1] = args[i + 1]
    assert main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_sweep_over_m_with_auto(capsys):
    assert main(["sweep", "-p", "3", "-m", "2..6:2", "--schedules", "auto,zb-h1", "--csv",
                 "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    auto = {int(r["microbatches"]): float(r["step_time"]) for r in rows
            if r["schedule"] == "auto"}
    h1 = {int(r["microbatches"]): float(r["step_time"]) for r in rows
          if r["schedule"] == "zb-h1"}
    assert sorted(auto) == [2, 4, 6] and all(auto[m] <= h1[m] for m in auto)
    assert all(r["closed_form_bubble"] == "" for r in rows if r["schedule"] == "auto")
