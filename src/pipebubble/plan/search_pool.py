"""The planner's search over several worker processes (``Request.jobs``), with the plans
the one-process search finds, exactly.

The listing (:class:`~.search.Listed`), the searchers and their caches are built once, in
this process; ``jobs`` workers are forked from it (they share all of that copy-on-write)
and visit the same configurations by the same rule (:class:`~.search.Visits`):

- the families, in the order of the estimate, handed out a few at a time from one shared
  counter (a worker takes the next ones whose bound beats the threshold: the visit stays
  in the estimate's order, and no worker waits for another's slow ones);
- then auto's configurations, in the order of their cut's bound, one at a time from a
  second counter (the first worker there sorts them, against the threshold then);
- then the costly families any worker deferred (:meth:`~.scoring.Searcher.costly`).

The threshold is the K-th best step of every worker's plans: each plan a worker finds
(and keeps) goes into one shared array of the K best steps, so the threshold any worker
reads is the K-th step of plans that exist, a true bound, as in one process. A
configuration whose plan could enter the top K is therefore scored by some worker, and
``evaluate``'s answer does not depend on the threshold it is given beyond being None
when it cannot beat it (:meth:`~.scoring.Searcher.evaluate`). Each worker sends back its
own K best plans (pickled) and its counts; the K best of their union by
:func:`~.search.plan_order`, a total order of configurations, are the one-process search's
plans whatever the interleaving (tests/test_plan_parallel.py). What differs is what was
simulated (its count in the Result): a worker may score a configuration before another's
plan would have ruled it out.

Below :data:`PARALLEL_AT` listed configurations (a count, never the clock) the search runs
in one process: forking and the caches each worker fills again would cost more than they
save. A worker that raises makes the search raise (a :class:`~pipebubble.errors.UserError`
as it was, anything else as one line, :class:`WorkerError`); one that dies too; the other
workers are killed, as they are when this process is interrupted (Ctrl-C) or any error
leaves the wait. Workers ignore SIGINT (this process handles it) and stop when this
process is gone.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait

import numpy as np

from ..errors import UserError
from .plans import Plan, Request
from .scoring import Searcher
from .search import Listed, Visits, auto_order

PARALLEL_AT = 40_000  # listed configurations (families and auto's): fewer run in one process
GRAB = 4  # family configurations a worker takes at once, of those its threshold leaves
WINDOW = 4096  # listed family configurations looked at for them under the lock, at most
POLL = 0.002  # seconds between looks at the deferred list while a worker still adds to it


class WorkerError(RuntimeError):
    """A worker process of the planner's search failed or died (one line)."""


def runs_parallel(req: Request, listed: Listed) -> bool:
    """Whether the search forks workers: ``req.jobs`` > 1 and at least :data:`PARALLEL_AT`
    configurations listed."""
    return req.jobs > 1 and len(listed.estimates) + len(listed.autos) >= PARALLEL_AT


class Board:
    """What the workers share (allocated before the fork): the K best steps found by any
    of them, the counters that hand out the work, and the costly families deferred."""

    def __init__(self, ctx, top: int, families: int, autos: int, jobs: int):
        self.lock = ctx.Lock()
        self.top = top
        self.steps = ctx.RawArray("d", [math.inf] * top)  # ascending
        self.next_family = ctx.RawValue("q", 0)
        self.in_families = ctx.RawValue("i", jobs)  # workers not past the families yet
        self.auto_state = ctx.RawValue("i", 0)  # 0: not sorted, 1: being sorted, 2: sorted
        self.auto_ready = ctx.Event()
        self.auto_order = ctx.RawArray("q", max(autos, 1))
        self.auto_starts = ctx.RawArray("q", autos + 1)  # where each group of siblings starts
        self.auto_count = ctx.RawValue("q", 0)  # groups
        self.next_auto = ctx.RawValue("q", 0)
        self.late = ctx.RawArray("q", max(families, 1))
        self.late_count = ctx.RawValue("q", 0)
        self.next_late = ctx.RawValue("q", 0)

    def kth(self) -> float:
        with self.lock:
            return self.steps[self.top - 1]

    def add(self, step: float) -> None:
        """A plan's step into the K best (each plan once: the workers visit apart)."""
        with self.lock:
            steps = self.steps
            if not step < steps[self.top - 1]:
                return
            k = self.top - 1
            while k > 0 and steps[k - 1] > step:
                steps[k] = steps[k - 1]
                k -= 1
            steps[k] = step


