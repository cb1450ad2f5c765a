"""Output words: each output says what its numbers are.

- ``simulate`` names its time unit (the cost flags' own);
- ``sweep`` lists the (schedule, m) pairs it left out with the rule that excluded them,
  and the list is exactly the pairs the generators refuse (brute force over get_schedule);
- every "valid are ..." list of schedules names ``auto``;
- a distributed run whose measured step is off its prediction says so, with the likely
  cause when there are more processes than cores;
- the demo calls its cost-model clock simulated, not measured.
"""

from __future__ import annotations

import re

import pytest

from pipebubble import ScheduleError, get_schedule
from pipebubble.commands import _run_dist
from pipebubble.commands._run_setup import noise_note
from pipebubble.schedules import schedule_names


def test_simulate_names_its_time_unit(run_cli):
    rc, out, _ = run_cli("simulate", "--schedule", "gpipe", "-p", "4", "-m", "8")
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("step time"))
    assert line.startswith("step time 33 ") and "time unit of --f/--b/--w/--comm" in line


def test_sweep_lists_exactly_the_pairs_the_generators_refuse(run_cli):
    rc, _, err = run_cli("sweep", "-p", "4", "-m", "1..9")
    assert rc == 0
    refused = {}
    for name in schedule_names():
        for m in range(1, 10):
            try:
                get_schedule(name, 4, m)
            except ScheduleError:
                refused.setdefault(name, set()).add(m)
    total = sum(map(len, refused.values()))
    assert f"{total} (schedule, m) pairs were not valid and are left out:" in err
    listed: dict[str, set[int]] = {}
    for line in err.splitlines()[1:]:
        name, ms = re.match(r"\s+(\S+): m = ([\d., ]+?) \(", line).groups()
        for part in ms.split(", "):
            lo, _, hi = part.partition("..")
            listed.setdefault(name, set()).update(range(int(lo), int(hi or lo) + 1))
    assert listed == refused
    assert "dualpipev: m = 1..7 (needs microbatches >= 2 x ranks = 8)" in err


@pytest.mark.parametrize("argv", [
    ["simulate", "--schedule", "nope", "-p", "2", "-m", "2"],
    ["sweep", "-p", "2", "-m", "2", "--schedules", "nope"],
    ["wire", "--schedule", "nope", "-p", "2", "-m", "2"],
    ["export", "--schedule", "nope", "-p", "2", "-m", "2", "--csv", "-"],
    ["run", "--local", "--schedule", "nope", "-p", "2", "-m", "2"],
])
def test_every_list_of_valid_schedules_names_auto(run_cli, argv):
    rc, _, err = run_cli(*argv)
    assert rc == 2
    valid = err.split("valid are ", 1)[1].strip().split(", ")
    assert "auto" in valid and set(schedule_names()) <= set(valid)


def test_a_gap_over_the_noise_names_the_likely_cause(monkeypatch):
    monkeypatch.setattr("pipebubble.limits.available_cores", lambda: 2)
    cause = _run_dist.oversubscribed(4, 1)
    assert cause.startswith("4 processes x 1 thread(s) on 2 CPU cores")
    assert _run_dist.oversubscribed(2, 1) is None  # a core per rank: nothing to blame
    note = noise_note([1.0, 1.1, 1.2], 1.0, 1.6, cause)  # spread 20 %, gap 60 %
    assert note.startswith("measured vs predicted differ by 60.0%, more than the run-to-run "
                           "spread of 20.0%")
    assert note.endswith("likely cause: " + cause)
    assert "misses something" in noise_note([1.0, 1.1, 1.2], 1.0, 1.6)


def test_local_processes_reads_torchruns_count(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _run_dist.local_processes(16) == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _run_dist.local_processes(16) == 16


def test_demo_calls_the_cost_model_clock_simulated():
    from rich.console import Console

    from pipebubble.demo import run_demo

    console = Console(record=True, width=200)
    figures = run_demo(2, 2, console=console)
    text = console.export_text()
    assert figures["bubble_cost_clock"] == pytest.approx(1 / 3)  # (p-1)/(m+p-1), p=m=2
    assert "cost-model bubble 33.33% (closed form 33.33%)" in text
    assert "simulated clock" in text
    assert "measured bubble 33.33%" not in text  # the cost-model clock measures nothing
