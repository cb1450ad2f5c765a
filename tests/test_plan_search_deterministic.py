"""The search does the same work on any machine and load: which configurations it visits
late (``Searcher.costly``) is fixed by the request (the actions a schedule will have), never
by how fast this machine generated the last one. Checked by running one search twice, once
with the clocks running as they do and once with them throttled (every reading half a second
past the last, as on a machine under heavy load), and comparing the plans and the counts."""

import time

import pytest

from pipebubble.plan import scoring
from pipebubble.plan.analytic import TransformerShape, shape_profile
from pipebubble.plan.dims import ParallelDims
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import Request, search
from pipebubble.plan.plans import Config
from pipebubble.schedules import get_schedule

SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zbv", "v-half", "auto")


def _case():
    shape = TransformerShape(layers=8, hidden=512, ffn=2048, heads=8, vocab=8000)
    prof = ProfileSet([shape_profile(shape, 512, 1)])
    req = Request(gpus=8, gpu_memory=80 * 2**30, global_batch=32, microbatch_sizes=(1, 2),
                  recompute=("none",), tp=(1,), cp=(1,), top=3, schedules=SCHEDULES)
    return prof, req, get_hardware("a100-80gb")


def _run(prof, req, hw):
    res = search(prof, req, hw)
    plans = [(p.config, tuple(p.ranges), p.step_time, max(p.peak_memory)) for p in res.plans]
    return plans, res.searched, res.simulated, res.auto_runs


def _throttle(monkeypatch):
    """Every clock reading half a second after the one before (a machine many times slower)."""
    for name in ("perf_counter", "process_time", "monotonic", "time"):
        real = getattr(time, name)
        state = {"extra": 0.0}

        def slow(real=real, state=state):
            state["extra"] += 0.5
            return real() + state["extra"]

        monkeypatch.setattr(time, name, slow)


@pytest.mark.parametrize("costly", [None, 0])  # 0: every family waits for auto's threshold
def test_a_throttled_clock_changes_neither_the_plans_nor_the_work(monkeypatch, costly):
    """(Deferring every family here simulates 18 cuts instead of 32: a clock that decided
    it would change the work.)"""
    if costly is not None:
        monkeypatch.setattr(scoring, "COSTLY", costly)
    deferred = []
    orig = scoring.Searcher.costly

    def spy(self, c):
        got = orig(self, c)
        deferred.append(got)
        return got

    monkeypatch.setattr(scoring.Searcher, "costly", spy)
    prof, req, hw = _case()
    quiet = _run(prof, req, hw)
    asked = len(deferred)
    assert any(deferred) == (costly == 0), "the case must test both"
    _throttle(monkeypatch)
    loaded = _run(prof, req, hw)
    assert loaded == quiet  # the same plans, configurations priced, simulations, auto runs
    assert deferred[asked:] == deferred[:asked]  # the same configurations deferred


@pytest.mark.parametrize("name", ("1f1b", "zb-h1", "interleaved-1f1b", "zbv", "v-half",
                                  "dualpipev", "dualpipe"))
def test_schedule_actions_counts_the_generated_schedules_actions(name):
    """schedule_actions (what costly compares) is what generating gives: exactly, but for
    DualPipe's families, where an overlapped F&B pair is one action (then at most)."""
    seen = 0
    for pp, m in ((2, 4), (4, 8), (4, 12)):
        for v in (1, 2):
            try:
                s = get_schedule(name, pp, m, v)
            except Exception:
                continue
            c = Config(ParallelDims(pp=pp), 1, m, name, v, "none", 0.0)
            got = sum(len(list(s.actions(r))) for r in range(s.num_ranks))
            est = scoring.schedule_actions(c)
            if name.startswith("dualpipe"):
                assert got <= est, (name, pp, m, v, est, got)
            else:
                assert est == got, (name, pp, m, v)
            seen += 1
    assert seen