class SharedVisits(Visits):
    """A worker's :class:`~.search.Visits`: its threshold is the K-th best step of every
    worker's plans (:class:`Board`), and each plan it finds goes onto the board."""

    def __init__(self, req: Request, keep, board: Board):
        super().__init__(req, keep)
        self.board = board

    def kth(self) -> float:
        return self.board.kth()

    def found(self, plan: Plan) -> None:
        super().found(plan)
        self.board.add(plan.step_time)


def parallel_search(req: Request, keep: Callable[[Plan], bool] | None,
                    searchers: list[Searcher], listed: Listed, visit_order: np.ndarray
                    ) -> tuple[list[Plan], tuple[int, int, float]]:
    """The plans ``req.jobs`` workers found (each one's K best) and the counts summed over
    them: (simulations, auto's searches, their seconds)."""
    ctx = mp.get_context("fork")
    jobs = req.jobs
    board = Board(ctx, req.top, len(visit_order), len(listed.autos), jobs)
    ordered_bounds = listed.bounds[visit_order]
    base = counts_of(searchers)
    parent = os.getpid()

    def work(conn) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
        try:
            v = SharedVisits(req, keep, board)
            worker_loop(v, board, listed, visit_order, ordered_bounds, parent)
            now = counts_of(searchers)
            conn.send(("ok", pickle.dumps(v.best), tuple(a - b for a, b in zip(now, base,
                                                                                strict=True))))
        except BaseException as exc:  # noqa: BLE001 -- every failure goes back as one line
            conn.send(("error", *failure(exc)))
        finally:
            conn.close()

    procs, conns = [], {}
    try:
        for i in range(jobs):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=work, args=(w,), name=f"pipebubble-plan-{i}", daemon=True)
            p.start()
            w.close()
            procs.append(p)
            conns[r] = i
        found: list[Plan] = []
        total = [0, 0, 0.0]
        while conns:
            for r in wait(list(conns)):
                i = conns.pop(r)
                try:
                    msg = r.recv()
                except EOFError:
                    procs[i].join(5)
                    raise WorkerError(f"the planner's worker {i + 1} of {jobs} died (exit code "
                                      f"{procs[i].exitcode}); run with jobs 1 to search in "
                                      "one process") from None
                finally:
                    r.close()
                if msg[0] == "error":
                    raise rebuilt(msg[1:], i, jobs)
                found += pickle.loads(msg[1])
                total = [a + b for a, b in zip(total, msg[2], strict=True)]
        for p in procs:
            p.join()
        return found, (base[0] + total[0], base[1] + total[1], base[2] + total[2])
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        for r in conns:
            r.close()


def counts_of(searchers: list[Searcher]) -> tuple[int, int, float]:
    """(simulations, auto's searches, their seconds) over ``searchers``."""
    return (sum(s.simulated for s in searchers), sum(s.auto_runs for s in searchers),
            sum(s.auto_seconds for s in searchers))


