"""``pipebubble sweep``: bubble and peak activation memory against m, per schedule.

    pipebubble sweep --ranks 4 --microbatches 1..128 --schedules gpipe,1f1b \\
        --csv sweep.csv --png sweep.png

Prints a table (a sample of m values when there are many), writes every point as CSV with
``--csv FILE`` (``-`` for stdout, then nothing else is printed) and the picture with
``--png``/``--svg``, and with ``--trace FILE`` a Perfetto trace of every schedule at the
largest m swept. A long sweep shows a progress bar on the terminal.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import UserError
from ..files import flush_stdout, open_output
from ..limits import check_sweep
from ..plan.sweep import SweepPoint, parse_range, sweep, write_csv
from ..schedules import lookup, schedule_names
from ._flags import render
from .common import (
    add_cost_flags,
    add_limit_flag,
    check_outputs,
    costs_from_args,
    positive_int,
    wrote,
)

PROGRESS_FROM = 200  # points; fewer finish before a bar would be worth drawing
TABLE_ROWS = 16

if TYPE_CHECKING:
    from rich.table import Table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="bubble and peak memory against the number of microbatches",
        description="Simulate schedules over a range of microbatch counts; plot the bubble "
        "fraction (with its closed form) and the peak activation memory against m.")
    p.add_argument("--ranks", "-p", type=positive_int("--ranks"), required=True, metavar="P",
                   help="pipeline ranks (workers, one per device)")
    p.add_argument("--microbatches", "-m", default="1..64", metavar="RANGE",
                   help="N, A..B, A..B:STEP or a comma list of those (default 1..64)")
    p.add_argument("--schedules", default=None, metavar="LIST",
                   help=f"comma list (default all: {','.join(schedule_names(searched=False))})")
    p.add_argument("--chunks", "-v", type=positive_int("--chunks"), default=None, metavar="V",
                   help="chunks for schedules that take a variable number")
    add_limit_flag(p)
    add_cost_flags(p, limit=False)
    p.add_argument("--memory-limit", default=None, metavar="RANGE",
                   help="sweep the activation-memory limit instead of m: X, A..B, A..B:STEP "
                   "or a comma list; step time of auto, v-min, v-half, zbv, 1f1b, zb-h1, "
                   "zb-h2 (or --schedules) at one m (--microbatches N)")
    g = p.add_argument_group("output")
    g.add_argument("--csv", metavar="FILE", help="write every point as CSV ('-': stdout)")
    g.add_argument("--png", metavar="FILE", help="save the plot as PNG")
    g.add_argument("--svg", metavar="FILE", help="save the plot as SVG")
    g.add_argument("--trace", metavar="FILE",
                   help="save a Perfetto trace of each schedule at the sweep's largest m")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, "png", "svg", "trace", "csv")
    if args.memory_limit is not None:
        return run_memory(args)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    ms = parse_range(args.microbatches, "--microbatches")
    text = ",".join(schedule_names(searched=False)) if args.schedules is None else args.schedules
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UserError(f"--schedules: empty name in {args.schedules!r}; use e.g. gpipe,1f1b")
    names = list(dict.fromkeys(lookup(n).name for n in names))  # unknown names fail here
    costs = costs_from_args(args)
    check_sweep(names, args.ranks, ms, args.chunks,
                None if args.max_actions is None else 10 * args.max_actions)
    total = len(names) * len(ms)
    err = Console(stderr=True)
    with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True,
                  disable=total < PROGRESS_FROM or not err.is_terminal) as bar:
        task = bar.add_task("sweep", total=total)
        points = sweep(names, args.ranks, ms, costs, args.chunks,
                       on_point=lambda: bar.advance(task))
    missing = total - len(points)
    if not points:
        raise UserError(f"no schedule in {','.join(names)} accepts p={args.ranks} with m in "
                         f"{args.microbatches}")
    title = f"bubble and activation memory against microbatches, p={args.ranks}"
    if args.png or args.svg:
        from ..render.sweep_plot import sweep_figure

        _save_figure(args, sweep_figure(points, title))
    if args.trace:
        _write_trace(args.trace, points, names, args, costs)
        wrote(args.trace)
    if args.csv and args.csv != "-":
        with open_output(args.csv, "--csv", newline="") as f:
            write_csv(points, f)
        wrote(args.csv)
    if args.csv == "-":
        write_csv(points, sys.stdout)
    else:
        Console().print(_table(points, names, title))
    flush_stdout()  # a full standard output is the only line: before the note below
    if missing:  # after every file is written: an error above stays the only line
        print_skipped(err, missing, skipped_lines(names, args.ranks, ms, points, args.chunks))
    return 0


def print_skipped(err, missing: int, lines: list[str]) -> None:
    """The note on stderr: how many (schedule, m) pairs were left out, then why, per
    schedule (:func:`skipped_lines`)."""
    err.print(f"[dim]{missing} (schedule, m) pairs were not valid and are left out:[/dim]",
              highlight=False)
    for line in lines:
        err.print(f"  {line}", style="dim", highlight=False, markup=False, soft_wrap=True)


def skipped_lines(names: list[str], ranks: int, ms: list[int], points: list[SweepPoint],
                  chunks: int | None = None) -> list[str]:
    """One line per schedule that left some m out: which m, and the rule that excluded them
    (the generator's own message without its ``, got M``), e.g.
    ``dualpipev: m = 1..7 (needs microbatches >= 2 x ranks = 8)``; where the rule changes
    with m, one line with the first as an example."""
    from ..schedules import get_schedule

    done = {(p.schedule, p.microbatches) for p in points}
    out = []
    for name in names:
        spec = lookup(name)
        left = [m for m in ms if (spec.name, m) not in done]
        if not left:
            continue
        rules: dict[str, list[int]] = {}
        for m in left:
            try:
                if spec.searched:  # auto: the search found no order
                    raise UserError("no order found within --memory-limit")
                get_schedule(name, ranks, m, chunks if chunks and not spec.fixed_chunks
                             else None)
                rule = "generated, but could not be simulated"
            except UserError as exc:
                rule = render(exc).splitlines()[0]
                for tail in (f", got {m}", f" got {m}"):
                    rule = rule.removesuffix(tail)
                rule = rule.removeprefix(f"{spec.name} ")
            rules.setdefault(rule, []).append(m)
        label = spec.name
        if len(rules) > 2:  # the rule depends on m (interleaved: m // p rounds): one example
            rule, group = next(iter(rules.items()))
            out.append(f"{label}: m = {_ranges(left)} (for example m={group[0]}: {rule})")
            continue
        for rule, group in rules.items():
            out.append(f"{label}: m = {_ranges(group)} ({rule})")
    return out


def _ranges(ms: list[int], most: int = 8) -> str:
    """``1..3, 5, 7, 8``: runs of three or more consecutive integers joined; past ``most``
    items, a count.

    >>> _ranges([1, 2, 3, 5, 7, 8])
    '1..3, 5, 7, 8'
    >>> _ranges(list(range(1, 40, 2)), most=3)
    '1, 3, 5 and 17 more'
    """
    runs: list[list[int]] = []
    for m in sorted(ms):
        if runs and m == runs[-1][-1] + 1:
            runs[-1].append(m)
        else:
            runs.append([m])
    items = [f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    items = ", ".join(items).split(", ")
    if len(items) > most:
        return ", ".join(items[:most]) + f" and {len(items) - most} more"
    return ", ".join(items)


def _save_figure(args: argparse.Namespace, fig) -> None:
    """Save a sweep figure to whichever of --png and --svg were given."""
    from ..render.plots import save

    for fmt in ("png", "svg"):
        path = getattr(args, fmt)
        if path:
            save(fig, path, fmt)
            wrote(path)


def _write_trace(path: str, points: list[SweepPoint], names: list[str],
                 args: argparse.Namespace, costs) -> None:
    """One trace holding every schedule's timeline at the largest m it was swept at."""
    from ..render.trace import write_trace
    from ..schedules import get_schedule
    from ..sim.kernel import simulate

    timelines, labels = [], []
    for name in names:
        ms = [p.microbatches for p in points if p.schedule == name]
        if not ms:
            continue
        spec = lookup(name)
        v = None if spec.searched else args.chunks if (args.chunks and not spec.fixed_chunks) \
            else None
        timelines.append(simulate(get_schedule(name, args.ranks, max(ms), v, costs=costs),
                                  costs))
        labels.append(f"{name} m={max(ms)}")
    write_trace(path, timelines, labels)


def sample_ms(ms: list[int], k: int) -> list[int]:
    """At most ``k`` (>= 2) of the sorted values ``ms`` for a table: the first and the last,
    powers of two (evenly thinned), then values splitting the widest remaining gaps.

    >>> sample_ms(list(range(1, 129)), 6)
    [1, 2, 8, 16, 64, 128]
    >>> sample_ms(list(range(1, 11)), 5)
    [1, 2, 4, 8, 10]
    >>> sample_ms([3, 5, 6, 7, 9, 12], 4)
    [3, 7, 9, 12]
    """
    k = max(2, k)
    if len(ms) <= k:
        return list(ms)
    pow2 = [m for m in ms[1:-1] if m & (m - 1) == 0]
    if len(pow2) > k - 2:
        n = k - 2
        pow2 = [pow2[round(i * (len(pow2) - 1) / (n - 1))] for i in range(n)] if n > 1 \
            else pow2[len(pow2) // 2:len(pow2) // 2 + n]
    keep = sorted({ms[0], ms[-1], *pow2})
    pool = sorted(set(ms) - set(keep))
    while len(keep) < k and pool:
        gaps = [(keep[i + 1] - keep[i], i) for i in range(len(keep) - 1)]
        for _, i in sorted(gaps, reverse=True):
            inside = [m for m in pool if keep[i] < m < keep[i + 1]]
            if inside:
                mid = (keep[i] + keep[i + 1]) / 2
                best = min(inside, key=lambda m: abs(m - mid))
                keep = sorted([*keep, best])
                pool.remove(best)
                break
    return keep


def _table(points: list[SweepPoint], names: list[str], title: str,
           width: int | None = None) -> Table:
    """Bubble (simulated, and the closed form in a row below where it differs) and peak
    memory: one row per schedule, one column per sampled m, as many as fit ``width``."""
    from rich.console import Console
    from rich.table import Table

    width = width or Console().width
    name_w = max(len(n) for n in [*names, "closed form"]) + 3
    ms = sample_ms(sorted({p.microbatches for p in points}), min(TABLE_ROWS,
                                                                  (width - name_w) // 9))
    by_key = {(p.schedule, p.microbatches): p for p in points}
    table = Table(title=title, show_edge=False, caption_justify="left",
                  caption="bubble: simulated fraction of idle time (the closed form below it "
                  "where they differ); mem: peak activation memory, rank-shares of M_B")
    table.add_column("m", justify="left", no_wrap=True)
    for m in ms:
        table.add_column(str(m), justify="right", no_wrap=True)
    for section in ("bubble", "mem"):
        for n in names:
            row, closed, differs = [], [], False
            for m in ms:
                p = by_key.get((n, m))
                if p is None:
                    row.append("—")
                    closed.append("")
                    continue
                if section == "mem":
                    row.append(f"{p.peak_memory:.4g}")
                    continue
                row.append(f"{p.bubble_fraction:.2%}")
                c = p.closed_form_bubble
                closed.append("—" if c is None else f"{c:.2%}")
                differs |= c is not None and abs(c - p.bubble_fraction) > 5e-4
            table.add_row(f"{n} {section}" if section == "mem" else n, *row,
                          end_section=False)
            if differs:
                table.add_row("  closed form", *closed, style="dim")
        table.rows[-1].end_section = True
    return table


def run_memory(args: argparse.Namespace) -> int:
    """``sweep --memory-limit``: step time and bubble against the limit at one m."""
    from rich.console import Console
    from rich.table import Table

    from ..plan.sweep import memory_schedules, memory_sweep, parse_limits, write_memory_csv

    if args.trace:
        raise UserError("--trace draws a sweep over m; with --memory-limit use --csv, --png or "
                        "--svg (or simulate one limit with `pipebubble simulate --trace`)")
    ms = parse_range(args.microbatches, "--microbatches")
    if len(ms) != 1:
        raise UserError(f"--memory-limit sweeps at one m: give --microbatches N, "
                         f"got {args.microbatches!r}")
    limits = parse_limits(args.memory_limit)
    names = ([n.strip() for n in args.schedules.split(",")] if args.schedules is not None
             else memory_schedules())
    if not all(names):
        raise UserError(f"--schedules: empty name in {args.schedules!r}; use e.g. auto,zbv")
    names = list(dict.fromkeys(lookup(n).name for n in names))
    costs = replace(costs_from_args(args), memory_limit=None)  # the flag is the range here
    check_sweep(names, args.ranks, [ms[0]] * len(limits), 2,
                None if args.max_actions is None else 10 * args.max_actions)
    points = memory_sweep(names, args.ranks, ms[0], limits, costs)
    if not any(p.fits for p in points):
        raise UserError(f"no schedule fits any --memory-limit in {args.memory_limit} "
                         f"(p={args.ranks}, m={ms[0]}); raise the limit")
    title = f"step time against the activation-memory limit, p={args.ranks}, m={ms[0]}"
    if args.png or args.svg:
        from ..render.sweep_plot import memory_figure

        _save_figure(args, memory_figure(points, title))
    if args.csv == "-":
        write_memory_csv(points, sys.stdout)
        return 0
    if args.csv:
        with open_output(args.csv, "--csv", newline="") as f:
            write_memory_csv(points, f)
        wrote(args.csv)
    table = Table(title=title, show_edge=False, caption="step time (bubble); — : does not fit")
    table.add_column("limit", justify="right")
    for n in names:
        table.add_column(n, justify="right")
    by_key = {(p.schedule, p.memory_limit): p for p in points}
    shown = limits if len(limits) <= 2 * TABLE_ROWS else limits[:: -(-len(limits) // TABLE_ROWS)]
    for limit in shown:
        row = [f"{limit:g}"]
        for n in names:
            p = by_key.get((n, limit))
            row.append("—" if p is None or not p.fits
                       else f"{p.step_time:.4g} ({p.bubble_fraction:.1%})")
        table.add_row(*row)
    Console().print(table)
    return 0
