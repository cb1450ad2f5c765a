"""``auto`` is deterministic by default (schedules/auto/budget.py): its search is bounded by
counted work and reads no clock, so the same ``simulate --schedule auto`` gives the same
order on a machine 100 times slower (here: Python's clocks, ``time.perf_counter`` and
``time.monotonic``, made to run 100 times fast) as on a quiet one. A wall-clock limit is
there only when asked (``--search-deadline S``, ``search_deadline=S``), and then the same
throttled clock does stop the search: the throttle is real, the default just never looks."""

import json
import time

import pytest

import pipebubble.schedules.auto as auto_mod
from pipebubble import CostModel, auto_schedule
from pipebubble.ir.schedule import ScheduleError

# 4 ranks, 8 microbatches under a memory limit no registered schedule meets at its best:
# the greedy, adaptive V, local search and MIP windows all run (about 1 s here).
ARGS = ["simulate", "--schedule", "auto", "--ranks", "4", "--microbatches", "8",
        "--memory-limit", "3", "--search-seconds", "0.05", "--json"]
SLOW = 100.0


def _timeless(x):
    """The JSON without the fields that measure wall time (named ``seconds``)."""
    if isinstance(x, dict):
        return {k: _timeless(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [_timeless(v) for v in x]
    return x


def _throttle(monkeypatch, factor: float = SLOW) -> None:
    """Python's clocks run ``factor`` times fast from now: every second of work looks like
    ``factor`` seconds, as on a machine that much slower or loaded."""
    for name in ("perf_counter", "monotonic"):
        real = getattr(time, name)
        t0 = real()
        monkeypatch.setattr(time, name, lambda real=real, t0=t0: t0 + factor * (real() - t0))


def _run(run_cli, *extra: str) -> dict:
    auto_mod._REMEMBERED.clear()  # search again, never answer from memory
    rc, out, err = run_cli(*ARGS, *extra)
    assert rc == 0, err
    return json.loads(out)


def test_the_same_order_with_a_throttled_clock(run_cli, monkeypatch):
    quiet = _run(run_cli)
    _throttle(monkeypatch)
    slow = _run(run_cli)
    assert not quiet["auto"]["budget"]["safety_net_hit"]
    assert not slow["auto"]["budget"]["safety_net_hit"]
    assert quiet["auto"]["budget"]["work"] > 0  # it searched beyond the registered ones
    assert _timeless(slow) == _timeless(quiet)  # the order, its events, every figure


def test_a_deadline_only_when_asked(run_cli, monkeypatch):
    quiet = _run(run_cli)
    roomy = _run(run_cli, "--search-deadline", "3600")  # a deadline that is never reached
    assert _timeless(roomy) == _timeless(quiet)
    _throttle(monkeypatch)
    cut = _run(run_cli, "--search-deadline", "0.5")  # 5 ms of real time at 100x
    budget = cut["auto"]["budget"]
    assert budget["safety_net_hit"] and budget["work"] < quiet["auto"]["budget"]["work"]
    assert cut["step_time"] >= quiet["step_time"]  # less search finds no better order


def test_search_deadline_is_checked():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ScheduleError, match="search_deadline must be a finite number"):
            auto_schedule(2, 4, CostModel(), search_deadline=bad)


def test_search_deadline_flag_is_one_line(run_cli):
    for bad in ("0", "nan", "1e-320", "-1"):
        rc, _, err = run_cli(*ARGS, f"--search-deadline={bad}")
        assert rc == 2 and err.count("\n") == 1 and "--search-deadline must be" in err
