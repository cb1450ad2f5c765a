"""The command line: JSON contract, chart, bad input (one line, exit 2), bugs stay bugs.

Every test runs ``pipebubble.cli.main`` in this process (the ``run_cli`` fixture in
conftest.py); two tests start a real process, to see exactly what a user sees from the
installed entry point and from ``python -m pipebubble``.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pipebubble
from pipebubble.cli import USER_ERRORS, main
from pipebubble.commands import simulate as simulate_cmd
from pipebubble.errors import UserError
from pipebubble.ir.schedule import ScheduleError
from pipebubble.plan.partition import PartitionError
from pipebubble.plan.profile import ProfileError
from pipebubble.sim import Deadlock


def test_simulate_json_contract(run_cli):
    rc, out, _ = run_cli("simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--json")
    assert rc == 0
    out = json.loads(out)
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


def test_closed_form_is_null_with_comm(run_cli):
    rc, out, _ = run_cli("simulate", "--schedule", "gpipe", "-p", "2", "-m", "2", "--comm",
                         "0.5", "--json")
    assert rc == 0 and json.loads(out)["closed_form_bubble"] is None


def test_compare_json_lists_every_schedule(run_cli):
    from pipebubble.schedules import schedule_names

    rc, out, _ = run_cli("compare", "-p", "4", "-m", "8", "--json")
    assert rc == 0
    rows = json.loads(out)
    assert {r["schedule"] for r in rows} <= set(schedule_names(searched=False)) | {"auto"}
    assert {"gpipe", "1f1b", "auto"} <= {r["schedule"] for r in rows}
    assert all("events" not in r for r in rows)
    # GPipe and 1F1B have the same step time (m + p - 1)(F + B) = 11 x 3 with F=1, B=2
    by_name = {r["schedule"]: r for r in rows}
    assert by_name["gpipe"]["step_time"] == by_name["1f1b"]["step_time"] == 33


def test_simulate_draws_a_chart(run_cli):
    rc, out, err = run_cli("simulate", "--schedule", "gpipe", "-p", "2", "-m", "3",
                           "--width", "60")
    assert rc == 0 and err == ""
    assert "rank 0" in out and "rank 1" in out and "bubble" in out
    assert "rank 2" not in out


BAD_INPUT = [
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
    (["simulate", "--schedule", "gpipe", "-p", "2"], "--microbatches required"),
    (["nope"], "invalid choice: 'nope'"),
    ([], "the following arguments are required: COMMAND"),
]


@pytest.mark.parametrize("args, needle", BAD_INPUT)
def test_bad_input_one_line_exit_2(run_cli, args, needle):
    rc, out, err = run_cli(*args)
    assert rc == 2 and out == ""
    assert err.startswith("pipebubble: error: ") and needle in err, err
    assert len(err.strip().splitlines()) == 1


def test_help_lists_commands(run_cli):
    rc, out, _ = run_cli("--help")
    assert rc == 0
    for cmd in ("simulate", "compare", "demo", "run", "export", "--version"):
        assert cmd in out


def test_version(run_cli):
    assert run_cli("--version") == (0, f"pipebubble {pipebubble.__version__}\n", "")
    assert pipebubble.__version__ == "0.1.0"


# ---- which exceptions are the user's mistake ------------------------------------------------

def test_every_project_error_type_is_a_user_error():
    for cls in (ScheduleError, Deadlock, ProfileError, PartitionError):
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), cls
    assert pipebubble.ScheduleError is ScheduleError


@pytest.mark.parametrize("exc, line", [
    (UserError("--x must be >= 1, got 0\nsecond line"), "--x must be >= 1, got 0"),
    (ScheduleError("unknown schedule 'q'"), "unknown schedule 'q'"),
    (FileNotFoundError(2, "No such file or directory", "in.csv"),
     "No such file or directory: 'in.csv'"),
    (IsADirectoryError(21, "Is a directory", "out"), "Is a directory: 'out'"),
    (PermissionError(13, "Permission denied", "/x.png"), "Permission denied: '/x.png'"),
    (UserError(""), "UserError"),
])
def test_user_errors_print_one_line_and_exit_2(run_cli, monkeypatch, exc, line):
    def fail(args):
        raise exc

    monkeypatch.setattr(simulate_cmd, "run", fail)
    assert isinstance(exc, USER_ERRORS)
    rc, out, err = run_cli("simulate", "--schedule", "gpipe", "-p", "2", "-m", "2")
    assert (rc, out, err) == (2, "", f"pipebubble: error: {line}\n")


@pytest.mark.parametrize("exc", [ValueError("a bug"), KeyError("a bug"), TypeError("a bug"),
                                 ZeroDivisionError("a bug"), OSError("a bug")])
def test_a_bug_is_not_turned_into_exit_2(monkeypatch, exc):
    """A plain ValueError/KeyError/TypeError from library code is a bug: it propagates."""

    def fail(args):
        raise exc

    monkeypatch.setattr(simulate_cmd, "run", fail)
    with pytest.raises(type(exc), match="a bug"):
        main(["simulate", "--schedule", "gpipe", "-p", "2", "-m", "2"])


def test_cli_module_has_no_second_error_type():
    import pipebubble.cli as cli

    assert not hasattr(cli, "UsageError")


# ---- real processes: what a user sees -------------------------------------------------------

def _entry_point() -> str:
    script = Path(sys.executable).with_name("pipebubble")
    found = str(script) if script.exists() else shutil.which("pipebubble")
    assert found, "the pipebubble script is not installed next to this Python (pip install -e .)"
    return found


@pytest.mark.slow
def test_installed_entry_point_exit_codes():
    bad = subprocess.run([_entry_point(), "simulate", "--schedule", "nope", "-p", "2", "-m",
                          "2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("pipebubble: error: unknown schedule 'nope'")
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_python_dash_m_version():
    res = subprocess.run([sys.executable, "-m", "pipebubble", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, "pipebubble 0.1.0\n", "")

def test_commands_raise_user_errors_not_bare_value_errors():
    """The CLI layer checks the user's input: what it raises for bad input must be a
    UserError (exit 2), since a bare ValueError/KeyError/TypeError now surfaces as a bug.
    A raise that really is a programming error says so on its line ("not a user error")."""
    import ast

    root = Path(pipebubble.__file__).parent / "commands"
    found = []
    for path in sorted(root.glob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name)
                    and node.exc.func.id in ("ValueError", "KeyError", "TypeError")
                    and "not a user error" not in lines[node.lineno - 1]):
                found.append(f"{path.name}:{node.lineno}: raise {node.exc.func.id}")
    assert found == [], "raise UserError (pipebubble.errors) for bad input:\n" + "\n".join(found)
