"""Bubble sweeps: simulate schedules over a range of microbatch counts.

The lesson's trade-off when tuning m: more microbatches shrink the bubble,
(p - 1)/(m + p - 1) for GPipe and 1F1B, but under GPipe every rank holds all m microbatches'
activations before the first backward, while 1F1B holds at most p. A sweep puts numbers on
both sides: one :class:`SweepPoint` per (schedule, m) with the simulated bubble, the closed
form where one is known, and the peak activation memory.

>>> parse_range("1..4,8,16..32:8", "--microbatches")
[1, 2, 3, 4, 8, 16, 24, 32]
>>> pts = sweep(["gpipe", "1f1b"], ranks=4, microbatches=[8])
>>> [(p.schedule, round(p.bubble_fraction, 4), p.peak_memory) for p in pts]
[('gpipe', 0.2727, 8.0), ('1f1b', 0.2727, 4.0)]
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TextIO

from ..costs import CostModel, fits_limit
from ..errors import UserError, param
from ..ir.schedule import ScheduleError
from ..schedules import SCHEDULES, closed_form_bubble, get_schedule, lookup
from ..sim.kernel import simulate

MAX_POINTS = 100_000  # microbatch counts in one sweep
MAX_LIMITS = 10_000  # memory limits in one sweep


@dataclass(frozen=True)
class SweepPoint:
    """One simulated (schedule, m): what the sweep's CSV holds, one row each."""

    schedule: str
    ranks: int
    chunks: int
    microbatches: int
    step_time: float
    bubble_fraction: float
    closed_form_bubble: float | None
    peak_activations: int  # the most in-flight microbatches on any rank
    peak_memory: float  # the most activation memory on any rank (units of M_B by default)


_INT = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
MAX_PART = 40
"""Longest comma-separated part a range flag accepts (characters), checked before any number
is converted: a 4300-digit integer is one line of error, not Python's conversion limit."""


def _range_parts(text: str, flag: str, real: bool, example: str, minimum: float,
                 max_values: int) -> Iterator[tuple[str, float, float, float, int]]:
    """The one tokenizer of :func:`parse_range` (integers) and :func:`parse_limits` (reals).

    Yields ``(part, lo, hi, step, count)`` for each comma-separated ``N``, ``A..B`` or
    ``A..B:STEP``, after the same guards and with the same wording for both: a part longer
    than :data:`MAX_PART` characters, a number that is not plain decimal (``nan``, ``inf``,
    ``1_000`` and non-ASCII digits are refused), a step not > 0 (integers: >= 1), a start
    below ``minimum``, an empty range, more than ``max_values`` values in all."""
    pattern = _REAL if real else _INT
    number = float if real else int
    total = 0
    for part in (p.strip() for p in str(text).split(",")):
        if len(part) > MAX_PART:
            raise UserError(f"{flag}: {part[:20]!r}... is too long; use N, A..B or A..B:STEP "
                             "with numbers of at most 18 digits")
        lo_text, dots, rest = part.partition("..")
        hi_text, colon, step_text = rest.partition(":")
        texts = [t.strip() for t in (lo_text, hi_text if dots else lo_text,
                                     step_text if colon else "1")]
        if not all(pattern.fullmatch(t) for t in texts):
            raise UserError(f"{flag}: cannot read {part!r}; use N, A..B or A..B:STEP (e.g. "
                             f"{example}), comma-separated")
        lo, hi, step = (number(t) for t in texts)
        if real and not all(math.isfinite(x) for x in (lo, hi, step)):  # 1e999
            raise UserError(f"{flag}: cannot read {part!r}; use N, A..B or A..B:STEP (e.g. "
                             f"{example}) with finite numbers, comma-separated")
        if not step > 0:
            raise UserError(f"{flag}: bad step in {part!r}; use A..B:STEP with STEP "
                             f"{'> 0' if real else '>= 1'}")
        if lo < minimum:
            raise UserError(f"{flag} must be {'finite and ' if real else ''}>= {minimum:g}, "
                             f"got {lo:g} in {part!r}")
        if hi < lo:
            raise UserError(f"{flag}: empty range {part!r} (end {hi:g} < start {lo:g})")
        span = (hi - lo) / step + 1e-9 if real else (hi - lo) // step  # inf if step tiny
        if total + span + 1 > max_values:
            raise UserError(f"{flag}: {part!r} has too many values (at most {max_values})")
        count = int(span) + 1
        total += count
        yield part, lo, hi, step, count


def parse_range(text: str, flag: str = "range") -> list[int]:
    """Integers from ``8``, ``1..128`` (inclusive), ``1..128:4`` (step) or a comma list of
    those; sorted, duplicates dropped. Every value must be >= 1 (:func:`_range_parts`)."""
    values: set[int] = set()
    for _, lo, hi, step, _ in _range_parts(text, flag, False, "1..128", 1, MAX_POINTS):
        values.update(range(int(lo), int(hi) + 1, int(step)))
    return sorted(values)


