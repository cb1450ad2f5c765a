"""simulate(schedule, costs) -> Timeline: the fast kernel.

It computes exactly what ``sim/reference.py`` computes (read that first: the simulator as
DESIGN.md states it, in a page of plain Python), on a million actions in well under a
second of CPython. A hypothesis test keeps the two equal on random schedules, Overlap pairs
and several chains included.

How it stays fast:

1. **Compile once, validate on the way.** ``ir/check.py`` lays every action out in flat
   arrays and checks :func:`~pipebubble.ir.schedule.validate`'s rules on them at once (one
   pass; a failure gets validate's own message). From the same arrays numpy compiles a
   :class:`Program`: one *step* per action, rank after rank, as three flat lists.
   ``producer[i]`` is the step whose end step ``i`` waits for: the neighbouring stage's
   signal in the rule of ``ir/deps.py`` (:func:`~pipebubble.ir.deps.needs`; the same-stage
   one, B or I after its F, W after its I, is met by the rank's own order, which
   validation guarantees). ``lag[i]`` is ``costs.comm`` when that edge crosses ranks, and
   ``duration[i]`` the step's time. Before each rank's steps sits a *boundary* step that
   ends at 0 (the clock before the rank's first step; step 0 doubles as "no dependency")
   and waits for ``never``, a step that never ends, so a rank that runs past its last step
   stops there.
2. **A tight loop per step.** ``start = max(end[i - 1], end[producer[i]] + lag[i])`` and
   ``end[i] = start + duration[i]``: a rank's clock is the end of its previous step, so a
   rank has no state besides its next step. "Not ready yet" is one comparison with ``inf``.
   Where every dependency has the same lag (each stage's neighbours on other ranks: 1F1B,
   GPipe, interleaved 1F1B, DualPipe; or no comm), :func:`simulate` runs a copy of the
   loop that adds that lag as a constant (:func:`_run_uniform`: one array read fewer per
   step, about 15% on 1F1B); "no dependency" is then a spare step that ends at -inf, so
   adding the lag to it changes nothing.
3. **Park, do not poll.** A step whose producer has not ended *parks* on it
   (``waiter[producer] = i``); when the producer ends it pushes its waiter back on the
   stack, and the waiter's rank goes on from there. A lone action's output has at most one
   step of another stage waiting for it (F(s) -> F(s+1), I/B(s) -> I/B(s-1)), so one int
   per step is enough (a pair's end carries two outputs and may have two waiters: see
   below; ``never`` collects one per finished rank and is never woken). No blocked rank is
   visited in vain and nothing is re-queued: the cost is linear in actions *and* in ranks
   (p = 16000 with one microbatch costs 4x p = 4000, not 16x), and a rank switch, which
   lock-step schedules such as 1F1B make every two actions, costs little more than an
   action. The order in which ready steps
   run changes nothing: the result is the longest path through the DAG of rank orders
   and dependencies.

4. **No loop where a scan will do.** On a large program (:func:`~.scan.worth_trying`)
   :func:`simulate`
   first asks ``sim/scan.py`` for the ends: each rank's as one numpy max-plus scan, the ranks
   swept until nothing changes (:func:`_scanned`). It answers only where its additions are
   exact (then in any order the same doubles as the loop's) and it settles in a few sweeps
   (no comm: 1F1B, DualPipe, DualPipeV, ...); otherwise, and on a deadlock, the loop runs.

5. **Not twice.** :func:`simulate` keeps the start and end columns of its last large
   simulations (:class:`_Kept`): the same actions under the same costs (a planner asks for
   one order more than once) give the Timeline around copies of them, the same doubles.
   With a comm lag and off-grid costs (every planner simulation) the scan cannot answer
   (no order of the additions but the loop's gives its doubles), so this is what spares
   the loop there.

When the stack is empty and a rank has not finished, nothing can advance: a deadlock. The
error names the action each unfinished rank is stuck at and what it waits for
(:func:`~pipebubble.ir.deps.describe_wait`). The simulator never hangs.

An Overlap (DualPipe's F&B pair) is one block: it starts when both parts may start, runs
the forward and backward parts back to back (:meth:`~pipebubble.costs.StageCosts.pair_parts`:
the pair takes ``overlap x max(compute, all-to-all)``, shared between its parts in
proportion; without all-to-all each part is ``overlap x`` its time), and all its outputs
are ready when it ends (real DualPipe runs the two parts at once on overlapped streams, so
the forward output does not exist before the block ends). Two programs say this:

- :class:`Program` (:func:`compile_program`, what ``sim/program.py`` re-times) gives a pair
  three steps: a *wait* of no duration for its backward part's gradient, then the forward
  and backward parts; whoever needs the pair's forward output waits for the backward part's
  step. A pair's end may then have two waiters: ``waiter`` reads -1 and they wait in a small
  dict (a second copy of the loop, :func:`_run_pairs`, for programs with pairs only).
- :class:`Blocks` (:func:`compile_blocks`, what :func:`simulate` runs when a schedule has
  pairs and at least :data:`BLOCKS_FROM` actions) gives every block, lone action or pair,
  one step with two producers and two durations: ``start = max(end[i - 1],
  end[producer[i]] + lag[i], end[producer2[i]] + lag2[i])`` and ``end[i] = (start +
  duration[i]) + duration2[i]`` (a lone action: step 0, which ends at 0, and 0.0). That is
  a third of the steps, no wait step to park on, and two waiter slots per step instead of
  the dict, so a schedule of pairs (DualPipe, DualPipeV) runs faster per action than one of
  lone actions. The additions are the three steps' own, in the same order, so both
  programs give the same doubles (a test keeps them equal); on a deadlock,
  :func:`simulate` runs the three steps to name the stuck actions.

Around the loop, numpy writes every column in place into the C arrays the loop and the
Timeline read (:func:`_filled`: a numpy view of a C array), so no column is copied.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from ..costs import CostModel, StageCosts
from ..ir.check import B, F, FlatActions, I, flat_actions
from ..ir.deps import Layout, describe_wait, needs, produces
from ..ir.schedule import KINDS, Action, Schedule, ScheduleError
from ..timeline import Timeline

if TYPE_CHECKING:
    import numpy as np

_INF = float("inf")


class Deadlock(ScheduleError):
    """No rank can advance. ``stuck`` maps rank -> (stuck action, what it waits for)."""

    def __init__(self, stuck: dict[int, tuple[str, str]]):
        self.stuck = stuck
        detail = "; ".join(f"rank {r} stuck at {a} waiting for {w}" for r, (a, w) in stuck.items())
        super().__init__(f"deadlock: {detail}")


def simulate(schedule: Schedule, costs: CostModel | StageCosts | None = None) -> Timeline:
    """Time every action of ``schedule`` under ``costs`` and return the Timeline.

    Raises ScheduleError for an invalid schedule (the message :func:`validate` gives) and
    :class:`Deadlock` when ranks wait for each other.

    >>> from pipebubble.schedules import get_schedule
    >>> simulate(get_schedule("1f1b", ranks=4, microbatches=8)).step_time  # (8+4-1)*(1+2)
    33.0
    """
    if costs is None:
        costs = CostModel()
    sc = costs if isinstance(costs, StageCosts) else costs.resolve(
        schedule.num_stages, schedule.chunks
    )
    if len(sc.f) != schedule.num_stages:
        raise ScheduleError(
            f"costs are for {len(sc.f)} stages but the schedule has {schedule.num_stages}"
        )
    flat = flat_actions(schedule)
    key = KEPT.key(schedule, flat, sc)
    if key is not None:
        got = KEPT.get(key, flat)
        if got is not None:  # these actions under these costs, simulated before
            return _columns(schedule, flat, sc, *got)
    timeline = _simulated(schedule, flat, sc)
    if key is not None:
        KEPT.put(key, flat, timeline.start, timeline.end)
    return timeline


def _simulated(schedule: Schedule, flat: FlatActions, sc: StageCosts) -> Timeline:
    """:func:`simulate` of the checked ``flat`` actions under ``sc``: compiled and run."""
    pairs = bool(flat.pair.any())
    rule = _rule(Layout(schedule.num_stages, tuple(schedule.stage_to_rank),
                        tuple(schedule.chain_starts)))
    lag = rule.uniform(sc.comm)
    if pairs and len(flat.stage) >= BLOCKS_FROM:  # Overlap pairs, many actions
        timeline = _simulate_blocks(schedule, flat, sc, lag)
        if timeline is not None:
            return timeline
        # a deadlock: the three-step program below names each rank's stuck action
    if lag is not None and not pairs:  # one lag for every dependency: a lighter loop
        # (no lag column: the one lag is added as a constant; the ends written in place)
        program = _compile_program(schedule, flat, sc, spare=True)
        end = _scanned(program.initial_end, [program.producer], [lag], [program.duration],
                       program, in_place=True)
        if end is None:
            end = _run_uniform(program, lag, in_place=True)
    else:
        # (the columns as memoryviews of numpy arrays, step numbers 32-bit: the loop reads
        # them about 12 % faster than C arrays on GPT-1T's V-Min, p=64 m=2048)
        program = _compile_program(schedule, flat, sc, spare=False, views=True)
        end = None
        if not program.num_pairs:  # (a pair's wait step takes no time: see sim/scan.py)
            end = _scanned(program.initial_end, [program.producer], [program.lag],
                           [program.duration], program)
        if end is None:
            end = run(program)
        lag = None
    stuck = [r for r, last in enumerate(program.last) if end[last] == _INF]
    if stuck:
        raise _deadlock(schedule, flat, program, end, stuck)
    return _timeline(schedule, flat, sc, program, end, lag)


class _Kept:
    """The start and end columns of the last few large simulations, by what decides them:
    the actions (flat, in rank order), the placement and chains, and the costs. A planner
    simulates one order several times under one set of costs (a family's schedule and
    auto's answer that is that same order, a cut scored twice); a repeat is then the
    Timeline's columns around copies of the kept times, the same doubles, without the
    loop. Kept from :data:`KEEP_FROM` actions (below that a simulation costs little more
    than the look-up), :data:`KEEP_ACTIONS` actions in all, the oldest dropped first.

    A key holds what is cheap to compare (sizes, placement, chains, each rank's count of
    actions and the costs, every float by its sign too: ``-0.0`` is not ``0.0`` here); a
    hit also needs every action column equal to the kept one's (the kept arrays are the
    checked flat actions, which nothing writes: a schedule's orders are immutable).
    ``cache_clear`` forgets them all (``bench/bench_plan.py``'s cold start calls it),
    ``cache_info`` counts hits and misses."""

    def __init__(self) -> None:
        self._kept: dict[tuple, list[tuple[FlatActions, np.ndarray, np.ndarray]]] = {}
        self._actions = 0
        self.hits = self.misses = 0
        # (on the instance, not the class: a cold start clears what has them, and the
        # class's unbound methods would not do)
        self.cache_clear, self.cache_info = self.clear, self.info

    def key(self, schedule: Schedule, flat: FlatActions, sc: StageCosts) -> tuple | None:
        """The look-up key of this simulation, or None below :data:`KEEP_FROM` actions."""
        if len(flat.stage) < KEEP_FROM:
            return None
        return (schedule.num_stages, schedule.num_microbatches, schedule.num_ranks,
                tuple(schedule.stage_to_rank), tuple(schedule.chain_starts),
                tuple(flat.offsets), _signed(sc.key()))

    def get(self, key: tuple, flat: FlatActions) -> tuple[memoryview, memoryview] | None:
        """Copies of the kept start and end columns (writable memoryviews of numpy arrays,
        as the kernel makes them) of these actions under this key, or None."""
        import numpy as np

        for kept, start, end in self._kept.get(key, ()):
            if all(a is b or np.array_equal(a, b) for a, b in zip(
                    (flat.stage, flat.kind, flat.microbatch, flat.pair),
                    (kept.stage, kept.kind, kept.microbatch, kept.pair), strict=True)):
                self.hits += 1
                self._kept[key] = self._kept.pop(key)  # (the most recent last)
                return memoryview(start.copy()), memoryview(end.copy())
        self.misses += 1
        return None

    def put(self, key: tuple, flat: FlatActions, start: Sequence[float],
            end: Sequence[float]) -> None:
        """Keep copies of a simulation's start and end columns under ``key``."""
        import numpy as np

        n = len(flat.stage)
        if n > KEEP_ACTIONS:
            return
        entries = self._kept.pop(key, [])
        entries.append((flat, np.array(start, dtype=np.float64),
                        np.array(end, dtype=np.float64)))
        self._kept[key] = entries
        self._actions += n
        while self._actions > KEEP_ACTIONS:
            oldest = next(iter(self._kept))
            dropped = self._kept[oldest].pop(0)
            self._actions -= len(dropped[0].stage)
            if not self._kept[oldest]:
                del self._kept[oldest]

    def clear(self) -> None:
        """Forget every kept simulation."""
        self._kept.clear()
        self._actions = 0
        self.hits = self.misses = 0

    def info(self) -> dict[str, int]:
        """Hits, misses and the actions kept."""
        return {"hits": self.hits, "misses": self.misses, "actions": self._actions}


def _signed(value: object) -> object:
    """``value`` (a costs key: numbers, bools, None and tuples of them) with every float
    replaced by its 8 bytes, so that keys are equal exactly when the doubles are (``-0.0``
    and ``0.0`` differ, a NaN equals itself: the same bits give the same result)."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, tuple):
        return tuple(_signed(v) for v in value)
    return value


KEEP_FROM = 4096
"""Actions from which :func:`simulate` keeps its result (:class:`_Kept`)."""

KEEP_ACTIONS = 1 << 22
"""Actions kept in all (about 64 MiB of times, 4 M actions: five GPT-1T schedules of p = 64
and m = 2,048)."""

KEPT = _Kept()
"""The kept simulations (:class:`_Kept`)."""


BLOCKS_FROM = 256
"""Actions from which :func:`simulate` runs a schedule with Overlap pairs as
:class:`Blocks` (one step per pair): faster from about 200 actions on (DualPipe p=16
m=32768: 1.4x), a few numpy calls more below that (about 10 us). Both give the same
doubles."""


def _simulate_blocks(schedule: Schedule, flat: FlatActions, sc: StageCosts,
                     lag: float | None = None) -> Timeline | None:
    """:func:`simulate` by the :class:`Blocks` program; None on a deadlock. ``lag``: the
    one lag of every dependency (:meth:`_Rule.uniform`), or None to read each step's."""
    blocks = compile_blocks(schedule, flat, sc, spare=lag is not None, views=True)
    lags = [lag, lag] if lag is not None else [blocks.lag, blocks.lag2]
    end = _scanned(blocks.initial_end, [blocks.producer, blocks.producer2], lags,
                   [blocks.duration, blocks.duration2], blocks, in_place=lag is not None)
    if end is None:
        end = (_run_blocks(blocks) if lag is None else
               _run_blocks_uniform(blocks, lag, in_place=True))
    if any(end[last] == _INF for last in blocks.last):
        return None
    return _block_timeline(schedule, flat, sc, blocks, end, lag)


def _scanned(initial: array | memoryview, producers: list, lags: list, durations: list,
             program: Program | Blocks, in_place: bool = False) -> array | memoryview | None:
    """The ends the loop would give, by ``sim/scan.py``'s whole-rank scans (the same
    doubles), or None where it declines (it takes large programs, :func:`~.scan.worth_trying`;
    exact arithmetic; settling in a few sweeps): then the loop runs. The columns
    as the program holds them (C arrays or memoryviews; a lag: one number or a column);
    ``in_place``: the ends written over ``initial`` (else into a copy)."""
    import numpy as np

    from .scan import solve, worth_trying

    if not worth_trying(len(initial), len(program.first)):
        return None
    ends = np.frombuffer(initial, dtype=np.float64)
    if not in_place:
        ends = ends.copy()
    if not solve([_ints(x) for x in producers],
                 [x if isinstance(x, float) else np.frombuffer(x, dtype=np.float64)
                  for x in lags],
                 [np.frombuffer(x, dtype=np.float64) for x in durations],
                 program.first, program.last, ends):
        return None  # (solve left the ranks' steps at inf, as the loop expects them)
    return initial if in_place else memoryview(ends)


class Program(NamedTuple):
    """What the clock runs. Step ``i`` starts at ``max(end[i - 1], end[producer[i]] +
    lag[i])`` and takes ``duration[i]``. Rank r's steps are ``first[r]`` .. ``last[r]``
    (``last[r] = first[r] - 1`` for a rank without actions); ``step[a]`` is the step of
    action ``a`` (flat order of ``ir/check.py``); ``initial_end`` is ``end`` before the
    clock runs (0 for the boundary steps, ``inf`` for the others). The per-step columns
    are C arrays: built from numpy without a Python object per step, and numpy reads them
    back without a copy."""

    producer: array  # of int64 (simulate's: a memoryview, int32: _filled)
    lag: array  # of doubles
    duration: array
    initial_end: array
    first: list[int]
    last: list[int]
    step: np.ndarray
    num_pairs: int = 0  # Overlap pairs (each adds a wait step)


def compile_program(schedule: Schedule, flat: FlatActions, sc: StageCosts) -> Program:
    """The :class:`Program` of ``schedule`` under ``sc``, from the dependency rule of
    ``ir/deps.py`` (applied once per (stage, kind)) and numpy gathers (once per action)."""
    return _compile_program(schedule, flat, sc, spare=False)


def _compile_program(schedule: Schedule, flat: FlatActions, sc: StageCosts,
                     spare: bool, views: bool | None = None) -> Program:
    """:func:`compile_program`; with ``spare``, one more step after ``never`` that ends at
    -inf, which an action without a neighbour dependency waits for instead of step 0 (so
    that adding any lag to its end changes nothing: :func:`_run_uniform`) and the columns
    as memoryviews of numpy arrays (:func:`_filled`: what :func:`simulate` runs)."""
    import numpy as np

    S, M, p = schedule.num_stages, schedule.num_microbatches, schedule.num_ranks
    n = len(flat.stage)
    rule = _rule(Layout(S, tuple(schedule.stage_to_rank), tuple(schedule.chain_starts)))
    row = flat.stage * 4 + flat.kind  # (stage, kind) of each action
    kind, mb = flat.kind, flat.microbatch

    # Step numbers: one boundary step before each rank's steps, and a wait step before
    # each pair's forward part.
    fwd_part = flat.pair == 1
    if fwd_part.any():
        pairs = np.cumsum(fwd_part)  # pairs begun so far, this action's included
        step = np.arange(n) + flat.rank + 1 + pairs
        num_pairs = int(pairs[-1])
    else:  # (no cumsum of zeros)
        step = np.arange(1, n + 1) + flat.rank
        num_pairs, pairs = 0, np.zeros(n, dtype=np.int64)
    size = n + p + num_pairs + 2  # + the boundary after the last rank, + never
    never = size - 1
    starts = np.asarray(flat.offsets[:-1])
    boundary = starts + np.arange(p) + np.concatenate(([0], pairs))[starts]

    # Each signal of ir/deps.py has a slot, (signal x S + stage) x M + microbatch with
    # signal 0 the forward output, 1 the input gradient (made by I or B), 2 W done; ready
    # holds the step at whose end it is ready (a pair's forward output: at the pair's end,
    # the end of its backward part, the next step). The M slots after them read step 0: no
    # dependency.
    ready = np.zeros(3 * S * M + M, dtype=_step_dtype(size + 1))
    if spare:
        ready[3 * S * M:] = size  # the spare step
    ready[_slots(S, M)[row] + mb] = step + fwd_part if num_pairs else step
    # The columns are written in place in C arrays (numpy views of them; no copy).
    if views is None:
        views = spare
    c_producer, producer = _filled("q", size + spare, never, views=views)
    # simulate's program (spare) adds its one lag as a constant: no column (unless pairs)
    c_lag, lag = _filled("d", 0 if spare and not num_pairs else size + spare, 0.0,
                         views=views)
    c_duration, duration = _filled("d", size + spare, 0.0, views=views)
    producer[step] = ready[(np.array(rule.needs) * M)[row] + mb]
    if len(lag):
        lag[step] = np.array([sc.comm if c else 0.0 for c in rule.crosses])[row]
    duration[step] = np.array([sc.duration(s, k) for s in range(S) for k in KINDS])[row]
    if num_pairs:
        fwd = np.flatnonzero(fwd_part)
        bwd = fwd + 1
        if (kind[fwd] != F).any() or ((kind[bwd] != I) & (kind[bwd] != B)).any():
            raise ScheduleError("an Overlap pairs a forward with a backward (F then B or I)")
        duration[step[fwd]], duration[step[bwd]] = _pair_durations(sc, flat, fwd)
        wait, bwd_step = step[fwd] - 1, step[bwd]
        producer[wait], lag[wait] = producer[bwd_step], lag[bwd_step]
        producer[bwd_step], lag[bwd_step] = size if spare else 0, 0.0  # met by the wait
    c_initial, initial = _filled("d", size + spare, _INF, views=views)
    initial[boundary] = 0.0
    initial[size - 2] = 0.0  # the boundary after the last rank
    if spare:
        initial[size] = -_INF
    del producer, lag, duration, initial  # the views (an exported buffer pins its array)
    first = boundary + 1
    last = np.append(boundary[1:], size - 2) - 1
    return Program(c_producer, c_lag, c_duration, c_initial, first.tolist(), last.tolist(),
                   step, num_pairs)


class Blocks(NamedTuple):
    """A program with one step per *block* (a lone action, or an Overlap pair), for
    :func:`simulate` on schedules with pairs: a third of the steps of the
    :class:`Program`'s wait + forward + backward, and no parking on a wait step. Step ``i``
    starts at ``max(end[i - 1], end[producer[i]] + lag[i], end[producer2[i]] + lag2[i])``
    and ends at ``(start + duration[i]) + duration2[i]``: for a pair, its forward part's
    producer and duration, then its backward part's (so the forward part ends at ``start
    + duration[i]``, in the same doubles as the three steps give); for a lone action,
    ``producer2`` is step 0, which ends at 0, and ``duration2`` is 0.0 (adding it changes
    no double). ``step[a]`` is the block of action ``a``; the rest as in
    :class:`Program`."""

    producer: array  # of int64 (simulate's: a memoryview, int32: _filled)
    lag: array  # of doubles
    producer2: array
    lag2: array
    duration: array
    duration2: array
    initial_end: array
    first: list[int]
    last: list[int]
    step: np.ndarray
    forward: np.ndarray  # the actions (flat order) that are a pair's forward part


def compile_blocks(schedule: Schedule, flat: FlatActions, sc: StageCosts,
                   spare: bool = False, views: bool = False) -> Blocks:
    """The :class:`Blocks` of ``schedule`` under ``sc``: :func:`compile_program`'s
    gathers with a pair's two parts on one step. ``spare``: as :func:`_compile_program`'s
    (a lone action's second producer is then the spare step too). ``views``: the columns
    are memoryviews of numpy arrays instead of C arrays (see :func:`_filled`)."""
    import numpy as np

    S, M, p = schedule.num_stages, schedule.num_microbatches, schedule.num_ranks
    n = len(flat.stage)
    rule = _rule(Layout(S, tuple(schedule.stage_to_rank), tuple(schedule.chain_starts)))
    row = flat.stage * 4 + flat.kind
    kind, mb = flat.kind, flat.microbatch
    fwd = np.flatnonzero(flat.pair == 1)
    bwd = fwd + 1
    back_kind = kind[bwd] if len(fwd) and bwd[-1] < n else None
    if len(fwd) and (back_kind is None or (flat.pair[bwd] != 2).any()
                     or (kind[fwd] != F).any() or ((back_kind != I) & (back_kind != B)).any()):
        raise ScheduleError("an Overlap pairs a forward with a backward (F then B or I)")
    # Step numbers: one boundary step before each rank's steps; a pair's backward part
    # shares its forward part's step.
    back = np.zeros(n, dtype=np.int64)
    back[bwd] = 1
    np.cumsum(back, out=back)  # backward parts so far, this action's included
    step = np.arange(n) + flat.rank + 1 - back
    num_pairs = len(fwd)
    size = n - num_pairs + p + 2  # + the boundary after the last rank, + never
    never = size - 1
    starts = np.asarray(flat.offsets[:-1])
    boundary = starts + np.arange(p) - np.concatenate(([0], back))[starts]
    # Signal slots as in compile_program; every output is ready at its block's end.
    ready = np.zeros(3 * S * M + M, dtype=_step_dtype(size + 1))
    if spare:
        ready[3 * S * M:] = size  # the spare step
    ready[_slots(S, M)[row] + mb] = step
    needs = np.array(rule.needs) * M
    size += spare
    comm = np.array([sc.comm if c else 0.0 for c in rule.crosses])
    cost = np.array([sc.duration(s, k) for s in range(S) for k in KINDS])
    # The columns are written in place in C arrays (no copy): first the block's first
    # action (a lone action or a pair's forward part), then a pair's backward part.
    one = np.flatnonzero(flat.pair != 2)
    at, row_one = step[one], row[one]
    producer, v_producer = _filled("q", size, never, views=views)
    lags = not (spare and views)  # simulate's uniform run adds its one lag as a constant
    lag, v_lag = _filled("d", size if lags else 0, 0.0, views=views)
    duration, v_duration = _filled("d", size, 0.0, views=views)
    v_producer[at] = ready[needs[row_one] + mb[one]]
    if lags:
        v_lag[at] = comm[row_one]
    v_duration[at] = cost[row_one]
    producer2, v_producer2 = _filled("q", size, size - 1 if spare else 0, views=views)
    lag2, v_lag2 = _filled("d", size if lags else 0, 0.0, views=views)
    duration2, v_duration2 = _filled("d", size, 0.0, views=views)
    at, row_bwd = step[bwd], row[bwd]
    v_duration[at], v_duration2[at] = _pair_durations(sc, flat, fwd)  # (the same step)
    v_producer2[at] = ready[needs[row_bwd] + mb[bwd]]
    if lags:
        v_lag2[at] = comm[row_bwd]
    initial, v_initial = _filled("d", size, _INF, views=views)
    v_initial[boundary] = 0.0
    v_initial[size - 2 - spare] = 0.0
    if spare:
        v_initial[size - 1] = -_INF
    del v_producer, v_lag, v_duration, v_producer2, v_lag2, v_duration2, v_initial
    first = boundary + 1
    last = np.append(boundary[1:], size - 2 - spare) - 1
    return Blocks(producer, lag, producer2, lag2, duration, duration2, initial,
                  first.tolist(), last.tolist(), step, fwd)


def _run_blocks(blocks: Blocks) -> array:
    """:func:`run` for :class:`Blocks`. A block waits for two producers at most, and a
    block's end for two waiters at most (one per output: F(s) -> F(s+1), I/B(s) ->
    I/B(s-1)), so two ints per step hold them (``never``, which collects one per finished
    rank, is never woken: overwriting its waiters loses nothing)."""
    producer, lag, duration = blocks.producer, blocks.lag, blocks.duration
    producer2, lag2, duration2 = blocks.producer2, blocks.lag2, blocks.duration2
    end, waiter = _clock(blocks.initial_end)  # waiter[j], waiter2[j]: the steps parked on j
    waiter2 = _clock(blocks.initial_end, ends=False)[1]  # (0: none)
    inf = _INF
    stack = blocks.first[:]
    pop, push = stack.pop, stack.append
    while stack:
        i = pop()
        t = end[i - 1]
        while True:
            x = end[producer[i]] + lag[i]
            if x > t:
                if x == inf:
                    j = producer[i]
                    if waiter[j]:
                        waiter2[j] = i
                    else:
                        waiter[j] = i
                    break
                t = x
            x = end[producer2[i]] + lag2[i]
            if x > t:
                if x == inf:
                    j = producer2[i]
                    if waiter[j]:
                        waiter2[j] = i
                    else:
                        waiter[j] = i
                    break
                t = x
            t += duration[i]
            t += duration2[i]
            end[i] = t
            woken = waiter[i]
            if woken:
                push(woken)
                waiter[i] = 0  # (frees the parked step's number)
                woken = waiter2[i]
                if woken:
                    push(woken)
                    waiter2[i] = 0
            i += 1
    return end


def _run_blocks_uniform(blocks: Blocks, lag: float, in_place: bool = False) -> array:
    """:func:`_run_blocks` when every dependency has the same ``lag`` (DualPipe), for
    blocks compiled with a spare step (see :func:`_run_uniform`)."""
    producer, duration = blocks.producer, blocks.duration
    producer2, duration2 = blocks.producer2, blocks.duration2
    end, waiter = _clock(blocks.initial_end, in_place=in_place)
    waiter2 = _clock(blocks.initial_end, ends=False)[1]
    inf = _INF
    stack = blocks.first[:]
    pop, push = stack.pop, stack.append
    while stack:
        i = pop()
        t = end[i - 1]
        while True:
            x = end[producer[i]] + lag
            if x > t:
                if x == inf:
                    j = producer[i]
                    if waiter[j]:
                        waiter2[j] = i
                    else:
                        waiter[j] = i
                    break
                t = x
            x = end[producer2[i]] + lag
            if x > t:
                if x == inf:
                    j = producer2[i]
                    if waiter[j]:
                        waiter2[j] = i
                    else:
                        waiter[j] = i
                    break
                t = x
            t += duration[i]
            t += duration2[i]
            end[i] = t
            woken = waiter[i]
            if woken:
                push(woken)
                waiter[i] = 0  # (frees the parked step's number)
                woken = waiter2[i]
                if woken:
                    push(woken)
                    waiter2[i] = 0
            i += 1
    return end


def _pair_durations(sc: StageCosts, flat: FlatActions, fwd: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The recorded durations of each pair's forward and backward part (``fwd``: the
    pairs' forward parts, flat order): :meth:`StageCosts.pair_parts`, the same doubles
    (without all-to-all each part's time x ``overlap``, gathered without a sort)."""
    if not sc.has_a2a:
        import numpy as np

        S = len(sc.f)
        cost = np.array([sc.duration(s, k) for s in range(S) for k in KINDS])
        row = flat.stage * 4 + flat.kind
        return cost[row[fwd]] * sc.overlap, cost[row[fwd + 1]] * sc.overlap
    parts = _pair_parts(sc, flat, fwd)
    return parts[0], parts[1]


def _pair_parts(sc: StageCosts, flat: FlatActions, fwd: np.ndarray) -> np.ndarray:
    """:meth:`StageCosts.pair_parts` of every pair, as 6 rows (forward part's duration,
    backward part's duration, forward's hidden and exposed all-to-all, backward's): one
    call per distinct (forward stage, backward stage, backward kind), gathered."""
    import numpy as np

    S = len(sc.f)
    bwd = fwd + 1
    key = (flat.stage[fwd].astype(np.int64) * S + flat.stage[bwd]) * 4 + flat.kind[bwd]
    uniq, inverse = np.unique(key, return_inverse=True)
    table = np.empty((6, len(uniq)))
    for j, k in enumerate(uniq.tolist()):
        f_part, b_part = sc.pair_parts(k // 4 // S, k // 4 % S, KINDS[k % 4])
        table[:, j] = (f_part.duration, b_part.duration, f_part.hidden, f_part.exposed,
                       b_part.hidden, b_part.exposed)
    return table[:, inverse.ravel()]


class _Rule(NamedTuple):
    """The rule of ``ir/deps.py`` per (stage, kind), at row stage x 4 + kind code: the
    neighbour stage's signal the action needs, as ``signal x S + stage`` (see
    :func:`compile_program`; ``3 x S``: none), and whether it crosses ranks."""

    needs: list[int]
    crosses: list[bool]

    def uniform(self, comm: float) -> float | None:
        """The one lag every neighbour dependency has (``comm`` when all cross ranks, 0.0
        when none does or ``comm`` is 0), or None when they differ (a V placement's turn:
        two stages of one rank)."""
        none = 3 * len(self.needs) // 4
        kinds = {c for n, c in zip(self.needs, self.crosses, strict=True) if n != none}
        if comm == 0.0 or kinds == {False} or not kinds:
            return 0.0
        return comm if kinds == {True} else None


_SIGNAL = {"F": 0, "I": 1, "W": 2}  # the signal kinds of ir/deps.py, numbered for slots


def _slots(S: int, M: int) -> np.ndarray:
    """Per (stage, kind) row, the first of the M signal slots its actions fill
    (:func:`compile_program`): ``(signal x S + stage) x M`` with ``signal`` the kind of
    output the action produces (``ir/deps.py``'s :func:`~pipebubble.ir.deps.produces`)."""
    import numpy as np

    made = [_SIGNAL[produces(Action(0, k, 0)).kind] for k in KINDS]
    return np.array([(made[k] * S + s) * M for s in range(S) for k in range(len(KINDS))],
                    dtype=np.int64)


@lru_cache(maxsize=64)
def _rule(topo: Layout) -> _Rule:
    S, where = topo.num_stages, topo.stage_to_rank
    rule = _Rule([], [])
    for s in range(S):
        for kind in KINDS:
            neighbour = [sig for sig in needs(Action(s, kind, 0), topo) if sig.stage != s]
            sig = neighbour[0] if neighbour else None  # one at most (see the module doc)
            rule.needs.append(3 * S if sig is None else _SIGNAL[sig.kind] * S + sig.stage)
            rule.crosses.append(sig is not None and where[sig.stage] != where[s])
    return rule


def run(program: Program) -> array:
    """The clock: run steps from a stack, each rank as far as its producers have ended,
    parking a step on the producer it waits for. Returns the end of every step (``inf``
    where a deadlock stopped a rank)."""
    return (_run_pairs if program.num_pairs else _run)(program)


def _run(program: Program) -> array:
    """:func:`run` without Overlap pairs: at most one step waits for any step."""
    producer, lag, duration = program.producer, program.lag, program.duration
    # C doubles, not float objects: the float each step computes is freed at once and
    # reused, which keeps memory traffic low; numpy reads them without a copy. (A C array,
    # or for a program of memoryviews a memoryview of numpy's: :func:`_clock`.)
    end, waiter = _clock(program.initial_end)  # waiter[j]: the step parked on j (0: none)
    inf = _INF
    stack = program.first[:]
    pop, push = stack.pop, stack.append
    while stack:
        i = pop()
        t = end[i - 1]  # the rank's clock: the end of its previous step
        while True:
            x = end[producer[i]] + lag[i]
            if x > t:
                if x == inf:  # its producer has not ended: park on it
                    waiter[producer[i]] = i  # (on never, several: none is ever woken)
                    break
                t = x
            t += duration[i]
            end[i] = t
            woken = waiter[i]
            if woken:
                push(woken)
                waiter[i] = 0  # (frees the parked step's number)
            i += 1
    return end


def _run_uniform(program: Program, lag: float, in_place: bool = False) -> array:
    """:func:`_run` when every dependency has the same ``lag`` (1F1B, GPipe, interleaved
    1F1B: each stage's neighbours on other ranks), for a program compiled with a spare
    step (:func:`_compile_program`): one array read fewer per step, about 15% on 1F1B.
    The sum is the same double: ``end[producer[i]] + lag``. ``in_place``: the ends are
    written over ``program.initial_end`` (which is returned), not a copy."""
    producer, duration = program.producer, program.duration
    end, waiter = _clock(program.initial_end, in_place=in_place)
    inf = _INF
    stack = program.first[:]
    pop, push = stack.pop, stack.append
    while stack:
        i = pop()
        t = end[i - 1]
        while True:
            x = end[producer[i]] + lag
            if x > t:
                if x == inf:
                    waiter[producer[i]] = i
                    break
                t = x
            t += duration[i]
            end[i] = t
            woken = waiter[i]
            if woken:
                push(woken)
                waiter[i] = 0  # (frees the parked step's number)
            i += 1
    return end


def _run_pairs(program: Program) -> array:
    """:func:`run` with Overlap pairs: a pair's end may have two waiters. The same loop as
    :func:`_run` but for that case (a separate function so that the others do not pay the
    two extra tests, about 4% on 1F1B)."""
    producer, lag, duration = program.producer, program.lag, program.duration
    end, waiter = _clock(program.initial_end)  # waiter[j]: the step parked on j (0: none;
    # -1: several)
    more: dict[int, list[int]] = {}  # the steps parked on j when there are several
    inf = _INF
    stack = program.first[:]
    pop, push = stack.pop, stack.append
    while stack:
        i = pop()
        t = end[i - 1]
        while True:
            x = end[producer[i]] + lag[i]
            if x > t:
                if x == inf:
                    j = producer[i]
                    if waiter[j]:  # a pair's end: its two outputs may each have a waiter
                        more.setdefault(j, [] if waiter[j] < 0 else [waiter[j]]).append(i)
                        waiter[j] = -1
                    else:
                        waiter[j] = i
                    break
                t = x
            t += duration[i]
            end[i] = t
            woken = waiter[i]
            if woken:
                if woken > 0:
                    push(woken)
                else:
                    stack += more.pop(i)
            i += 1
    return end


def _deadlock(schedule: Schedule, flat: FlatActions, program: Program, end: array,
              stuck_ranks: Sequence[int]) -> Deadlock:
    """Name each unfinished rank's stuck action (for a pair's wait step: the pair's forward
    part that follows it) and what it waits for."""
    import numpy as np

    stuck: dict[int, tuple[str, str]] = {}
    for r in stuck_ranks:
        first, last = program.first[r], program.last[r]
        i = first + int(np.argmax(np.isinf(end[first:last + 1])))
        a = int(np.searchsorted(program.step, i))  # the first action at or after step i
        action = Action(int(flat.stage[a]), KINDS[flat.kind[a]], int(flat.microbatch[a]))
        stuck[r] = (str(action), describe_wait(action, schedule))
    return Deadlock(stuck)


def _timeline(schedule: Schedule, flat: FlatActions, sc: StageCosts, program: Program,
              end: array, uniform: float | None = None) -> Timeline:
    """Columns of the Timeline: numpy gathers and C arrays (no Python object per action
    except the kind letters, which are shared). A step's start is the loop's
    ``max(end[i - 1], end[producer[i]] + lag[i])``, vectorised: the same doubles."""
    import numpy as np

    ends = np.frombuffer(end, dtype=np.float64)
    producer = _ints(program.producer)
    step = program.step
    # ``uniform``: the one lag the loop added (a program without a lag column)
    lag = uniform if uniform is not None else np.frombuffer(program.lag,
                                                            dtype=np.float64)[step]
    n = len(step)
    start, v_start = _filled("d", n, 0.0, views=True)
    waits_for = producer[step].astype(np.intp)  # (numpy gathers fastest by intp indices)
    np.maximum(ends[step - 1], ends[waits_for] + lag, out=v_start)
    stop, v_stop = _filled("d", n, 0.0, views=True)
    np.take(ends, step, out=v_stop, mode="wrap")  # (wrap: unbuffered; step is in range)
    del v_start, v_stop
    return _columns(schedule, flat, sc, start, stop)


def _block_timeline(schedule: Schedule, flat: FlatActions, sc: StageCosts, blocks: Blocks,
                    end: array, uniform: float | None = None) -> Timeline:
    """:func:`_timeline` for :class:`Blocks`: each block's start is the loop's maximum,
    vectorised over the steps (the same doubles); a pair's forward part runs from it to
    ``start + duration``, its backward part from there to the block's end."""
    import numpy as np

    ends = np.frombuffer(end, dtype=np.float64)
    producer, producer2 = _ints(blocks.producer), _ints(blocks.producer2)
    duration = np.frombuffer(blocks.duration, dtype=np.float64)
    if uniform is None:
        lag = np.frombuffer(blocks.lag, dtype=np.float64)[1:]
        lag2 = np.frombuffer(blocks.lag2, dtype=np.float64)[1:]
    else:  # the one lag the loop added (blocks without lag columns)
        lag = lag2 = uniform
    begin = np.empty(len(ends))  # begin[i]: when step i starts (boundaries: unused)
    begin[0] = 0.0
    # (numpy gathers fastest by intp indices)
    np.maximum(ends[:-1], ends[producer[1:].astype(np.intp)] + lag, out=begin[1:])
    np.maximum(begin[1:], ends[producer2[1:].astype(np.intp)] + lag2, out=begin[1:])
    step = blocks.step
    n = len(step)
    start, v_start = _filled("d", n, 0.0, views=True)
    np.take(begin, step, out=v_start, mode="wrap")
    stop, v_stop = _filled("d", n, 0.0, views=True)
    np.take(ends, step, out=v_stop, mode="wrap")
    fwd = blocks.forward
    at = step[fwd]
    middle = begin[at] + duration[at]
    v_stop[fwd] = middle
    v_start[fwd + 1] = middle
    del v_start, v_stop
    return _columns(schedule, flat, sc, start, stop)


def _columns(schedule: Schedule, flat: FlatActions, sc: StageCosts, start: memoryview,
             end: memoryview) -> Timeline:
    """The Timeline of ``flat``'s actions with these starts and ends. Its number columns
    are memoryviews of numpy arrays (:func:`_filled`; rank, stage and microbatch: of the
    checked flat arrays themselves, read-only): they index as Python ints and floats, and
    numpy reads them without a copy."""
    import numpy as np

    S, n = schedule.num_stages, len(flat.stage)
    row = flat.stage * 4 + flat.kind
    deltas = [sc.memory_deltas(s, k) for s in range(S) for k in KINDS]
    mem_start, v_mem_start = _filled("d", n, 0.0, views=True)
    np.take(np.array([d[0] for d in deltas]), row, out=v_mem_start, mode="wrap")
    mem_end, v_mem_end = _filled("d", n, 0.0, views=True)
    np.take(np.array([d[1] for d in deltas]), row, out=v_mem_end, mode="wrap")
    del v_mem_start, v_mem_end
    # The kind letters: the codes as bytes, translated, as one str (a byte per action, no
    # list of a million references for the garbage collector to walk).
    letters = flat.kind.astype(np.uint8, copy=False).tobytes().translate(_LETTERS)
    hidden = exposed = None
    if sc.has_a2a:  # each action's all-to-all: hidden in a pair, or exposed
        alone = np.array([sc.lone_part(s, k).exposed for s in range(S) for k in KINDS])
        v_exposed = alone[row] if n else np.zeros(0)
        v_hidden = np.zeros(n)
        fwd = np.flatnonzero(flat.pair == 1)
        if len(fwd):
            parts = _pair_parts(sc, flat, fwd)
            v_hidden[fwd], v_exposed[fwd] = parts[2], parts[3]
            v_hidden[fwd + 1], v_exposed[fwd + 1] = parts[4], parts[5]
        hidden, exposed = _doubles(v_hidden), _doubles(v_exposed)
    return Timeline(
        schedule=schedule.name,
        num_ranks=schedule.num_ranks,
        num_stages=S,
        num_microbatches=schedule.num_microbatches,
        stage_to_rank=tuple(schedule.stage_to_rank),
        chains=schedule.chains,
        chain_starts=schedule.chain_starts,
        rank=_read_only(flat.rank),
        stage=_read_only(flat.stage),
        kind=letters.decode("ascii"),
        microbatch=_read_only(flat.microbatch),
        start=start,
        end=end,
        mem_start=mem_start,
        mem_end=mem_end,
        overlapped=memoryview(flat.pair > 0),  # (indexes as Python bools)
        source="simulated",
        offsets=list(flat.offsets),
        a2a_hidden=hidden,
        a2a_exposed=exposed,
        # from the kind codes, not the letters: the activations column and the kinds present
        _np={"inflight": np.array(_INFLIGHT, dtype=np.int8).take(flat.kind)},
        _kinds=frozenset(k for c, k in enumerate(KINDS) if (flat.kind == c).any()),
    )


_INFLIGHT = tuple({"F": 1, "B": -1, "I": -1}.get(k, 0) for k in KINDS)
"""Per kind code, the change in activations held (Timeline's ``inflight`` column)."""

_LETTERS = bytes.maketrans(bytes(range(len(KINDS))), "".join(KINDS).encode("ascii"))


def _filled(typecode: str, size: int, value: float, views: bool = False
            ) -> tuple[array | memoryview, np.ndarray]:
    """A C array of ``size`` copies of ``value`` (``q``: int64, ``d``: double) and a
    writable numpy view of it (drop the view before the array is resized: never here).

    ``views``: a numpy array and a memoryview of it instead, which index the same (Python
    ints and floats), and a little faster in the clock's loop. numpy asks the kernel for
    huge pages for large arrays, so a million steps' column costs a few page faults where a
    C array's costs two thousand: in a fresh process (the command line) that is a
    measurable share of the whole simulation. Step numbers (``q``) are then 32-bit
    integers wherever they fit (:func:`_step_dtype`): half the memory to touch."""
    import numpy as np

    if views:
        values = np.full(size, value, dtype=_step_dtype(size) if typecode == "q"
                         else np.float64)
        return memoryview(values), values
    out = array(typecode, [value]) * size
    return out, np.frombuffer(out, dtype=np.int64 if typecode == "q" else np.float64)


def _clock(initial: array | memoryview, ends: bool = True, in_place: bool = False
           ) -> tuple[array | memoryview | None, list[int] | memoryview]:
    """The loop's ``end`` (a copy of ``initial``, or ``initial`` itself ``in_place``; None
    unless ``ends``), of the kind ``initial`` is (C array, or memoryview of a numpy array:
    :func:`_filled`), and ``waiter`` column: a list of zeros. A list indexes several times
    faster than a memoryview (no int object made per read), and costs nothing to make
    (every entry the one 0); it holds the number of each step parked and not yet woken, a
    few per rank (the loops put back 0 when they wake one)."""
    if isinstance(initial, array):
        end = (initial if in_place else array("d", initial)) if ends else None
        return end, [0] * len(initial)
    import numpy as np

    end = None if not ends else initial if in_place else memoryview(
        np.array(initial, dtype=np.float64))
    return end, [0] * len(initial)


def _step_dtype(size: int) -> type:
    """The numpy integer type of step numbers in a program of ``size`` steps: int32 up to
    2**31 steps (every schedule within the action limits), else int64."""
    import numpy as np

    return np.int32 if size < 2**31 else np.int64


def _ints(column: array | memoryview) -> np.ndarray:
    """A column of step numbers (a C array of int64, or a memoryview of :func:`_filled`'s
    int32 or int64) as numpy integers, without a copy."""
    import numpy as np

    return np.frombuffer(column, dtype=np.int32 if column.itemsize == 4 else np.int64)


def _doubles(values: np.ndarray) -> array:
    """C doubles that index as Python floats (numpy reads them back without a copy)."""
    import numpy as np

    out = array("d")
    out.frombytes(memoryview(np.ascontiguousarray(values, dtype=np.float64)).cast("B"))
    return out  # one copy (tobytes() would make two)


def _read_only(values: np.ndarray) -> memoryview:
    """A read-only memoryview of ``values`` as 64-bit integers (no copy when they are):
    it indexes as Python ints."""
    import numpy as np

    view = np.asarray(values, dtype=np.int64).view()
    view.flags.writeable = False
    return memoryview(view)
