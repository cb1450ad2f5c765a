"""The planner's search over worker processes (plan/search_pool.py) finds the plans the
one-process search finds, every field of them; a worker's failure is one clear error; a
bad ``--jobs`` is one line and exit 2. The searches are small: :data:`PARALLEL_AT` is set
to 0 so that they fork anyway."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.plan import search_pool
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.moe import MoEShape, moe_profile
from pipebubble.plan.planner import Request, search
from pipebubble.plan.scoring import Searcher

DENSE = dict(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000, seq=1024, batch=1,
             tflops=100, mfu=0.5)
MOE = MoEShape(layers=4, hidden=64, heads=4, vocab=128, experts=8, top_k=2, expert_ffn=64,
               shared_experts=1, shared_ffn=64, dense_layers=(0,), dense_ffn=128)


@pytest.fixture(autouse=True)
def _always_fork(monkeypatch):
    monkeypatch.setattr(search_pool, "PARALLEL_AT", 0)


def _dense() -> ProfileSet:
    return ProfileSet([analytic_profile(**DENSE)])


def _same(a, b) -> None:
    """Two Results hold the same plans, every field (the pickled copies included)."""
    assert [p.as_json() for p in a.plans] == [p.as_json() for p in b.plans]
    for p, q in zip(a.plans, b.plans, strict=True):
        assert (p.config, p.ranges, p.step_time, p.peak_memory, p.cut_search, p.static,
                p.schedule_obj.orders) == (q.config, q.ranges, q.step_time, q.peak_memory,
                                           q.cut_search, q.static, q.schedule_obj.orders)
    assert a.searched == b.searched


DENSE_CASES = {
    # auto among the families, pruning on: the K-th best step is shared by the workers
    "auto and families": dict(gpus=8, gpu_memory=4 * 2**30, global_batch=16,
                              microbatch_sizes=(1,), recompute=("none", "full"), top=4,
                              pp=(4, 8), schedules=("1f1b", "zb-h1", "interleaved-1f1b",
                                                    "auto")),
    # every family, pipelined, a tight budget: V families win, memory refusals
    "every family": dict(gpus=8, gpu_memory=6 * 2**30, global_batch=16,
                         microbatch_sizes=(1, 2), recompute=("none", "full"), top=4,
                         pp=(2, 4)),
    # no pruning: everything simulated, in both
    "unpruned": dict(gpus=4, gpu_memory=16 * 2**30, global_batch=8, microbatch_sizes=(1,),
                     recompute=("none",), prune=False, top=3),
}


@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_two_workers_find_the_one_process_plans(case):
    req = Request(**DENSE_CASES[case])
    one = search(_dense(), req)
    two = search(_dense(), replace(req, jobs=2))
    _same(one, two)
    if case == "auto and families":  # auto searched, and it wins
        assert one.auto_runs > 0 and two.auto_runs > 0 and one.plans[0].schedule == "auto"


def test_two_workers_on_an_moe_profile_with_the_compute_model():
    prof = ProfileSet([moe_profile(MOE, seq=32, batch=1)])
    req = Request(gpus=16, gpu_memory=80 * 2**30, global_batch=32, microbatch_sizes=(1, 2),
                  recompute=("none",), schedules=("1f1b", "zb-h1", "auto"), top=5)
    hw = get_hardware("h100-sxm")
    _same(search(prof, req, hw), search(prof, replace(req, jobs=3), hw))


def test_plans_pickle_whole():
    """What a worker sends back: a plan, unpickled, equals the plan (its schedule too)."""
    plan = search(_dense(), Request(**DENSE_CASES["auto and families"])).plans[0]
    back = pickle.loads(pickle.dumps(plan))
    assert back.as_json() == plan.as_json()
    assert back.schedule_obj.orders == plan.schedule_obj.orders


def test_small_searches_stay_in_one_process(monkeypatch):
    monkeypatch.setattr(search_pool, "PARALLEL_AT", 10**9)
    forked = []
    monkeypatch.setattr(search_pool, "parallel_search", lambda *a: forked.append(1))
    search(_dense(), replace(Request(**DENSE_CASES["unpruned"]), jobs=4))
    assert not forked


def test_a_worker_that_raises_is_one_clear_error(monkeypatch):
    def broken(self, c, threshold, budget, min_memory=False):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(Searcher, "evaluate", broken)
    with pytest.raises(search_pool.WorkerError) as err:
        search(_dense(), replace(Request(**DENSE_CASES["unpruned"]), jobs=2))
    text = str(err.value)
    assert "\n" not in text and "ZeroDivisionError" in text and "boom" in text
    assert "jobs 1" in text


def test_a_worker_user_error_comes_back_as_it_was(monkeypatch):
    def refuses(self, c, threshold, budget, min_memory=False):
        raise UserError("--gpu-memory is not what this test wants")

    monkeypatch.setattr(Searcher, "evaluate", refuses)
    with pytest.raises(UserError, match="not what this test wants"):
        search(_dense(), replace(Request(**DENSE_CASES["unpruned"]), jobs=2))


def test_a_worker_that_dies_is_one_clear_error(monkeypatch):
    import os

    def dies(self, c, threshold, budget, min_memory=False):
        os._exit(7)

    monkeypatch.setattr(Searcher, "evaluate", dies)
    with pytest.raises(search_pool.WorkerError, match="died"):
        search(_dense(), replace(Request(**DENSE_CASES["unpruned"]), jobs=2))


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "two"])
def test_bad_jobs_is_one_line_and_exit_2(value, capsys, tmp_path):
    prof = tmp_path / "p.json"
    analytic_profile(**DENSE).save(prof)
    assert main(["plan", "--profile", str(prof), "--gpus", "4", "--global-batch", "8",
                 f"--jobs={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--jobs" in err and value in err


def test_request_jobs_is_checked():
    with pytest.raises(UserError, match="jobs"):
        search(_dense(), replace(Request(**DENSE_CASES["unpruned"]), jobs=0))


def test_cli_jobs_gives_the_same_plans(capsys, tmp_path):
    import json

    prof = tmp_path / "p.json"
    analytic_profile(**DENSE).save(prof)
    out = []
    for jobs in ("1", "2"):
        main(["plan", "--profile", str(prof), "--gpus", "4", "--global-batch", "8",
              "--jobs", jobs, "--json", "--top", "3"])
        got = json.loads(capsys.readouterr().out)
        out.append([{k: v for k, v in p.items() if "seconds" not in k}
                    for p in got["plans"]])
    assert out[0] == out[1]


CTRL_C_SCRIPT = """
import sys, time
from dataclasses import replace
from pipebubble.plan import search_pool
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.layercosts import ProfileSet
from pipebubble.plan.planner import Request, search
from pipebubble.plan.scoring import Searcher
search_pool.PARALLEL_AT = 0
slow = Searcher.evaluate
def evaluate(self, *a, **k):
    time.sleep(0.5)  # a search long enough to be interrupted in the middle
    return slow(self, *a, **k)
Searcher.evaluate = evaluate
print("searching", flush=True)
search(ProfileSet([analytic_profile(**%r)]), replace(Request(**%r), jobs=2))
print("finished", flush=True)
"""


def _children(pid: int) -> list[int]:
    import pathlib
    text = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/task"),
                    reason="needs /proc to see the workers")
def test_ctrl_c_stops_the_parent_and_its_workers():
    import os
    import signal
    import subprocess
    import sys
    import time

    script = CTRL_C_SCRIPT % (DENSE, DENSE_CASES["unpruned"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "searching\n"
        deadline = time.monotonic() + 60
        while len(kids := _children(proc.pid)) < 2:  # both workers forked
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # never a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "finished" not in out and proc.returncode != 0
    assert "KeyboardInterrupt" in err
    time.sleep(0.2)
    assert not [k for k in kids if os.path.exists(f"/proc/{k}") and
                open(f"/proc/{k}/stat").read().split()[2] != "Z"]  # the workers are gone
