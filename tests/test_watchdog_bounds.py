"""Distributed runs end within a bound, naming the culprit: a slow action is blamed on the
rank computing it (not the one waiting), a legitimately long action outlives gloo's timeout,
and a stopped launcher or a hung store ends every worker."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pipebubble.runtime.dist.watchdog import (
    EXIT_FAILED,
    MIN_ACTION_TIMEOUT,
    Watchdog,
    collective_timeout,
    default_action_timeout,
    process_state,
)


class DictStore:
    """The TCPStore calls the watchdog makes, over a dict; ``hang`` blocks every call."""

    def __init__(self, values=None):
        self.values = dict(values or {})
        self.hang = threading.Event()
        self.released = threading.Event()

    def _wait(self):
        if self.hang.is_set():
            self.released.wait(60)

    def set(self, key, value):
        self._wait()
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        self._wait()
        return self.values[key]

    def check(self, keys):
        self._wait()
        return all(k in self.values for k in keys)

    def multi_get(self, keys):
        self._wait()
        return [self.values[k] for k in keys]

    def compare_set(self, key, expected, desired):
        self._wait()
        self.values.setdefault(key, desired.encode())
        return self.values[key]


def _until(pred, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_the_collective_timeout_is_above_every_watchdog_decision():
    for stall in (0.5, 30.0, 600.0):
        for predicted in (0.0, 1.0, 100.0, 5000.0):
            action = default_action_timeout(predicted)
            assert action >= max(MIN_ACTION_TIMEOUT, 10 * predicted)
            pg = collective_timeout(stall, action)
            assert pg > action > predicted and pg >= 3 * stall and pg >= 60


def test_a_legitimate_100_s_action_gets_timeouts_above_it():
    """``run --model sleep --sleep-f 100``: the default action timeout and the process
    group's timeout both exceed the action (gloo used to give up at 90 s)."""
    from pipebubble.commands._run_dist import action_timeout_of

    args = argparse.Namespace(model="sleep", sleep_f=100.0, sleep_b=[1.0, 2.0], sleep_w=0.5,
                              layers=None, action_timeout=None)
    action = action_timeout_of(args)
    assert action == 1000.0 and collective_timeout(30.0, action) > 100.0
    args.action_timeout = 7.0  # given: used as is
    assert action_timeout_of(args) == 7.0
    assert action_timeout_of(argparse.Namespace(model="mlp")) == MIN_ACTION_TIMEOUT


def test_a_peer_computing_one_action_too_long_is_named_as_the_slow_rank():
    store = DictStore({"hb/1": b"3|5|compute|1F2 (compute)"})
    exits: list[int] = []
    wd = Watchdog(store, 0, 2, stall_timeout=60, heartbeat_timeout=60, action_timeout=0.2,
                  exit_fn=exits.append, launcher_pid=None)
    wd.at("recv 1F2", waiting=True)
    wd._beat()
    wd._check_peers()
    assert exits == []
    t0 = time.monotonic()
    while not exits and time.monotonic() - t0 < 5:
        store.set("hb/1", f"{int(time.monotonic() * 1000)}|5|compute|1F2 (compute)")  # alive
        wd._check_peers()
        time.sleep(0.02)
    assert exits == [EXIT_FAILED]
    assert store.values["failed"].startswith(b"rank 1 is slow: it has been computing one "
                                             b"action (1F2 (compute))")


def test_progress_or_waiting_is_not_slow():
    store = DictStore()
    exits: list[int] = []
    wd = Watchdog(store, 0, 2, stall_timeout=60, heartbeat_timeout=60, action_timeout=0.05,
                  exit_fn=exits.append, launcher_pid=None)
    wd._beat()
    for k in range(20):  # a new action every check: progress
        store.set("hb/1", f"{k}|{k}|compute|1F{k} (compute)")
        wd._check_peers()
        time.sleep(0.01)
    store.set("hb/1", "99|20|wait|recv 0B0")  # waiting for a long time is the deadlock rule's
    for _ in range(10):
        wd._check_peers()
        time.sleep(0.01)
    assert exits == []


def test_a_timed_out_wait_blames_the_peer_still_computing():
    store = DictStore({"hb/1": b"3|5|compute|1F0 (compute)"})
    exits: list[int] = []
    wd = Watchdog(store, 0, 2, heartbeat_timeout=0.1, interval=0.02, exit_fn=exits.append,
                  launcher_pid=None)
    wd._beat()
    wd.fail("RuntimeError: Timed out waiting 90000ms for recv", peer_error=True)
    assert exits == [EXIT_FAILED]
    assert store.values["failed"].startswith(b"rank 1 is slow: it was still computing "
                                             b"(1F0 (compute)) when rank 0 gave up waiting")


def test_a_hung_store_ends_the_rank_within_twice_the_heartbeat_timeout():
    store = DictStore()
    exits: list[int] = []
    wd = Watchdog(store, 0, 1, heartbeat_timeout=0.2, interval=0.02, exit_fn=exits.append,
                  launcher_pid=None)
    wd.store_grace = 0.0  # (10 s by default: a deadlock report takes seconds of store calls)
    wd.start()
    store.hang.set()  # the store's host stopped: calls never return
    try:
        assert _until(lambda: exits == [EXIT_FAILED], 5.0)
    finally:
        store.released.set()
        wd._stop.set()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_a_stopped_launcher_ends_the_rank():
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exits: list[int] = []
    wd = Watchdog(DictStore(), 0, 1, heartbeat_timeout=0.2, interval=0.02,
                  exit_fn=exits.append, launcher_pid=launcher.pid).start()
    try:
        time.sleep(0.3)
        assert exits == []  # running: fine
        launcher.send_signal(signal.SIGSTOP)
        assert _until(lambda: process_state(launcher.pid) == "T", 5.0)
        assert _until(lambda: exits == [EXIT_FAILED], 5.0)
    finally:
        wd._stop.set()
        launcher.kill()
        launcher.wait()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_slow_action_is_blamed_on_the_slow_rank_in_a_real_run():
    res = subprocess.run(
        [sys.executable, "-m", "pipebubble", "run", "--model", "sleep", "--schedule", "1f1b",
         "-p", "2", "-m", "2", "--sleep-f", "4", "--sleep-b", "0.02", "--sleep-w", "0.01",
         "--warmup", "0", "--repeat", "1", "--action-timeout", "1"],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("pipebubble: error: rank 0 is slow: it has been computing one "
                           "action (0F0 (compute))"), res.stderr


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_a_stopped_launcher_ends_every_worker_in_a_real_run():
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipebubble", "run", "--model", "sleep", "--schedule", "1f1b",
         "-p", "2", "-m", "4", "--sleep-f", "0.2", "--sleep-b", "0.2", "--sleep-w", "0.1",
         "--warmup", "0", "--repeat", "50", "--heartbeat-timeout", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def workers():
            out = []
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        with open(f"/proc/{d}/stat") as f:
                            if int(f.read().rsplit(")", 1)[1].split()[1]) == proc.pid:
                                out.append(int(d))
                    except (OSError, ValueError, IndexError):
                        pass
            return out

        assert _until(lambda: len(workers()) == 2, 60)
        kids = workers()
        time.sleep(1.0)  # the run is under way
        proc.send_signal(signal.SIGSTOP)
        gone = lambda: all(process_state(k) in (None, "Z") for k in kids)  # noqa: E731
        assert _until(gone, 2 + 10), "workers still running 12 s after the launcher stopped"
    finally:
        proc.send_signal(signal.SIGCONT)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 1
    assert "the launcher (pid" in err and "has been stopped for" in err
