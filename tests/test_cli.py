import json
import subprocess
import sys

import pytest

from pipebubble.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pipebubble", *args], capture_output=True,
                          text=True, timeout=120)


def test_simulate_json_contract(capsys):
    assert main(["simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == "1f1b" and out["ranks"] == 4 and out["stages"] == 4
    assert out["microbatches"] == 8
    assert out["step_time"] == 33 and out["lower_bound"] == 24
    assert out["bubble_fraction"] == pytest.approx(3 / 11)
    assert out["closed_form_bubble"] == pytest.approx(3 / 11)
    assert [r["rank"] for r in out["per_rank"]] == [0, 1, 2, 3]
    assert set(out["per_rank"][0]) == {"rank", "busy", "idle", "bubble_fraction", "span",
                                       "peak_activations", "peak_memory"}
    assert out["per_rank"][0]["peak_activations"] == 4
    assert len(out["events"]) == 4 * 8 * 2
    assert set(out["events"][0]) == {"rank", "stage", "kind", "microbatch", "start", "end"}


def test_closed_form_is_null_with_comm(capsys):
    main(["simulate", "--schedule", "gpipe", "-p", "2", "-m", "2", "--comm", "0.5", "--json"])
    assert json.loads(capsys.readouterr().out)["closed_form_bubble"] is None


def test_compare_json_lists_every_schedule(capsys):
    from pipebubble.schedules import schedule_names

    assert main(["compare", "-p", "4", "-m", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["schedule"] for r in rows} <= set(schedule_names()) | {"auto"}
    assert {"gpipe", "1f1b", "auto"} <= {r["schedule"] for r in rows}
    assert all("events" not in r for r in rows)


def test_simulate_draws_a_chart():
    res = run_cli("simulate", "--schedule", "gpipe", "-p", "2", "-m", "3")
    assert res.returncode == 0
    assert "rank 0" in res.stdout and "rank 1" in res.stdout and "bubble" in res.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["simulate", "--schedule", "nope", "-p", "2", "-m", "2"], "unknown schedule 'nope'"),
        (["simulate", "--schedule", "gpipe", "-p", "0", "-m", "2"], "--ranks must be >= 1, got 0"),
        (["simulate", "--schedule", "gpipe", "-p", "2", "-m", "-3"], "--microbatches must be >= 1"),
        (["simulate", "--schedule", "gpipe", "-p", "2", "-m", "2", "--f", "1,2,3"],
         "f has 3 values; expected 1 or 2"),
        (["simulate", "--schedule", "gpipe", "-p", "2", "-m", "2", "--b", "-1"],
         "--b must be finite and >= 0, got -1"),
        (["simulate", "--schedule", "gpipe", "-p", "2", "-m", "2", "--f", "x"],
         "--f must be a number"),
        (["compare", "-p", "2", "-m", "0"], "--microbatches must be >= 1, got 0"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle):
    res = run_cli(*args)
    assert res.returncode == 2
    assert needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr


def test_help_lists_commands():
    res = run_cli("--help")
    assert res.returncode == 0
    for cmd in ("simulate", "compare", "demo"):
        assert cmd in res.stdout
