"""A watchdog thread per rank: heartbeats, deadlock detection and failure propagation.

Every rank publishes, through the rendezvous key-value store (a TCPStore, separate from the
process group's connections, so it still answers while P2P calls are stuck), a heartbeat
``hb/<rank> = seq|actions done|state|where``, where ``state`` is ``compute``, ``wait`` (in
a blocking send, receive or collective) or ``done``. Each watchdog reads everybody's and
ends its own process (``os._exit``, the main thread may be stuck inside gloo) when:

- another rank has published ``failed`` (it raised, or the launcher saw it die): exit 1,
  naming that rank;
- a peer's heartbeat has not moved for ``heartbeat_timeout`` seconds (the process died or
  froze, e.g. under torchrun where no launcher of ours watches): it publishes ``failed`` and
  exits 1;
- a peer has been computing one action for more than ``action_timeout`` seconds (it is
  alive, its heartbeat moves, but the others wait for it): it publishes ``failed`` naming
  that peer as the slow rank and exits 1. The process group's own timeout
  (:func:`collective_timeout`) is set above it, so gloo's timeout never fires first and
  never blames the rank that was only waiting; when it does fire (a slow NCCL kernel), the
  waiting rank looks at the heartbeats and names the peer still computing;
- every rank is waiting and no rank has finished an action for ``stall_timeout`` seconds:
  a deadlock.

A second, smaller thread (the guard) watches what the first cannot see while it is blocked:
a store call that has not returned for ``2 x heartbeat_timeout`` seconds (at least 10) (the store's host,
the launcher or rank 0, is stopped: its socket is open, nothing answers) and, under our
launcher, the launcher itself stopped (``kill -STOP``, Ctrl-Z) for ``heartbeat_timeout``
seconds, read from ``/proc/<pid>/stat``. Either ends this rank (exit 1) within that bound,
instead of the run freezing until someone resumes the launcher. Each rank publishes ``stuck/<rank>`` with the operation it is stuck at, prints
  it, and exits 3. The coordinator (the launcher, or rank 0 under torchrun) prints them all.

Exit codes: 1 failure elsewhere or here, 2 bad input or the model's own code failed (one
rank prints the line: :meth:`Watchdog.fail_user`), 3 deadlock.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

EXIT_FAILED = 1
EXIT_DEADLOCK = 3


def publish_failure(store, message: str) -> str:
    """Record the first failure in the store; return the one that stands (maybe earlier)."""
    try:
        got = store.compare_set("failed", "", message)
        return got.decode() if isinstance(got, bytes) else str(got)
    except Exception:  # noqa: BLE001 - the store itself may be gone with the failed rank
        return message


USER_FAILURE = "user error: "
"""Prefix of a ``failed`` value published for bad input or the model's own failure: the rank
that published it prints the one line and exits 2; the others and the launcher stop quietly
(so the run says it once)."""
EXIT_USER = 2
DIVERGED = "diverged: "
"""Prefix of the ``failed`` value rank 0 publishes after a finished run whose training
diverged: the launcher exits 1 without a line (rank 0 printed the report and the line);
watchdogs ignore it (every rank has finished)."""


def is_user_failure(message: str | None) -> bool:
    return bool(message) and message.startswith(USER_FAILURE)


def read_failure(store) -> str | None:
    try:
        if store.check(["failed"]):
            return store.get("failed").decode(errors="replace")[:500]
    except Exception:  # noqa: BLE001
        return "the rendezvous store stopped answering (the launcher or rank 0 is gone)"
    return None


def collect_stuck(store, world: int, wait: float = 3.0) -> dict[int, str]:
    """The stuck operation every rank published, waiting up to ``wait`` s for stragglers."""
    out: dict[int, str] = {}
    deadline = time.monotonic() + wait
    while True:
        for g in range(world):
            if g not in out:
                try:
                    if store.check([f"stuck/{g}"]):
                        out[g] = store.get(f"stuck/{g}").decode(errors="replace")[:500]
                except Exception:  # noqa: BLE001
                    return out
        if len(out) == world or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def _any_stuck(store, world: int) -> bool:
    try:
        return any(store.check([f"stuck/{g}"]) for g in range(world))
    except Exception:  # noqa: BLE001
        return False


def deadlock_message(stuck: dict[int, str], world: int, p2p: str = "") -> str:
    how = f" with --p2p {p2p}" if p2p else ""
    parts = [f"rank {g} stuck at {stuck.get(g, '(no report)')}" for g in range(world)]
    return f"deadlock{how}: " + "; ".join(parts)


STATES = ("compute", "wait", "done")

MIN_ACTION_TIMEOUT = 300.0
"""The default ``action_timeout`` is at least this many seconds, and 10x the longest action
the run predicts (:func:`default_action_timeout`)."""


def default_action_timeout(predicted_action: float = 0.0) -> float:
    """How long one action may run before its rank is called slow: 10x the longest
    predicted action, at least :data:`MIN_ACTION_TIMEOUT`.

    >>> default_action_timeout(100.0)   # a legitimate 100 s action is not cut short
    1000.0
    """
    return max(MIN_ACTION_TIMEOUT, 10.0 * predicted_action)


def collective_timeout(stall_timeout: float, action_timeout: float | None = None) -> float:
    """The process group's timeout (gloo's and NCCL's, per P2P message and collective):
    above everything the watchdog decides on, so the watchdog, which knows which rank is
    slow, dead or deadlocked, always speaks first: 60 s, 3x the stall timeout, and twice the
    action timeout plus a minute, whichever is largest.

    >>> collective_timeout(30.0, 1000.0)
    2060.0
    """
    return max(60.0, 3.0 * stall_timeout, 2.0 * (action_timeout or 0.0) + 60.0)


def parse_heartbeat(raw: bytes | str) -> tuple[str, int, str, str] | None:
    """``seq|count|state|where`` -> (seq, count, state, where), or None when malformed.

    The store is shared, so a value may be anything; the watchdog thread must never die
    on one (it is the deadlock detector).

    >>> parse_heartbeat(b"7|12|wait|recv 1F3")
    ('7', 12, 'wait', 'recv 1F3')
    >>> parse_heartbeat(b"1|lots|wait|x") is None
    True
    """
    try:
        text = raw.decode() if isinstance(raw, bytes | bytearray) else str(raw)
        seq, count, state, where = text.split("|", 3)
        n = int(count)
    except (UnicodeDecodeError, ValueError):
        return None
    if state not in STATES or n < 0:
        return None
    return seq, n, state, where


class Watchdog:
    """Watches one rank; the main thread tells it what it is doing (:meth:`at`)."""

    def __init__(
        self,
        store,
        rank: int,
        world: int,
        stall_timeout: float = 30.0,
        heartbeat_timeout: float = 10.0,
        interval: float = 0.25,
        coordinator: bool = False,
        p2p: str = "",
        exit_fn: Callable[[int], None] = os._exit,
        action_timeout: float | None = None,
        launcher_pid: int | None = -1,
    ):
        self.store, self.rank, self.world = store, rank, world
        self.stall_timeout, self.heartbeat_timeout = stall_timeout, heartbeat_timeout
        self.interval, self.coordinator, self.p2p = interval, coordinator, p2p
        self.exit_fn = exit_fn
        self.action_timeout = action_timeout
        self._computing: dict[int, tuple[int, str, float]] = {}  # rank -> (count, where, since)
        # -1: find it (the parent, under our launcher); None: do not watch a launcher
        self.launcher_pid = _our_launcher_pid() if launcher_pid == -1 else launcher_pid
        self._store_ok = time.monotonic()  # when a store call last returned
        # a deadlock report holds the thread in store calls for a few seconds: never less
        self.store_grace = 10.0
        self._guard = threading.Thread(target=self._guard_loop, name="pipebubble-guard",
                                       daemon=True)
        self.state, self.where, self.count = "compute", "starting", 0
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pipebubble-watchdog",
                                        daemon=True)
        self._peers: dict[int, tuple[str, float]] = {}  # rank -> (heartbeat seq, when it moved)
        self._counts: tuple = ()
        self._counts_since = time.monotonic()

    # ---- called by the main thread ---------------------------------------------------
    def at(self, where: str, waiting: bool) -> None:
        self.where, self.state = where, ("wait" if waiting else "compute")

    def advance(self) -> None:
        self.count += 1

    def start(self) -> Watchdog:
        self._beat()
        self._thread.start()
        self._guard.start()
        return self

    def stop(self) -> None:
        """This rank is done: peers stop expecting its heartbeat."""
        self.state, self.where = "done", "finished"
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._beat()

    def fail(self, message: str, peer_error: bool = False) -> None:
        """The main thread raised: publish (unless a peer failed first), print, exit 1.

        ``peer_error``: the error came from a connection to a peer (it closed, timed out):
        the peer is the likely culprit, so wait up to the heartbeat timeout for its failure
        (or the launcher's word on it) before blaming this rank.
        """
        if _any_stuck(self.store, self.world):  # a deadlock is being reported: join it
            self._stop.set()
            self._deadlock(self.stall_timeout)
            return
        blame = f"rank {self.rank} failed: {message}"
        if peer_error:  # the watchdog thread keeps running: it may find the dead peer
            self.where, self.state = f"{self.where} (failed: {message})", "wait"
            deadline = time.monotonic() + self.heartbeat_timeout + 4 * self.interval
            while time.monotonic() < deadline and read_failure(self.store) is None:
                time.sleep(self.interval)
            slow = self._slow_peer()
            if slow is not None:  # alive and computing: it is the one we waited for
                g, where = slow
                blame = (f"rank {g} is slow: it was still computing ({where}) when rank "
                         f"{self.rank} gave up waiting for it ({message}); if such long "
                         "actions are expected, raise --action-timeout")
        self._stop.set()
        first = publish_failure(self.store, blame)
        if is_user_failure(first):  # a rank named the model's failure: it says it
            self.exit_fn(EXIT_USER)
            return
        _say(f"rank {self.rank}: {message}" if first.startswith(f"rank {self.rank} failed")
             else f"rank {self.rank}: stopping because {first}")
        self.exit_fn(EXIT_FAILED)

    def fail_user(self, line: str) -> None:
        """The main thread hit bad input or the model's own failure (``line``: one line
        that names it): the first rank to publish one prints it, every rank exits 2."""
        self._stop.set()
        mine = USER_FAILURE + line
        first = publish_failure(self.store, mine)
        if first == mine:
            _say(f"error: {line}")
        elif not is_user_failure(first):
            _say(f"rank {self.rank}: stopping because {first}")
            self.exit_fn(EXIT_FAILED)
            return
        self.exit_fn(EXIT_USER)

    def _slow_peer(self) -> tuple[int, str] | None:
        """A peer whose heartbeat says it is computing (the rank this one waits for)."""
        try:
            raw = self.store.multi_get([f"hb/{g}" for g in range(self.world)])
        except Exception:  # noqa: BLE001
            return None
        for g, val in enumerate(raw):
            beat = parse_heartbeat(val)
            if g != self.rank and beat is not None and beat[2] == "compute":
                return g, beat[3]
        return None

    def _check_slow(self, g: int, count: int, state: str, where: str, now: float) -> bool:
        """Publish and exit when peer ``g`` computed one action longer than the action
        timeout; True if it did (``exit_fn`` may return in tests)."""
        if self.action_timeout is None or g == self.rank:
            return False
        if state != "compute" or where == "starting":  # waiting, done, or still setting up
            self._computing.pop(g, None)
            return False
        last = self._computing.get(g)
        if last is None or last[0] != count or last[1] != where:
            self._computing[g] = (count, where, now)
            return False
        if now - last[2] <= self.action_timeout:
            return False
        msg = (f"rank {g} is slow: it has been computing one action ({where}) for "
               f"{now - last[2]:.1f} s, over --action-timeout {self.action_timeout:g} s; "
               "raise --action-timeout if such long actions are expected")
        msg = publish_failure(self.store, msg)
        _say(f"rank {self.rank}: stopping because {msg}")
        self.exit_fn(EXIT_FAILED)
        return True

    # ---- the thread ----------------------------------------------------------------------
    def _beat(self) -> None:
        self._seq += 1
        try:
            self.store.set(f"hb/{self.rank}",
                           f"{self._seq}|{self.count}|{self.state}|{self.where}")
            self._store_ok = time.monotonic()
        except Exception:  # noqa: BLE001
            pass

    def _guard_loop(self) -> None:
        """The guard thread (module doc): a store that hangs, a launcher that is stopped."""
        stopped_since: float | None = None
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            if now - self._store_ok > max(2 * self.heartbeat_timeout, self.store_grace):
                _say(f"rank {self.rank}: stopping because the rendezvous store has not "
                     f"answered for {now - self._store_ok:.0f} s (the launcher or rank 0 is "
                     f"stopped or gone; this rank was at {self.where})")
                self.exit_fn(EXIT_FAILED)
                return
            if self.launcher_pid is None:
                continue
            state = process_state(self.launcher_pid)
            if state in ("T", "t"):
                stopped_since = stopped_since or now
                if now - stopped_since > self.heartbeat_timeout:
                    _say(f"rank {self.rank}: stopping because the launcher (pid "
                         f"{self.launcher_pid}) has been stopped for "
                         f"{now - stopped_since:.0f} s (SIGSTOP or Ctrl-Z); the run cannot "
                         "go on without it")
                    self.exit_fn(EXIT_FAILED)
                    return
            else:
                stopped_since = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._beat()
            failed = read_failure(self.store)
            if failed and failed.startswith(DIVERGED):  # a finished run's verdict
                failed = None
            if failed and not self._stop.is_set():
                if is_user_failure(failed):  # its rank has said it, in one line
                    self.exit_fn(EXIT_USER)
                    return
                _say(f"rank {self.rank}: stopping because {failed} (this rank was at "
                     f"{self.where})")
                self.exit_fn(EXIT_FAILED)
                return
            self._check_peers()

    def _check_peers(self) -> None:
        now = time.monotonic()
        try:
            raw = self.store.multi_get([f"hb/{g}" for g in range(self.world)])
        except Exception:  # noqa: BLE001 - a peer has not published yet, or store gone
            return
        states, counts = [], []
        for g, val in enumerate(raw):
            beat = parse_heartbeat(val)
            if beat is None:  # malformed (not ours, or a partial write): judge it next time
                states.append("compute")
                counts.append(-1)
                continue
            seq, count, state, where = beat
            states.append(state)
            counts.append(count)
            if self._check_slow(g, count, state, where, now):
                return
            last = self._peers.get(g)
            if last is None or last[0] != seq:
                self._peers[g] = (seq, now)
            elif (state != "done" and g != self.rank
                  and now - last[1] > self.heartbeat_timeout):
                msg = (f"rank {g} stopped responding: no heartbeat for "
                       f"{now - last[1]:.0f} s (it was at {where})")
                msg = publish_failure(self.store, msg)
                _say(f"rank {self.rank}: stopping because {msg}")
                self.exit_fn(EXIT_FAILED)
                return
        if tuple(counts) != self._counts or "compute" in states or self.state == "done":
            self._counts, self._counts_since = tuple(counts), now
            return
        if now - self._counts_since > self.stall_timeout:
            self._deadlock(now - self._counts_since)

    def _deadlock(self, stalled: float) -> None:
        try:
            self.store.set(f"stuck/{self.rank}", self.where)
        except Exception:  # noqa: BLE001
            pass
        _say(f"rank {self.rank}: no rank has made progress for {stalled:.1f} s; "
             f"this rank is stuck at {self.where}")
        # Every rank sees the stall within one interval; wait for all reports before
        # exiting, or a peer's blocked call would fail on our closed connection first.
        stuck = collect_stuck(self.store, self.world, wait=2.0 + 4 * self.interval)
        if self.coordinator:
            _say("error: " + deadlock_message(stuck, self.world, self.p2p))
        self.exit_fn(EXIT_DEADLOCK)


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T`` stopped, ``Z``...) from
    /proc, or None when it cannot be read (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _our_launcher_pid() -> int | None:
    """The launcher's pid when this process is a worker of ``pipebubble run`` (its parent)."""
    return os.getppid() if os.environ.get("PIPEBUBBLE_LAUNCHER") == "1" else None


def _say(line: str) -> None:
    sys.stderr.write(f"pipebubble: {line}\n")
    sys.stderr.flush()
