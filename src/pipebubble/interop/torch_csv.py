"""torch.distributed.pipelining's compute-only CSV schedule format: read it and write it.

PyTorch's ``PipelineScheduleMulti._dump_csv`` / ``_load_csv`` (and
``_PipelineScheduleRuntime._load_csv``, which then adds the sends and receives) store a
schedule as one CSV row per rank and one action per cell, in the text form of ``_Action``::

    0F0,0F1,,0B0,0B1
    ,1F0,1F1,1B0,(1F2;1B1)OVERLAP_F_B

- ``0F0``, ``1I2``, ``1W2``, ``1B2``: stage, kind, microbatch (I and W: split backward);
- an empty cell: an idle slot. PyTorch uses them to line ranks up for display; here they
  are spacing only and take no time (the simulator waits on data dependencies instead);
- ``(0F7;7B3)OVERLAP_F_B``: a forward and a backward run as one overlapped block
  (DualPipeV), read as an :class:`~pipebubble.ir.schedule.Overlap`;
- ``0UNSHARD``, ``0RESHARD``, ``0REDUCE_GRAD``: FSDP and gradient-reduction markers,
  accepted and given no time.

The stage → rank placement is inferred from which row runs each stage. A malformed or
inconsistent file gets one :class:`~pipebubble.ir.schedule.ScheduleError` naming the row (and
its rank), the column and the cell, e.g. ``s.csv: row 2 (rank 1), column 4, cell '1B3':
backward of stage 1 for microbatch 3, which this rank never ran forward``. Rows and columns
count from 1, as in a spreadsheet; ranks from 0.

>>> from pipebubble.schedules import get_schedule
>>> text = to_torch_csv(get_schedule("1f1b", ranks=2, microbatches=2))
>>> print(text, end="")
0F0,0F1,0B0,0B1
1F0,1B0,1F1,1B1
>>> parse_torch_csv(text).orders == get_schedule("1f1b", 2, 2).orders
True
"""

from __future__ import annotations

import csv
import io
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..errors import param
from ..ir.deps import describe_wait
from ..ir.schedule import (
    Action,
    Schedule,
    ScheduleError,
    Step,
    make_schedule,
    parse_overlap,
    step_actions,
    step_text,
    validate,
)
from ..sim.kernel import Deadlock

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_CSV = param("csv")

_MARKER = re.compile(r"^(\d+)(UNSHARD|RESHARD|REDUCE_GRAD)(\d*)$")
_COMM = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")


class _Cell(ValueError):
    """A cell-level problem; the reader adds the row, the column and the cell."""


def _parse_cell(text: str) -> Step | None:
    """One cell -> an Action, an Overlap, or None (idle slot or a no-time marker)."""
    text = text.strip()
    if not text or _MARKER.match(text):
        return None
    if (longest := max((len(d) for d in re.findall(r"\d+", text)), default=0)) > 18:
        raise _Cell(f"a stage or microbatch number with {longest} digits; at most 18")
    if text.startswith("("):
        try:
            return parse_overlap(text, require_tag=True)
        except ScheduleError as exc:
            raise _Cell(str(exc)) from None
    if _COMM.match(text):
        raise _Cell("a send/receive action; torch's compute-only format has none (this looks "
                    "like a compute_comms file, which is not supported)")
    try:
        return Action.from_str(text)
    except ScheduleError:
        raise _Cell("expected STAGE KIND MICROBATCH with KIND one of F, I, W, B (e.g. 2F5), "
                    "an overlapped pair (0F7;7B3)OVERLAP_F_B, UNSHARD/RESHARD/REDUCE_GRAD, "
                    "or empty") from None


