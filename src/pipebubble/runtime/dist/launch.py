"""Start ``P x D`` worker processes on this machine, watch them, never leave one behind.

The launcher does what ``torchrun`` does for one machine, so a worker cannot tell them
apart: it hosts the rendezvous store (a TCPStore on a free port of 127.0.0.1: it listens on loopback
only, see :func:`loopback_store`) and starts each
worker with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``TORCHELASTIC_USE_AGENT_STORE=True`` (the store is the launcher's, as with torchrun's
agent), and ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` set to the loopback interface
(:func:`loopback_env`): every socket of a one-machine run listens on loopback only. Each worker runs the same command line as the user's: started afresh (``exec``),
or, when the caller passes ``worker``, forked from the launcher and running that function,
which skips a new interpreter and a second import of torch per rank (seconds of CPU each;
PyTorch's DataLoader starts its workers the same way). The launcher then must not have run
multi-threaded torch work before (``pipebubble run`` sets one thread first): a forked child
gets none of the parent's threads.

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
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta

from .watchdog import (
    DIVERGED,
    EXIT_DEADLOCK,
    collect_stuck,
    deadlock_message,
    is_user_failure,
    publish_failure,
)

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


IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
"""The variables that choose the interface gloo, NCCL's bootstrap and TensorPipe listen on.
Unset, gloo binds to whatever this machine's host name resolves to, which may be a LAN
address: its sockets have no authentication."""

_IFF_LOOPBACK = 0x8


def loopback_interface() -> str:
    """The name of this machine's loopback interface (``lo`` on Linux), read from the
    interface flags in /sys/class/net; ``lo`` when they cannot be read."""
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return "lo"
    for name in names:
        try:
            with open(f"/sys/class/net/{name}/flags", encoding="ascii") as f:
                if int(f.read().strip(), 16) & _IFF_LOOPBACK:
                    return name
        except (OSError, ValueError):
            continue
    return "lo"


def loopback_env() -> dict[str, str]:
    """The environment that makes every worker socket of a one-machine run (gloo's pairs,
    NCCL's bootstrap) listen on loopback only; it overrides whatever the user had set.

    >>> sorted(loopback_env())
    ['GLOO_SOCKET_IFNAME', 'NCCL_SOCKET_IFNAME', 'TP_SOCKET_IFNAME']
    """
    lo = loopback_interface()
    return dict.fromkeys(IFNAME_VARIABLES, lo)


def listen_description(environ: dict[str, str] | None = None) -> str:
    """Where this worker's gloo/NCCL sockets will listen, in words, for multi-node runs
    (which must listen on a reachable interface): the interfaces named in
    ``GLOO_SOCKET_IFNAME`` with their addresses, or the address the host name resolves to.
    """
    environ = os.environ if environ is None else environ
    ifname = environ.get("GLOO_SOCKET_IFNAME", "")
    if ifname:
        shown = ", ".join(f"{i} ({_interface_address(i) or 'no IPv4 address'})"
                          for i in ifname.split(","))
        return f"interface {shown} (from GLOO_SOCKET_IFNAME)"
    host = socket.gethostname()
    try:
        addr = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except OSError:
        addr = "an address that does not resolve"
    where = "loopback only" if is_loopback(addr) else "reachable from the network"
    return (f"{addr}, what the host name {host!r} resolves to ({where}; set "
            "GLOO_SOCKET_IFNAME to choose the interface)")


def pin_sockets(master_addr: str, rank: int, local_rank: int = 0) -> str | None:
    """Before a worker creates its process group: with a loopback ``MASTER_ADDR`` (our
    launcher, ``torchrun --standalone``) pin gloo and NCCL to the loopback interface; else
    (a multi-node run, which must be reachable) return the line saying where this node's
    sockets listen, for the first rank of each node (None for the others)."""
    if is_loopback(master_addr):
        os.environ.update(loopback_env())
        return None
    if local_rank != 0:
        return None
    return (f"pipebubble: rank {rank}: gloo/NCCL sockets of this node listen on "
            f"{listen_description()}")


def _interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (the SIOCGIFADDR ioctl), or None."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(raw[20:24])
    except OSError:
        return None


def loopback_socket(world_size: int, port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (a free port unless ``port``), for the store."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(max(128, world_size))
    except BaseException:
        sock.close()
        raise
    return sock


def loopback_store(world_size: int, timeout: float = 60.0, port: int = 0,
                   sock: socket.socket | None = None):
    """A TCPStore server that listens on 127.0.0.1 only, on a free port (or on ``sock``).

    Given a host, torch's TCPStore server still listens on every interface, and the store
    has no authentication: anything that reaches the port could read or stop the run. So
    we bind the listening socket ourselves, to loopback, and hand torch its descriptor
    (``master_listen_fd``); the store owns the descriptor from then on.
    """
    import torch.distributed as dist

    sock = sock or loopback_socket(world_size, port)
    try:
        store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], world_size, True,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store listens on this descriptor now; Python must not close it
    return store


class Forked:
    """A worker forked from the launcher, with the part of Popen's interface we use."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def fork_worker(worker: Callable[[], int], env: dict[str, str], close: int) -> Forked:
    """Fork this process; the child takes ``env`` as its environment, closes descriptor
    ``close`` (the store's listening socket), runs ``worker()`` and exits with its code,
    never returning into the caller's code."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        os.close(close)
        _child_setup()
        if os.getppid() != parent:  # the launcher died before PR_SET_PDEATHSIG was set
            os._exit(1)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        # write where a started process would: the descriptors, not whatever object the
        # caller had put in sys.stdout (a notebook's or pytest's capture)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        code = worker()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child must never return to the caller
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def launch(
    command: Sequence[str],
    world_size: int,
    grace: float = 15.0,
    p2p: str = "",
    env: dict[str, str] | None = None,
    worker: Callable[[], int] | None = None,
) -> int:
    """Run ``command`` as ``world_size`` workers; return the exit code for the whole run.
    With ``worker``, each rank is forked from this process and runs ``worker()`` instead of
    starting ``command`` afresh (see the module doc)."""
    import torch.distributed as dist

    sock = loopback_socket(world_size)
    port = sock.getsockname()[1]
    base = dict(os.environ if env is None else env)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                TORCHELASTIC_USE_AGENT_STORE="True", PIPEBUBBLE_LAUNCHER="1",
                OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"))
    base.update(loopback_env())  # gloo and NCCL sockets on loopback too, not the LAN
    procs: list[subprocess.Popen | Forked] = []
    try:
        for g in range(world_size):
            rank_env = {**base, "RANK": str(g), "LOCAL_RANK": str(g)}
            if worker is not None:
                procs.append(fork_worker(worker, rank_env, sock.fileno()))
            else:
                procs.append(subprocess.Popen(list(command), env=rank_env,
                                              preexec_fn=_child_setup))
        # the workers wait in the socket's backlog until the store serves it
        store = loopback_store(world_size, sock=sock)
        return _watch(procs, dist.PrefixStore("pipebubble", store), grace, p2p)
    except KeyboardInterrupt:
        sys.stderr.write("pipebubble: interrupted; stopping all ranks\n")
        return 130
    finally:
        if sock.fileno() != -1:  # not handed to the store (it failed, or a fork did)
            sock.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()


BAD_INPUT_GRACE = 3.0
"""Seconds the other ranks get to stop after one rank stopped on bad input (exit 2)."""


def _watch(procs: list[subprocess.Popen | Forked], store, grace: float, p2p: str) -> int:
    first: str | None = None
    deadline: float | None = None
    wait = grace
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
                # bad input on one rank (exit 2, its line printed): the others, maybe still
                # joining the process group, have nothing to finish, so they go sooner
                wait = min(grace, BAD_INPUT_GRACE) if rc == 2 else grace
                deadline = time.monotonic() + wait
        if deadline is not None and time.monotonic() > deadline:
            for g, p in enumerate(procs):
                if g not in codes:
                    p.kill()
                    codes[g] = p.wait()
                    sys.stderr.write(f"pipebubble: rank {g} did not stop within {wait:g} s; "
                                     "killed\n")
        time.sleep(0.05)
    if all(rc == 0 for rc in codes.values()):
        return 0
    if any(rc == EXIT_DEADLOCK for rc in codes.values()):
        stuck = collect_stuck(store, len(procs), wait=0.5)
        sys.stderr.write(f"pipebubble: error: {deadlock_message(stuck, len(procs), p2p)}\n")
        return EXIT_DEADLOCK
    if is_user_failure(first):  # bad input or the model's failure: its rank said it
        return 2
    if first is not None and first.startswith(DIVERGED):  # rank 0 reported it
        return 1
    sys.stderr.write(f"pipebubble: error: {first}; all {len(procs)} ranks stopped\n")
    # a rank that stopped on bad input (exit 2, its one-line error above) makes the run's
    # exit code 2 too, as for bad input checked before the launch
    return 2 if 2 in codes.values() else 1


def under_launcher() -> bool:
    """True in a worker process (started by our launcher or by torchrun)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