def worker_loop(v: SharedVisits, board: Board, listed: Listed, visit_order: np.ndarray,
                ordered_bounds: np.ndarray, parent: int) -> None:
    """One worker's share: the families, auto's configurations, the deferred (module doc).
    It stops early when the parent is gone."""
    n = len(visit_order)
    lock = board.lock
    while True:  # the families, a few at a time in the estimate's order
        if os.getppid() != parent:
            return
        with lock:
            k = board.next_family.value
            if k >= n:
                board.in_families.value -= 1
                break
            limit = math.nextafter(board.steps[board.top - 1], math.inf) if v.req.prune \
                else math.inf
            hit = np.flatnonzero(ordered_bounds[k:k + WINDOW] < limit)
            if len(hit) > GRAB:
                hit = hit[:GRAB]
                board.next_family.value = k + int(hit[-1]) + 1
            else:
                board.next_family.value = min(n, k + WINDOW)
        for h in hit.tolist():
            j = int(visit_order[k + h])
            if v.visit(*listed.config(j), may_defer=True):
                with lock:
                    board.late[board.late_count.value] = j
                    board.late_count.value += 1
    autos = listed.autos
    with lock:
        sorts = board.auto_state.value == 0
        if sorts:
            board.auto_state.value = 1
    if sorts:  # the first worker here sorts auto's configurations for all
        order, starts = sibling_groups(autos, auto_order(autos, v.threshold()))
        board.auto_order[:len(order)] = order
        board.auto_starts[:len(starts)] = starts
        board.auto_count.value = len(starts) - 1
        board.auto_state.value = 2
        board.auto_ready.set()
    else:
        while not board.auto_ready.wait(1.0):
            if os.getppid() != parent:
                return
    while True:  # auto's, a group of siblings at a time in that order
        with lock:
            g = board.next_auto.value
            if g >= board.auto_count.value:
                break
            board.next_auto.value = g + 1
        for k in range(board.auto_starts[g], board.auto_starts[g + 1]):
            v.visit(*autos[board.auto_order[k]])
    while True:  # the deferred costly families, once every worker is past the families
        with lock:
            k, added = board.next_late.value, board.late_count.value
            if k < added:
                board.next_late.value = k + 1
                j = board.late[k]
            elif board.in_families.value == 0:
                return
            else:
                j = -1
        if j < 0:
            if os.getppid() != parent:
                return
            time.sleep(POLL)
            continue
        v.visit(*listed.config(j))


def sibling_groups(autos: list, order: list[int]) -> tuple[list[int], list[int]]:
    """``order`` with each auto configuration moved up to its first sibling's place (the
    same configuration at another sharding: the same layer costs, pipeline and
    microbatches, which auto's caches of orders and runs serve again), and where each group
    starts (and the end): a worker takes a group, so those caches serve it in one process."""
    groups: dict[tuple, list[int]] = {}
    for k in order:
        c, s = autos[k]
        key = (id(s.p), c.pp, c.dp, c.microbatches, c.chunks, c.microbatch_size, c.recompute,
               c.schedule)
        groups.setdefault(key, []).append(k)
    out, starts = [], [0]
    for members in groups.values():  # dicts keep the order of first appearance
        out += members
        starts.append(len(out))
    return out, starts


def failure(exc: BaseException) -> tuple[bool, str, bytes | None]:
    """What a worker sends back of its failure: whether it is a UserError, one line, and
    the error pickled when it pickles (else None)."""
    line = str(exc)
    if not isinstance(exc, UserError):
        line = line.strip().splitlines()[0] if line.strip() else ""
        where = traceback.extract_tb(exc.__traceback__)
        at = f" at {os.path.basename(where[-1].filename)}:{where[-1].lineno}" if where else ""
        line = f"{type(exc).__name__}{at}" + (f": {line}" if line else "")
    try:
        blob = pickle.dumps(exc) if isinstance(exc, UserError) else None
        if blob is not None:
            pickle.loads(blob)
    except Exception:  # noqa: BLE001 -- an error that does not round-trip goes as its text
        blob = None
    return isinstance(exc, UserError), line, blob


def rebuilt(msg: tuple, i: int, jobs: int) -> Exception:
    """The error a worker's failure raises here: its UserError again, else a WorkerError."""
    user, line, blob = msg
    if user:
        return pickle.loads(blob) if blob is not None else UserError(line)
    return WorkerError(f"the planner's worker {i + 1} of {jobs} failed: {line}; run with "
                       "jobs 1 to search in one process")