def parse_torch_csv(
    text: str,
    *,
    source: str = "<csv>",
    name: str | None = None,
    ranks: int | None = None,
    microbatches: int | None = None,
    chain_starts: Sequence[int] = (0,),
) -> Schedule:
    """Parse the text of a compute-only CSV into a validated Schedule.

    ``ranks`` and ``microbatches``, when given, are checked against the file; otherwise
    ranks = the number of rows and microbatches = the largest index + 1 (per chain).
    ``source`` names the file in error messages. The format has no notion of independent
    chains of stages (DualPipe's two model copies): pass ``chain_starts=(0, p)`` to read
    such a file back; by default the stages form one chain.
    """
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise ScheduleError(f"{source}: not a CSV file: {exc}") from None
    if not rows or not any(cell.strip() for row in rows for cell in row):
        raise ScheduleError(f"{source}: no actions (expected one row per rank)")
    if ranks is not None and len(rows) != ranks:
        raise ScheduleError(f"{source}: the file has {len(rows)} rows (one per rank), "
                            f"but {ranks} ranks were asked for")

    def where(r: int, c: int) -> str:
        return f"{source}: row {r + 1} (rank {r}), column {c + 1}, cell {rows[r][c].strip()!r}"

    orders: list[list[Step]] = []
    columns: list[list[int]] = []
    for r, row in enumerate(rows):
        order, cols = [], []
        for c, cell in enumerate(row):
            try:
                step = _parse_cell(cell)
            except _Cell as exc:
                raise ScheduleError(f"{where(r, c)}: {exc}") from None
            if step is not None:
                order.append(step)
                cols.append(c)
        orders.append(order)
        columns.append(cols)

    # Consistency, checked cell by cell so every error can point at one.
    owner: dict[int, tuple[int, int]] = {}      # stage -> (rank, column) where first seen
    seen: dict[Action, tuple[int, int]] = {}    # action -> (rank, column)
    forwarded: dict[int, set[int]] = {}
    for r, order in enumerate(orders):
        for step, c in zip(order, columns[r], strict=True):
            for a in step_actions(step):
                _check_action(a, r, c, owner, seen, microbatches, where, rows)
                if a.kind == "F":
                    forwarded.setdefault(a.stage, set()).add(a.microbatch)
    if not owner:  # every cell idle or a no-time marker: nothing to schedule
        raise ScheduleError(f"{source}: no compute actions: every cell is empty or a marker "
                            "(UNSHARD, RESHARD, REDUCE_GRAD); a schedule needs F and B "
                            "(or I and W) actions such as 0F0")
    if not forwarded:
        raise ScheduleError(f"{source}: no forward (F) actions; every stage runs a forward "
                            "per microbatch, e.g. 0F0")
    stages = max(owner) + 1
    if len(owner) != stages:
        missing = next(s for s in range(stages) if s not in owner)
        r, c = owner[stages - 1]
        raise ScheduleError(f"{where(r, c)}: stage {stages - 1} is used but stage {missing} "
                            f"never appears; stages must be numbered 0..S-1")
    if microbatches is None:
        microbatches = 1 + max(max(mbs) for mbs in forwarded.values())
    for s in range(stages):
        mbs = forwarded.get(s, set())
        if len(mbs) != microbatches:
            gap = next(k for k in range(microbatches) if k not in mbs)
            raise ScheduleError(
                f"{source}: stage {s} (rank {owner[s][0]}) never runs forward {s}F{gap}; "
                f"every stage runs microbatches 0..{microbatches - 1}"
            )
    schedule = make_schedule(
        name or "csv", orders, stages, microbatches,
        placement=[owner[s][0] for s in range(stages)], chain_starts=chain_starts,
        source=source, csv_columns=[[c + 1 for c in cols] for cols in columns],
    )
    try:
        validate(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"{source}: {exc}") from None
    return schedule


