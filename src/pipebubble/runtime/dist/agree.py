"""One rank searches, every rank runs the same order.

A searched schedule (``auto``) is not a formula: under torchrun every worker builds its
schedule from the flags, and a search run on every rank would take every rank's time and
rely on each coming out the same. :func:`agreed_schedule` runs the search on global rank 0
only and hands its order to the others through the rendezvous store, as data (the
placement, the chains and each rank's steps in the text form of ``ir/schedule.py``).
The others wait for it within a deadline and stop at once if rank 0 reports a failure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ...ir.schedule import Schedule, ScheduleError, make_schedule, parse_step, step_text, validate
from .watchdog import read_failure

KEY = "agreed-schedule"


def schedule_to_json(schedule: Schedule) -> str:
    """The order as data: name, stages, microbatches, placement, chains, rank orders."""
    return json.dumps({
        "name": schedule.name, "stages": schedule.num_stages,
        "microbatches": schedule.num_microbatches,
        "placement": list(schedule.stage_to_rank), "chain_starts": list(schedule.chain_starts),
        "orders": [[step_text(st, tagged=True) for st in order] for order in schedule.orders],
    })


def schedule_from_json(text: str) -> Schedule:
    """The inverse of :func:`schedule_to_json` (validated)."""
    d = json.loads(text)
    sched = make_schedule(d["name"], [[parse_step(x) for x in o] for o in d["orders"]],
                          d["stages"], d["microbatches"], placement=d["placement"],
                          chain_starts=d["chain_starts"])
    validate(sched)
    return sched


def agreed_schedule(store, rank: int, build: Callable[[], Schedule],
                    timeout: float = 600.0) -> Schedule:
    """``build()`` on rank 0, published in ``store``; the same order, read back, elsewhere.
    A rank that waits longer than ``timeout`` seconds, or sees a failure published in the
    store (rank 0's search failed), raises instead of hanging."""
    if rank == 0:
        schedule = build()
        store.set(KEY, schedule_to_json(schedule))
        return schedule
    deadline = time.monotonic() + timeout
    while not store.check([KEY]):
        failed = read_failure(store)
        if failed:
            raise ScheduleError(f"rank 0 could not make the schedule: {failed}")
        if time.monotonic() > deadline:
            raise ScheduleError(f"rank 0 did not publish the schedule within {timeout:g} s")
        time.sleep(0.05)
    return schedule_from_json(store.get(KEY).decode())