def sweep(
    schedules: Sequence[str],
    ranks: int,
    microbatches: Iterable[int],
    costs: CostModel | None = None,
    chunks: int | None = None,
    on_point: Callable[[], None] | None = None,
) -> list[SweepPoint]:
    """Simulate every schedule at every m; return the points, schedule by schedule.

    ``auto`` (the automatic scheduler) is searched at every m for ``costs``.
    ``chunks`` goes only to schedules that take a variable number of chunks. A (schedule, m)
    the generator refuses (say, m not a multiple of p for an interleaved schedule) is left
    out; an unknown schedule name raises before anything runs. ``on_point`` is called after
    each point (progress bars).
    """
    costs = costs or CostModel()
    specs = [lookup(name) for name in schedules]
    ms = list(microbatches)
    out = []
    for spec in specs:
        v = chunks if (chunks and not spec.fixed_chunks) else None
        for m in ms:
            try:
                if spec.searched:  # searched again at every m, within costs.memory_limit
                    schedule = spec.build(ranks, m, None, costs=costs)
                else:
                    schedule = get_schedule(spec.name, ranks, m, v)
                timeline = simulate(schedule, costs)
            except ScheduleError:
                if on_point:
                    on_point()
                continue
            try:
                sc = costs.resolve(schedule.num_stages, schedule.chunks)
                closed = closed_form_bubble(spec.name, ranks, m, schedule.chunks, sc)
            except ScheduleError:
                closed = None
            stats = timeline.rank_stats()
            out.append(SweepPoint(
                schedule=spec.name, ranks=ranks, chunks=schedule.chunks, microbatches=m,
                step_time=timeline.step_time, bubble_fraction=timeline.bubble_fraction,
                closed_form_bubble=closed,
                peak_activations=max(s.peak_activations for s in stats),
                peak_memory=max(s.peak_memory for s in stats),
            ))
            if on_point:
                on_point()
    return out


def write_csv(points: Sequence[SweepPoint], out: TextIO) -> None:
    """One header line, then one row per point; a missing closed form is an empty cell."""
    names = [f.name for f in fields(SweepPoint)]
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for p in points:
        row = asdict(p)
        row["closed_form_bubble"] = "" if p.closed_form_bubble is None else p.closed_form_bubble
        writer.writerow(row)


# ---- step time against the memory limit ---------------------------------------------------

def memory_schedules() -> list[str]:
    """What ``sweep --memory-limit`` compares by default: the specs with a
    ``memory_sweep`` place, in that order (``auto``, then the families of least memory)."""
    ranked = [(s.memory_sweep, n) for n, s in SCHEDULES.items() if s.memory_sweep is not None]
    return [n for _, n in sorted(ranked)]


@dataclass(frozen=True)
class MemoryPoint:
    """One (schedule, memory limit): its step time and bubble, and whether it fits.

    A registered schedule's order does not depend on the limit: it fits from its own peak
    memory on. ``auto`` is searched again at every limit; below the smallest feasible limit
    nothing fits (``fits`` False, ``step_time`` None).
    """

    schedule: str
    ranks: int
    microbatches: int
    chunks: int
    memory_limit: float
    fits: bool
    step_time: float | None
    bubble_fraction: float | None
    peak_memory: float | None


def parse_limits(text: str, flag: str = param("memory_limit")) -> list[float]:
    """Limits from ``4``, ``1..8`` (step 1), ``1..8:0.5`` or a comma list of those; sorted.
    Every value must be finite and >= 0 (:func:`_range_parts`, as :func:`parse_range`).

    >>> parse_limits("1..3:0.5,8")
    [1.0, 1.5, 2.0, 2.5, 3.0, 8.0]
    """
    values: set[float] = set()
    for _, lo, _, step, n in _range_parts(text, flag, True, "1..8:0.5", 0, MAX_LIMITS):
        values.update(round(lo + k * step, 9) for k in range(n))
    return sorted(values)


def memory_sweep(
    schedules: Sequence[str],
    ranks: int,
    microbatches: int,
    limits: Sequence[float],
    costs: CostModel | None = None,
    on_point: Callable[[], None] | None = None,
) -> list[MemoryPoint]:
    """Step time of each schedule at each memory limit (the Pareto front a user picks from).

    >>> pts = memory_sweep(["1f1b", "auto"], 4, 8, [2, 4], CostModel())
    >>> [(p.schedule, p.fits, p.step_time) for p in pts]
    [('1f1b', False, 33.0), ('1f1b', True, 33.0), ('auto', True, 29.5), ('auto', True, 25.5)]
    """
    costs = costs or CostModel()
    out = []
    for name in schedules:
        try:
            spec = lookup(name)
        except ScheduleError:
            continue
        if spec.searched:
            name = spec.name
            for limit in limits:
                try:
                    sched = spec.build(ranks, microbatches, None, costs=costs,
                                       memory_limit=limit)
                except ScheduleError:
                    out.append(MemoryPoint(name, ranks, microbatches, 0, limit, False, None,
                                           None, None))
                else:
                    out.append(_memory_point(name, sched, costs, limit))
                if on_point:
                    on_point()
            continue
        try:
            sched = get_schedule(lookup(name).name, ranks, microbatches)
            timeline = simulate(sched, costs)
        except ScheduleError:
            continue
        for limit in limits:
            out.append(_memory_point(sched.name, sched, costs, limit, timeline))
            if on_point:
                on_point()
    return out


def _memory_point(name: str, sched, costs: CostModel, limit: float,
                  timeline=None) -> MemoryPoint:
    timeline = timeline or simulate(sched, costs)
    peak = max(s.peak_memory for s in timeline.rank_stats())
    return MemoryPoint(name, sched.num_ranks, sched.num_microbatches, sched.chunks, limit,
                       fits_limit(peak, limit), timeline.step_time,
                       timeline.bubble_fraction, peak)


def write_memory_csv(points: Sequence[MemoryPoint], out: TextIO) -> None:
    """One header line, then one row per (schedule, limit); missing values are empty."""
    names = [f.name for f in fields(MemoryPoint)]
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for p in points:
        writer.writerow({k: ("" if v is None else v) for k, v in asdict(p).items()})
