"""Interop with torch.distributed.pipelining's compute-only CSV schedule format.

torch is the reference here: its own schedules (from ``get_schedule_ops``) are read and
simulated, and its ``_PipelineScheduleRuntime._load_csv`` must accept what we write.
"""

import csv
import io
import json
import logging
from unittest import mock

import pytest

from pipebubble.cli import main
from pipebubble.costs import CostModel
from pipebubble.interop import parse_torch_csv, read_torch_csv, to_torch_csv, write_torch_csv
from pipebubble.ir.schedule import Action, Overlap, ScheduleError
from pipebubble.schedules import get_schedule, schedule_names
from pipebubble.sim.formulas import zb_h1_bubble_time
from pipebubble.sim.kernel import simulate

pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops  # noqa: E402
from torch.distributed.pipelining.stage import PipelineStage  # noqa: E402

logging.getLogger("torch.distributed.pipelining").setLevel(logging.ERROR)

SIZES = [(2, 4), (3, 6), (4, 8), (4, 10)]


def torch_ops_csv(name, p, m, chunks=None):
    """torch's own schedule as CSV text, written the way ``_dump_csv`` does (None -> '')."""
    out = io.StringIO()
    writer = csv.writer(out)
    for row in get_schedule_ops(name, p, m, chunks):
        writer.writerow(["" if a is None else str(a) for a in row])
    return out.getvalue()


def torch_load(schedule, path):
    """Load a CSV with torch's runtime, as get_schedule_ops does with mocked stages."""
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = schedule.num_ranks
    stage.submod = None
    stage.num_stages = schedule.num_stages
    runtime = pipelining._PipelineScheduleRuntime([stage] * schedule.chunks,
                                                  schedule.num_microbatches)
    runtime._load_csv(str(path))
    return runtime


# ---- writing, and torch reading what we write ---------------------------------------------

@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_round_trip_and_torch_loads_what_we_write(name, tmp_path):
    for p, m in [(2, 4), (4, 8)]:
        s = get_schedule(name, p, m)
        path = tmp_path / f"{name}-{p}-{m}.csv"
        write_torch_csv(s, path)
        back = read_torch_csv(path, chain_starts=s.chain_starts)  # the file has no chains
        assert back.orders == s.orders
        assert back.stage_to_rank == s.stage_to_rank
        assert (back.num_stages, back.num_microbatches) == (s.num_stages, s.num_microbatches)
        if s.chains > 1:
            # DualPipe's two model copies: torch knows one chain of stages, so it makes
            # stage p wait for stage p-1's output, which comes later on that rank.
            with pytest.raises(AssertionError, match="Malformed compute schedule"):
                torch_load(s, path)
            continue
        runtime = torch_load(s, path)  # validates, infers placement, adds sends/receives
        placement = runtime.stage_index_to_group_rank
        assert [placement[i] for i in range(s.num_stages)] == list(s.stage_to_rank)
        assert [str(a) for a in runtime.pipeline_order[0]][:3] == [
            str(x) + ("OVERLAP_F_B" if isinstance(x, Overlap) else "") for x in s.orders[0][:3]
        ]
        kinds = {a.computation_type.value for r in runtime.pipeline_order_with_comms.values()
                 for a in r}
        assert p == 1 or {"SEND_F", "RECV_F"} <= kinds


def test_overlap_cells_are_written_as_torch_does():
    text = to_torch_csv(get_schedule("dualpipev", 2, 4))
    assert "(0F3;3B1)OVERLAP_F_B" in text.splitlines()[0]


# ---- torch's own schedules -----------------------------------------------------------------

@pytest.mark.parametrize(
    "torch_name, ours, chunks",
    [
        ("GPipe", "gpipe", None),
        ("Interleaved1F1B", "interleaved-1f1b", 2),
        ("Interleaved1F1B", "interleaved-1f1b", 3),
        ("LoopedBFS", "looped-bfs", 2),
        ("ZBVZeroBubble", "zbv", 2),
        ("DualPipeV", "dualpipev", 2),
    ],
)
def test_torch_schedules_equal_ours(torch_name, ours, chunks):
    # Where torch and pipebubble implement the same published schedule, the orders are the
    # same action for action (torch's empty spacing cells and REDUCE_GRAD markers aside), so
    # the simulated step times are equal under any costs. Interleaved1F1B at m=10, p=4 checks
    # the flexible rounds (2 groups of 5) that we follow for m not divisible by p.
    for p, m in SIZES:
        theirs = parse_torch_csv(torch_ops_csv(torch_name, p, m, chunks), source=torch_name)
        mine = get_schedule(ours, p, m, chunks)
        assert theirs.orders == mine.orders, (p, m)
        assert theirs.stage_to_rank == mine.stage_to_rank
        for costs in (CostModel(f=1, b=2, w=1), CostModel(f=1, b=3, w=1, comm=0.25)):
            assert simulate(theirs, costs).step_time == simulate(mine, costs).step_time


