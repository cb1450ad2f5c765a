"""A one-machine run listens on loopback only: every listening TCP socket of the launcher and
of its workers (the store, gloo's pairs) is on 127.0.0.1 or ::1, read from /proc during a
real run; even when the user's environment points gloo at another interface."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipebubble.runtime.dist.launch import (
    listen_description,
    loopback_env,
    loopback_interface,
)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"),
                                reason="needs Linux /proc/net/tcp")

_LOOPBACK = {"tcp": lambda a: a.endswith("7F") or a == "0100007F",  # 127.x.y.z (little end)
             "tcp6": lambda a: a == "00000000000000000000000001000000"}  # ::1


def _listening() -> dict[int, tuple[str, str, int]]:
    """socket inode -> (table, hex address, port) of every listening TCP socket."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{table}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            addr, port = cols[1].split(":")
            if cols[3] == "0A":  # LISTEN
                out[int(cols[9])] = (table, addr, int(port, 16))
    return out


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from the ppid in /proc/*/stat)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = {pid}, [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(kids)
        todo.extend(kids)
    return out


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    except OSError:
        pass
    return out


def _interface_with_an_address_other_than_loopback() -> str | None:
    from pipebubble.runtime.dist.launch import _interface_address

    for name in sorted(os.listdir("/sys/class/net")):
        addr = _interface_address(name)
        if addr and not addr.startswith("127."):
            return name
    return None


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("user_ifname", [None, "other"])
def test_every_listening_socket_of_a_one_machine_run_is_on_loopback(user_ifname):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.pop(k, None)
    if user_ifname:  # the user's environment asks for a LAN interface: still loopback
        name = _interface_with_an_address_other_than_loopback()
        if name is None:
            pytest.skip("no interface with a non-loopback IPv4 address here")
        env["GLOO_SOCKET_IFNAME"] = name
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipebubble", "run", "--model", "sleep", "--schedule", "1f1b",
         "-p", "2", "-m", "4", "--sleep-f", "0.05", "--sleep-b", "0.05", "--sleep-w", "0.02",
         "--warmup", "0", "--repeat", "4"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: dict[int, tuple[str, str, int]] = {}
    workers = set()
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            pids = _descendants(proc.pid)
            listening = _listening()
            for pid in pids:
                for inode in _socket_inodes(pid):
                    if inode in listening:
                        seen[inode] = listening[inode]
                        if pid != proc.pid:
                            workers.add(pid)
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
        err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, err
    assert workers, "saw no worker's listening socket during the run"
    assert len(seen) >= 2, seen  # the store, and gloo's on the workers
    off = [(t, a, port) for t, a, port in seen.values() if not _LOOPBACK[t](a)]
    assert not off, f"sockets listening beyond loopback: {off}"


def test_the_loopback_environment_names_the_loopback_interface():
    lo = loopback_interface()
    with open(f"/sys/class/net/{lo}/flags") as f:
        assert int(f.read(), 16) & 0x8  # IFF_LOOPBACK
    assert set(loopback_env().values()) == {lo}


def test_multi_node_runs_say_where_they_listen():
    text = listen_description({"GLOO_SOCKET_IFNAME": loopback_interface()})
    assert "127.0.0.1" in text and "GLOO_SOCKET_IFNAME" in text
    text = listen_description({})
    assert "host name" in text and "GLOO_SOCKET_IFNAME" in text
