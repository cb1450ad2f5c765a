"""Local search over large orders: short moves of critical actions, answered from the tails.

The local search of ``auto`` (``pipebubble.schedules.auto.improve``) holds every action in
Python lists and re-times each move, so it stops at a few hundred actions. This one works on
orders of 5,000 to 50,000 actions and more, through the evaluation core with answers from the
tails (:class:`~large_search.core.TailsCompiled`, ``core.py`` beside this file): it keeps
each step's end and *tail* (the longest path from it to the end of the step,
``critical.py``), answers a move of one stretch of one rank from them without
re-timing anything, takes a refused move back at no cost, and re-times a kept one only
where ends and tails change (forwards from the moved stretch, backwards into what it waits
for, each stopping where a value stays the same).

Only a move that touches every longest path can shorten the step, so the search tries
moves of *critical* actions (those on a longest path: end + tail = step time): each is
taken out of its rank's order and put back up to ``window`` places earlier or later,
where its rank allows it (never past an action of its own stage and microbatch: F before
I or B before W). A move is kept when the step gets shorter (by more than the answer's
rounding; the kept move is then re-timed, so the step time is the simulator's to the last
bit) and every rank's activation memory fits its limit with the one tolerance
(:func:`~pipebubble.costs.fits_limit`). With ``sideways`` (the default), a move that
keeps the step time (exactly, once re-timed) is kept too when every action ends earlier in
sum, which lets the search cross flat ground, as ``auto``'s local search does; such a move is
re-timed to be judged, and taken back, when refused, by putting the times it changed back.
A pass tries every critical action of the order it starts from, in an order drawn from a
generator seeded by ``seed``; passes repeat until one keeps nothing (a local optimum of
these moves) or ``tries`` moves have been tried. The budget counts moves, not seconds, so
the result depends only on the input.

What it gains (``python bench/bench_simulate.py large``): from auto's answers on the
Table 8 settings of ``bench/bench_auto.py`` (4,608 to 49,152 actions), 0.03 % to 0.25 %
of the step in 0.9 to 2.4 s; on the Zero Bubble Table 9 rows, nothing. That is why it lives
here, in ``bench/``, and not in ``auto``: the gain is too small to pay for the machinery
(``auto`` searches orders of at most 300 actions, where the tails never engage). A kept move
that shortens the step shortens the longest path: every end after it and every tail before it
move, so re-timing it costs about one kernel run, inherently; moves tried and refused
(most of them) cost almost nothing.

>>> from pipebubble import CostModel, get_schedule
>>> costs = CostModel(f=[1.0, 1.4, 0.9, 1.2], b=2.0, w=1.0, comm=0.2)
>>> s = get_schedule("gpipe", ranks=4, microbatches=6)
>>> out = local_search(s, costs)
>>> out.step_time < out.start_time, out.kept > 0
(True, True)
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipebubble.costs import CostModel, StageCosts
from pipebubble.ir.schedule import Schedule, ScheduleError, step_actions

from .core import TailsCompiled
from .critical import tolerance

WINDOW = 4  # places an action may move, each way (the core answers up to 15)
TRIES = 200_000  # moves tried, at most (the deterministic budget)


@dataclass
class Searched:
    """What :func:`local_search` found: the order, its step time and the start's, moves
    tried and kept, passes, wall-clock seconds, and the core's counts (``lazy``: moves
    answered from the tails; ``re-timed``: re-times)."""

    schedule: Schedule
    step_time: float
    start_time: float
    tried: int
    kept: int
    passes: int
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    kept_seconds: list[float] = field(default_factory=list)  # each kept move: its re-time
    # and the tails brought up to date for the next try
    sideways: int = 0  # moves kept on flat ground (the same step, ends earlier in sum)


def local_search(schedule: Schedule, costs: CostModel | StageCosts | None = None,
                 memory_limit: float | Sequence[float] | None = None, *,
                 window: int = WINDOW, tries: int = TRIES, seed: int = 0,
                 sideways: bool = True) -> Searched:
    """Shorten ``schedule``'s step by moves of critical actions (the module docstring),
    within ``memory_limit`` (one value for every rank, or one per rank; None: none).
    The result is never slower than the start; it is the start itself when the start
    does not fit the limit or deadlocks."""
    if not 1 <= window <= TailsCompiled.WINDOW - 1:
        raise ValueError(f"window={window}: must be 1..{TailsCompiled.WINDOW - 1}")
    if tries < 0:
        raise ValueError(f"tries={tries}: must be >= 0")
    t0 = time.perf_counter()
    core = TailsCompiled(schedule, costs)
    start = step = core.step_time
    tried = kept = passes = 0
    kept_seconds: list[float] = []
    level = 0  # moves kept on flat ground
    flat = core.ends_sum() if sideways else 0.0
    if step == float("inf") or not core.fits(memory_limit):
        return Searched(schedule, step, start, 0, 0, 0, time.perf_counter() - t0,
                        dict(core.counts))
    keys = [tuple((a.stage, a.microbatch) for a in step_actions(st)) for st in core.steps]
    rng = random.Random(seed)
    shifts = [d for k in range(1, window + 1) for d in (-k, k)]
    more = True
    while more and tried < tries:
        more = False
        passes += 1
        try:
            crit = core.critical()
        except ScheduleError:  # Overlap pairs: no tails to aim with
            break
        rng.shuffle(crit)
        for r, k in crit:
            if tried >= tries:
                break
            order = core.orders[r]
            own = set(keys[order[k]])
            for d in shifts:
                to = k + d
                if not 0 <= to < len(order):
                    continue
                lo, hi = (to, k) if to < k else (k + 1, to + 1)
                if any(own.intersection(keys[i]) for i in order[lo:hi]):
                    continue  # past its own F, I or W: the rank may not
                tried += 1
                t1 = time.perf_counter()
                got = core.move(r, k, to)
                # Decided on the exact step (re-timed) against a band of rounding about the
                # current one, so the same with or without answers from the tails (an
                # answer is within core.rounding of the exact step).
                slack, band = core.rounding, 2 * tolerance(len(core.steps), step)
                if (got < step - band + slack or sideways and got <= step + slack) \
                        and core.fits(memory_limit):
                    exact = core.settle()
                    if exact < step - band:
                        step = exact
                        core.refresh_tails()  # (what the next try would do first: timed)
                        kept_seconds.append(time.perf_counter() - t1)
                        kept += 1
                        more = True
                        break
                    if sideways and exact <= step:  # (never slower, not by a bit)
                        total = core.ends_sum()  # (flat ground: every action earlier in sum)
                        if total < flat - 1e-9 * abs(flat):
                            step, flat = exact, total
                            level += 1
                            more = True
                            break
                core.move(r, to, k)  # taken back
                if core.step_time != step:  # (it was settled: re-timed back exactly)
                    step = core.settle()
    return Searched(core.schedule(schedule.name), step, start, tried, kept, passes,
                    time.perf_counter() - t0, dict(core.counts), kept_seconds, level)