def test_torch_interleaved_zero_bubble_has_no_counterpart_but_simulates():
    # InterleavedZeroBubble is ZB-H1 (torch: "ZB1P") with v >= 2 chunks per rank; our zb-h1
    # has one chunk per rank, so there is nothing to compare action for action. What we can
    # check: it validates, simulates without deadlock and, with these uniform costs and
    # m >= p, its step time is m(F+B) + (p-1)(F+I-W)/v -- ZB-H1's bubble divided by v, the
    # same gain interleaving gives 1F1B (observed here, not a published formula).
    for p, m in SIZES:
        for v in (2, 3):
            s = parse_torch_csv(torch_ops_csv("InterleavedZeroBubble", p, m, v))
            assert s.chunks == v and s.uses_split_backward()
            for f, i, w in [(1, 1, 1), (1, 2, 1), (2, 2, 1)]:
                t = simulate(s, CostModel(f=f, b=i + w, w=w))
                expected = m * (f + i + w) + zb_h1_bubble_time(p, f / v, i / v, w / v)
                assert t.step_time == pytest.approx(expected), (p, m, v, f, i, w)


def test_torch_dumps_with_empty_cells_and_markers_are_read():
    text = torch_ops_csv("GPipe", 3, 4)
    assert "REDUCE_GRAD" in text
    spaced = torch_ops_csv("Interleaved1F1B", 2, 4, 2)
    assert ",," in spaced
    s = parse_torch_csv(spaced)
    assert s.num_actions() == 2 * 4 * 2 * 2  # F and B for 4 stages x 4 microbatches


# ---- malformed and inconsistent files ------------------------------------------------------

@pytest.mark.parametrize(
    "text, message",
    [
        ("0F0,0X1\n", "row 1 (rank 0), column 2, cell '0X1': expected STAGE KIND MICROBATCH"),
        ("0F0,0B0\n1B0,1F0\n", "row 2 (rank 1), column 1, cell '1B0': backward of stage 1 "
                               "for microbatch 0, which this rank only runs forward later "
                               "(column 2)"),
        ("0F0,0B0,0B1\n1F0,1B0\n", "column 3, cell '0B1': backward of stage 0 for microbatch "
                                   "1, which this rank never ran forward"),
        ("0F0,0I0,0W1\n", "column 3, cell '0W1': W of stage 0 for microbatch 1 before its I"),
        ("0F0,0B0,0F0\n", "column 3, cell '0F0': 0F0 already ran at column 1"),
        ("0F0,0I0,0B0,0W0\n", "column 3, cell '0B0': 0I0 already ran"),
        ("0F0,1F0,0B0\n1B0\n", "row 2 (rank 1), column 1, cell '1B0': stage 1 already runs on "
                               "rank 0"),
        ("0F0,(0F1;0W0)OVERLAP_F_B\n", "column 2, cell '(0F1;0W0)OVERLAP_F_B': an overlapped "
                                       "pair is a forward then a backward"),
        ("0F0,(0F1;0B0)\n", "column 2, cell '(0F1;0B0)': overlapped actions must be tagged"),
        ("0F0,0SEND_F0\n", "column 2, cell '0SEND_F0': a send/receive action"),
        ("0F0,0B0\n2F0,2B0\n", "cell '2F0': stage 2 is used but stage 1 never appears"),
        ("0F0,0B0,0F2,0B2\n", "stage 0 (rank 0) never runs forward 0F1"),
        ("0F0,0F99999999999,0B0\n", "never runs forward 0F1"),
        ("0F99999999,0B99999999\n", "never runs forward 0F0"),
        ("", "no actions"),
        (",,\n", "no actions"),
    ],
)
def test_errors_name_row_column_and_cell(text, message):
    with pytest.raises(ScheduleError, match="^<csv>: .*" + _re(message)):
        parse_torch_csv(text)


def _re(text):
    import re

    return re.escape(text)


def test_microbatch_out_of_range_when_the_count_is_given():
    with pytest.raises(ScheduleError, match=r"row 2 \(rank 1\), column 3, cell '1F2': "
                                            r"microbatch 2 out of range 0\.\.1"):
        parse_torch_csv("0F0,0F1,0B0,0B1\n1F0,1F1,1F2,1B0,1B1\n", microbatches=2)
    with pytest.raises(ScheduleError, match="the file has 2 rows"):
        parse_torch_csv("0F0,0B0\n1F0,1B0\n", ranks=3)


