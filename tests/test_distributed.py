"""One process per rank over gloo: gradients, 2D, real deadlock, faults, torchrun.

Every test launches real processes (CPU, gloo, one torch thread each, tiny models) under a
hard timeout, and checks that none is left behind. A launch costs seconds (each process
imports torch and joins a gloo group), so checks share launches where they can: one
selfcheck launch runs every schedule on two layouts, and the torchrun launch also runs the
ZB-V first-step regression. Marked ``distributed``: ``pytest -m "not distributed"`` skips them.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipebubble import get_schedule, schedule_names
from pipebubble.ir.schedule import ScheduleError

pytestmark = pytest.mark.distributed

ENTRY = [sys.executable, "-m", "pipebubble", "run"]
SMALL = ["--width", "8", "--warmup", "0", "--repeat", "1"]


def launch(args, timeout=90, entry=ENTRY):
    """Run a command with a unique tag in its environment; return (proc, seconds, leftovers)."""
    tag = uuid.uuid4().hex
    env = {**os.environ, "PIPEBUBBLE_TEST_TAG": tag, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run([*entry, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc, time.monotonic() - t0, _processes_tagged(tag)


def _processes_tagged(tag: str, grace: float = 2.0) -> list[int]:
    """The processes still carrying ``tag`` once ``grace`` seconds have passed with some left
    (polled: a clean run's children are usually gone at the first look)."""
    deadline = time.monotonic() + grace
    while True:
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                if f"PIPEBUBBLE_TEST_TAG={tag}".encode() in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


TORCHRUN_2 = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", "2", *ENTRY[1:]]  # the same command line, two workers


@pytest.mark.slow
def test_every_schedule_gradients_4_ranks_and_2x2():
    """All registered schedules on a 4-rank pipeline and on 2 replicas of a 2-rank one:
    every gradient and the loss equal the unsplit model's on the global batch."""
    selfcheck = [sys.executable, "-m", "pipebubble.runtime.dist.selfcheck"]
    proc, _, left = launch(["--world", "4", "--layouts", "4x1,2x2", "--p2p", "batched,parity"],
                           timeout=170, entry=selfcheck)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert left == []
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    ran = {(r["schedule"], r["ranks"], r["dp"], r["p2p"]) for r in rows if "skipped" not in r}
    for row in rows:
        if "skipped" not in row:
            assert row["grad_max_abs_diff"] < 1e-5 and row["loss_abs_diff"] < 1e-5, row
    for name in schedule_names(searched=False):
        for p, d in ((4, 1), (2, 2)):
            try:
                get_schedule(name, p, 2 * p)
            except ScheduleError:
                continue
            assert (name, p, d, "batched") in ran, (name, p, d)
    # parity completes for real where the wire simulator says it does (1F1B's exchange)
    assert ("1f1b", 4, 1, "parity") in ran and ("1f1b", 2, 2, "parity") in ran


def test_cli_check_json_two_ranks_dp2():
    proc, _, left = launch(["--schedule", "1f1b", "--ranks", "2", "--microbatches", "3",
                            "--dp", "2", "--check", "--json", *SMALL])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert left == []
    out = json.loads(proc.stdout)
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5
    assert out["dp"] == 2 and out["world_size"] == 4 and out["ranks"] == 2
    assert {e["kind"] for e in out["events"]} == {"F", "B"} and len(out["events"]) == 12
    for key in ("step_time", "bubble_fraction", "lower_bound", "per_rank", "predicted", "loss"):
        assert key in out
    # 2D step = max over ranks of (last action + its stages' all-reduce); in 1F1B rank 0
    # ends last, so the measured all-reduce (> 0) adds to it, and at most both stages' do.
    pred = out["predicted"]
    assert 0 < out["allreduce_time"]
    assert pred["step_time"] < pred["step_time_with_allreduce"]
    assert pred["step_time_with_allreduce"] <= pred["step_time"] + out["allreduce_time"] + 1e-9


def test_naive_ordering_really_deadlocks_and_every_rank_reports():
    proc, took, left = launch(["--schedule", "1f1b", "--ranks", "2", "--microbatches", "4",
                               "--p2p", "naive", "--timeout", "2", *SMALL])
    assert proc.returncode == 3, proc.stderr[-2000:]
    err = proc.stderr
    assert "wire simulator predicts a deadlock" in err
    # the same cycle the wire simulator names: rank 0 sends an activation, rank 1 a gradient
    assert "rank 0 stuck at 0SEND_F1" in err and "rank 1 stuck at 1SEND_B0" in err
    assert "rank 0: no rank has made progress" in err and "rank 1: no rank has made" in err
    assert took < 60 and left == []


@pytest.mark.parametrize("fault, culprit", [("kill:1:2", "rank 1 died (killed by SIGKILL)"),
                                            ("raise:0:3", "rank 0 failed: RuntimeError")])
def test_failed_rank_stops_every_rank_with_its_name(fault, culprit):
    proc, took, left = launch(["--schedule", "gpipe", "--ranks", "2", "--microbatches", "4",
                               "--inject-fault", fault, *SMALL])
    assert proc.returncode != 0
    other = 0 if fault.startswith("kill:1") else 1
    assert f"rank {other}: stopping because {culprit}" in proc.stderr, proc.stderr[-2000:]
    assert f"error: {culprit}" in proc.stderr
    assert took < 60 and left == []


def test_same_entry_point_under_torchrun_and_first_step_headers_do_not_hold_back_sends():
    """Under torchrun the same command line is one worker. The schedule is ZB-V at p=2, m=1:
    rank 0's first batch sends 0F0 and receives 3F0, which rank 1 can only produce from 0F0.
    The shape headers of the first step must not hold the send back (they once did, and the
    run stalled until the watchdog stopped it)."""
    entry = TORCHRUN_2
    proc, took, left = launch(["--schedule", "zbv", "--ranks", "2", "--microbatches", "1",
                               "--check", "--json", "--timeout", "20", *SMALL], entry=entry)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5
    assert out["world_size"] == 2 and out["schedule"] == "zbv"
    # every F, I and W of the 4 stages (2 per rank, V placement) on the one microbatch ran
    assert sorted((e["stage"], e["kind"]) for e in out["events"]) == [
        (s, k) for s in range(4) for k in "FIW"]
    assert took < 60 and left == []


def test_dead_rank_found_by_heartbeat_without_a_launcher():
    """Started by hand (as on several machines without torchrun's agent): rank 0 hosts the
    store; when rank 1 dies, rank 0 notices its heartbeat stopped and names it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tag = uuid.uuid4().hex
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": "2", "PIPEBUBBLE_TEST_TAG": tag, "OMP_NUM_THREADS": "1"}
    args = [*ENTRY, "--schedule", "gpipe", "--ranks", "2", "--microbatches", "4",
            "--inject-fault", "kill:1:2", "--heartbeat-timeout", "3", *SMALL]
    t0 = time.monotonic()
    procs = [subprocess.Popen(args, env={**base, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out0 = procs[0].communicate(timeout=90)
        procs[1].communicate(timeout=10)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 1 and procs[1].returncode == -9
    assert "rank 0: stopping because rank 1 stopped responding" in out0[1], out0[1][-2000:]
    assert time.monotonic() - t0 < 60 and _processes_tagged(tag) == []


def test_auto_under_torchrun_rank_0_searches_and_every_rank_runs_its_order():
    """``--schedule auto`` under torchrun: rank 0 searches (runtime/dist/agree.py) and the
    others run the order it publishes in the store; the step checks out against the unsplit
    model, and every F, I and W ran once."""
    entry = TORCHRUN_2
    proc, took, left = launch(["--schedule", "auto", "--ranks", "2", "--microbatches", "2",
                               "--check", "--json", "--timeout", "20", *SMALL], entry=entry)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["grad_max_abs_diff"] < 1e-5 and out["schedule"] == "auto"
    stages = {e["stage"] for e in out["events"]}
    assert sorted((e["stage"], e["kind"], e["microbatch"]) for e in out["events"]) == sorted(
        (s, k, j) for s in stages for k in "FIW" for j in range(2))
    assert took < 60 and left == []
