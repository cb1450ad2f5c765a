"""A profile whose clock did not resolve the layers' times (every median 0 s) is still a
profile partition and plan can read: more passes and their mean, else the clock's tick.

The timed pass is replaced by one whose readings a person can add up by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pipebubble.plan.profile as prof_mod
from pipebubble.libwarnings import PipebubbleWarning
from pipebubble.plan.profile import (
    UNRESOLVED_PASSES,
    clock_resolution,
    noisy_layers,
    profile_layers,
)
from pipebubble.plan.profile_reader import check_document


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(4, 4), nn.Linear(4, 4)]


def _patched(monkeypatch, reading):
    """_timed_pass returns ``reading(k)`` for its k-th call (0-based): (forwards, backwards)."""
    calls = {"n": 0}

    def fake(mods, *args):
        k = calls["n"]
        calls["n"] += 1
        return reading(k)

    monkeypatch.setattr(prof_mod, "_timed_pass", fake)
    return calls


def test_a_resolved_clock_keeps_the_median(monkeypatch):
    calls = _patched(monkeypatch, lambda k: ([1e-3, 0.0], [2e-3, 0.0]))
    prof = profile_layers(_layers(), torch.randn(2, 4), warmup=0, repeats=3)
    assert calls["n"] == 3 and prof.column("forward") == [1e-3, 0.0]
    assert "statistic" not in prof.metadata and "time_floor" not in prof.metadata


def test_medians_of_zero_take_more_passes_and_their_mean(monkeypatch):
    # a 1 ms tick: the layer's forward reads one tick in every 10th pass from pass 20 on;
    # the median of the first 5 is 0, the passes double (5 + 5 + 10 + 20 = 40) until a mean
    # is not 0: forward 1 ms x 2 ticks / 40 passes
    def reading(k):
        hit = 1e-3 if k >= 20 and k % 10 == 0 else 0.0
        return [hit, 0.0], [0.0, 0.0]

    calls = _patched(monkeypatch, reading)
    prof = profile_layers(_layers(), torch.randn(2, 4), warmup=0, repeats=5)
    assert calls["n"] == 40
    assert prof.column("forward") == [pytest.approx(2e-3 / 40), 0.0]
    assert prof.metadata["statistic"] == "mean" and prof.metadata["passes"] == 40
    check_document(prof.as_dict(), "the profile")  # what partition reads: some time


def test_a_clock_that_never_advances_gives_every_time_its_resolution(monkeypatch):
    calls = _patched(monkeypatch, lambda k: ([0.0, 0.0], [0.0, 0.0]))
    with pytest.warns(PipebubbleWarning, match="below the clock's resolution"):
        prof = profile_layers(_layers(), torch.randn(2, 4), warmup=0, repeats=1)
    assert calls["n"] == UNRESOLVED_PASSES  # bounded
    floor = prof.metadata["time_floor"]
    assert 0 < floor < 1e-2
    assert prof.column("forward") == [floor, floor] == prof.column("backward")
    check_document(prof.as_dict(), "the profile")
    (line,) = noisy_layers(prof)
    assert "below the clock's resolution" in line and f"{floor:.3g} s" in line


def test_clock_resolution_is_a_real_step_or_the_stated_one():
    ticks = iter([0.0, 0.0, 0.0, 0.25, 0.5])
    assert clock_resolution(lambda: next(ticks)) == 0.25
    frozen = clock_resolution(lambda: 1.0, reads=10)  # never advances: the stated one
    assert frozen > 0