def test_markers_take_no_time_and_overlaps_parse():
    s = parse_torch_csv("0UNSHARD,0F0,(0F1;0B0)OVERLAP_F_B,0B1,0RESHARD,0REDUCE_GRAD\n")
    assert s.orders[0] == (Action(0, "F", 0), Overlap(Action(0, "F", 1), Action(0, "B", 0)),
                           Action(0, "B", 1))
    assert simulate(s, CostModel(f=1, b=2)).step_time == 6


def test_a_byte_order_mark_and_crlf_are_fine(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeff0F0,0B0\r\n1F0,1B0\r\n".encode())
    assert read_torch_csv(path).to_text() == "0F0 0B0\n1F0 1B0"


def test_missing_file_and_unreadable_file(tmp_path):
    with pytest.raises(ScheduleError, match="no such file"):
        read_torch_csv(tmp_path / "nope.csv")
    with pytest.raises(ScheduleError, match="cannot read"):
        read_torch_csv(tmp_path)
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ScheduleError, match=r"cannot read .*bin\.csv': not UTF-8 text \(byte "
                       r"0xff at offset 0\)"):
        read_torch_csv(tmp_path / "bin.csv")


# ---- the CLI -------------------------------------------------------------------------------

def run_cli(capsys, *args):
    """Run the CLI in this process (a traceback would fail the test); (code, out, err)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_export_then_simulate_csv_with_costs_and_json(tmp_path, capsys):
    out = tmp_path / "zbv.csv"
    assert main(["export", "--schedule", "zbv", "-p", "4", "-m", "8", "--csv", str(out)]) == 0
    assert out.read_text() == to_torch_csv(get_schedule("zbv", 4, 8))
    capsys.readouterr()
    assert main(["simulate", "--csv", str(out), "--json", "--f", "2", "--b", "4",
                 "--w", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["ranks"] == 4 and got["stages"] == 8 and got["microbatches"] == 8
    assert got["step_time"] == 51  # twice the 25.5 of F=1, B=2, W=1
    assert got["closed_form_bubble"] is None  # a file has no published formula
    assert len(got["events"]) == 8 * 8 * 3


def test_export_to_stdout(capsys):
    assert main(["export", "--schedule", "1f1b", "-p", "2", "-m", "2", "--csv", "-"]) == 0
    assert capsys.readouterr().out == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def test_simulate_csv_draws_a_chart(tmp_path, capsys):
    path = tmp_path / "g.csv"
    path.write_text(torch_ops_csv("DualPipeV", 2, 4, 2))
    code, out, err = run_cli(capsys, "simulate", "--csv", str(path))
    assert code == 0, err
    assert "rank 1" in out and "bubble" in out


@pytest.mark.parametrize(
    "content, extra, needle",
    [
        ("0F0,0B0\n1B0,1F0\n", [], "row 2 (rank 1), column 1, cell '1B0'"),
        ("0F0,0B1\n", ["-m", "1"], "column 2, cell '0B1': microbatch 1 out of range 0..0"),
        ("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", [],
         "deadlock, no rank can go on: rank 0 stuck at 0B0 (row 1, column 2) waiting for "
         "0F0 and 1I/B0; rank 1 stuck at 1F1 (row 2, column 1)"),
        ("0F0,0B0\n", ["--chunks", "2"], "--chunks does not apply with --csv"),
        (None, [], "no such file"),
    ],
)
def test_simulate_csv_errors_are_one_line_exit_2(tmp_path, capsys, content, extra, needle):
    path = tmp_path / "s.csv"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli(capsys, "simulate", "--csv", str(path), *extra)
    assert code == 2 and out == ""
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_simulate_without_csv_still_needs_the_schedule_flags(capsys):
    code, _, err = run_cli(capsys, "simulate", "--ranks", "2")
    assert code == 2
    assert "--schedule, --microbatches required (or --csv FILE)" in err


def test_a_user_mistake_never_prints_a_traceback(tmp_path, capsys):
    # In this process: a traceback would fail the test (tests/test_cli.py runs the real
    # entry point once, to see exactly what a user sees).
    path = tmp_path / "s.csv"
    path.write_text("0F0,0B0\n1F0,1Q0\n")
    code, out, err = run_cli(capsys, "simulate", "--csv", str(path))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("pipebubble: error: ")
    assert "row 2 (rank 1), column 2, cell '1Q0'" in err
