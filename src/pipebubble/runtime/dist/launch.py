"""Start ``P x D`` worker processes on this machine, watch them, never leave one behind.

The launcher does what ``torchrun`` does for one machine, so a worker cannot tell them
apart: it hosts the rendezvous store (a TCPStore on a free port of 127.0.0.1: it listens on loopback
only, see :func:`loopback_store`) and starts each
worker with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``TORCHELASTIC_USE_AGENT_STORE=True`` (the store is the launcher's, as with torchrun's
agent). Each worker runs the same command line as the user's.

Failures: when a worker exits with an error or is killed, the launcher publishes
``failed = "rank g died (killed by SIGKILL)"`` in the store, and every other worker's
watchdog reads it and exits within a fraction of a second, naming rank g. Workers still
alive after ``grace`` seconds are killed. Workers die with the launcher
(``PR_SET_PDEATHSIG``) and run in their own process group, so Ctrl-C reaches the launcher,
which stops them. The exit code is 0 only when every worker succeeded; 3 for a deadlock.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

from .watchdog import EXIT_DEADLOCK, collect_stuck, deadlock_message, publish_failure

_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setpgrp()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def describe_exit(rank: int, rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"rank {rank} died (killed by {name})"
    return f"rank {rank} exited with code {rc}"


def is_loopback(host: str) -> bool:
    """True for 127.x.y.z, ::1 and localhost: an address only this machine can reach."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_store(world_size: int, timeout: float = 60.0, port: int = 0):
    """A TCPStore server that listens on 127.0.0.1 only, on a free port.

    Given a host, torch's TCPStore server still listens on every interface, and the store
    has no authentication: anything that reaches the port could read or stop the run. So
    we bind the listening socket ourselves, to loopback, and hand torch its descriptor
    (``master_listen_fd``); the store owns the descriptor from then on.
    """
    import socket

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(max(128, world_size))
        store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], world_size, True,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store listens on this descriptor now; Python must not close it
    return store


def launch(
    command: Sequence[str],
    world_size: int,
    grace: float = 15.0,
    p2p: str = "",
    env: dict[str, str] | None = None,
) -> int:
    """Run ``command`` as ``world_size`` workers; return the exit code for the whole run."""
    import torch.distributed as dist

    store = loopback_store(world_size)
    ours = dist.PrefixStore("pipebubble", store)
    base = dict(os.environ if env is None else env)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                TORCHELASTIC_USE_AGENT_STORE="True", PIPEBUBBLE_LAUNCHER="1",
                OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"))
    procs: list[subprocess.Popen] = []
    try:
        for g in range(world_size):
            procs.append(subprocess.Popen(
                list(command), env={**base, "RANK": str(g), "LOCAL_RANK": str(g)},
                preexec_fn=_child_setup,
            ))
        return _watch(procs, ours, grace, p2p)
    except KeyboardInterrupt:
        sys.stderr.write("pipebubble: interrupted; stopping all ranks\n")
        return 130
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()


def _watch(procs: list[subprocess.Popen], store, grace: float, p2p: str) -> int:
    first: str | None = None
    deadline: float | None = None
    codes: dict[int, int] = {}
    while len(codes) < len(procs):
        for g, p in enumerate(procs):
            if g in codes:
                continue
            rc = p.poll()
            if rc is None:
                continue
            codes[g] = rc
            if rc != 0 and first is None:
                first = describe_exit(g, rc)
                if rc != EXIT_DEADLOCK:
                    first = publish_failure(store, first)
                deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            for g, p in enumerate(procs):
                if g not in codes:
                    p.kill()
                    codes[g] = p.wait()
                    sys.stderr.write(f"pipebubble: rank {g} did not stop within {grace:g} s; "
                                     "killed\n")
        time.sleep(0.05)
    if all(rc == 0 for rc in codes.values()):
        return 0
    if any(rc == EXIT_DEADLOCK for rc in codes.values()):
        stuck = collect_stuck(store, len(procs), wait=0.5)
        sys.stderr.write(f"pipebubble: error: {deadlock_message(stuck, len(procs), p2p)}\n")
        return EXIT_DEADLOCK
    sys.stderr.write(f"pipebubble: error: {first}; all {len(procs)} ranks stopped\n")
    return 1


def under_launcher() -> bool:
    """True in a worker process (started by our launcher or by torchrun)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