def _check_action(a, r, c, owner, seen, microbatches, where, rows) -> None:
    s, kind, mb = a
    first = owner.setdefault(s, (r, c))
    if first[0] != r:
        raise ScheduleError(f"{where(r, c)}: stage {s} already runs on rank {first[0]} "
                            f"(row {first[0] + 1}, column {first[1] + 1}); a stage lives on "
                            "one rank")
    if microbatches is not None and not 0 <= mb < microbatches:
        raise ScheduleError(f"{where(r, c)}: microbatch {mb} out of range 0..{microbatches - 1}")
    if a in seen:
        raise ScheduleError(f"{where(r, c)}: {a} already ran at column {seen[a][1] + 1}")
    if kind in ("B", "I"):
        if Action(s, "F", mb) not in seen:
            later = _find(rows[r], c, f"{s}F{mb}")
            raise ScheduleError(
                f"{where(r, c)}: backward of stage {s} for microbatch {mb}, which this rank "
                + (f"only runs forward later (column {later + 1})" if later is not None
                   else "never ran forward")
            )
        other = Action(s, "I" if kind == "B" else "B", mb)
        if other in seen:
            raise ScheduleError(f"{where(r, c)}: {other} already ran (column "
                                f"{seen[other][1] + 1}); use B, or I then W, not both")
    if kind == "W" and Action(s, "B", mb) in seen:
        raise ScheduleError(f"{where(r, c)}: {s}B{mb} already ran the full backward (I + W)")
    if kind == "W" and Action(s, "I", mb) not in seen:
        raise ScheduleError(f"{where(r, c)}: W of stage {s} for microbatch {mb} before its "
                            f"I ({s}I{mb}); W needs the I that produced its gradient")
    seen[a] = (r, c)


def _find(row: Sequence[str], after: int, text: str) -> int | None:
    for c in range(after + 1, len(row)):
        cell = row[c].strip()
        if cell == text or (cell.startswith("(") and text in cell[1:].split(")")[0].split(";")):
            return c
    return None


def read_torch_csv(
    path: str | Path,
    *,
    name: str | None = None,
    ranks: int | None = None,
    microbatches: int | None = None,
    chain_starts: Sequence[int] = (0,),
) -> Schedule:
    """Read a compute-only CSV file (see :func:`parse_torch_csv`)."""
    from ..files import read_text_file

    path = Path(path)
    text = read_text_file(path, _CSV)  # regular UTF-8 file (a BOM allowed), size-limited
    return parse_torch_csv(text, source=str(path), name=name or path.stem, ranks=ranks,
                           microbatches=microbatches, chain_starts=chain_starts)


def cell_text(step: Step) -> str:
    """The CSV cell for one step, as torch's ``_Action.__repr__`` writes it."""
    return step_text(step, tagged=True)


def to_torch_csv(schedule: Schedule) -> str:
    """The schedule as compute-only CSV text: one row per rank, no empty cells."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for order in schedule.orders:
        writer.writerow([cell_text(step) for step in order])
    return out.getvalue()


def write_torch_csv(schedule: Schedule, dest: str | Path | TextIO) -> None:
    """Write :func:`to_torch_csv` to a path, an open file, or ``-`` (standard output)."""
    text = to_torch_csv(schedule)
    if hasattr(dest, "write"):
        dest.write(text)
    elif str(dest) == "-":
        sys.stdout.write(text)
    else:
        from ..files import write_text

        write_text(dest, text, _CSV)


def explain_deadlock(schedule: Schedule, exc: Deadlock) -> ScheduleError:
    """Rephrase a simulator deadlock on a CSV schedule with each stuck cell's row and column
    and what it waits for (:func:`pipebubble.ir.deps.describe_wait`)."""
    cols = schedule.options.get("csv_columns")
    source = schedule.options.get("source", schedule.name)
    if cols is None:
        return exc
    parts = []
    for r, (step_text_, waits) in exc.stuck.items():
        idx = next((i for i, st in enumerate(schedule.orders[r])
                    if step_text_ in (str(st), *map(str, step_actions(st)))), None)
        at = f" (row {r + 1}, column {cols[r][idx]})" if idx is not None else ""
        if idx is not None:
            waits = describe_wait(schedule.orders[r][idx], schedule)
        parts.append(f"rank {r} stuck at {step_text_}{at} waiting for {waits}")
    return ScheduleError(f"{source}: deadlock, no rank can go on: " + "; ".join(parts))
