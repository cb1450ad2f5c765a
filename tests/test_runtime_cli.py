"""``pipebubble run --local``: the JSON contract, the check, recomputation, bad input."""

import argparse
import json

import pytest

from pipebubble.cli import main
from pipebubble.commands import run as run_cmd
from pipebubble.schedules import get_schedule

SMALL = ["--width", "16", "--warmup", "0", "--repeat", "1"]


def run_json(capsys, *args):
    assert main(["run", "--local", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract_and_check(capsys):
    out = run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "3", "--batch", "9",
                   "--check", *SMALL)
    assert out["schedule"] == "1f1b" and out["ranks"] == 2 and out["microbatches"] == 3
    for key in ("step_time", "bubble_fraction", "lower_bound", "closed_form_bubble",
                "per_rank", "events", "predicted", "loss", "grad_max_abs_diff",
                "loss_abs_diff", "peak_activation_bytes"):
        assert key in out, key
    assert len(out["events"]) == 2 * 3 * 2
    # The summary is the events' arithmetic: step = last end - first start, lower bound =
    # busiest rank's busy time, bubble = idle share of ranks x step (DESIGN's definitions).
    ev = out["events"]
    step = max(e["end"] for e in ev) - min(e["start"] for e in ev)
    busy = [sum(e["end"] - e["start"] for e in ev if e["rank"] == r) for r in range(2)]
    assert out["step_time"] == pytest.approx(step)
    assert [r["busy"] for r in out["per_rank"]] == pytest.approx(busy)
    assert out["lower_bound"] == pytest.approx(max(busy)) and out["lower_bound"] > 0
    assert out["bubble_fraction"] == pytest.approx(1 - sum(busy) / (2 * step))
    assert set(out["predicted"]) >= {"step_time", "bubble_fraction"}
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5
    # 2 MLP blocks per stage by default; the measured peak is what the simulator predicts
    assert out["predicted"]["peak_memory"] == [float(b) for b in out["peak_activation_bytes"]]
    assert [r["peak_memory"] for r in out["per_rank"]] == out["predicted"]["peak_memory"]


def test_transformer_with_recompute_prints_the_trade(capsys):
    out = run_json(capsys, "--schedule", "gpipe", "-p", "2", "-m", "2", "--model",
                   "transformer", "--layers", "2", "--dim", "16", "--heads", "2", "--vocab",
                   "64", "--seq", "8", "--recompute", "--check", *SMALL)
    assert out["stages"] == 2 and out["grad_max_abs_diff"] < 1e-4
    trade = out["recompute_trade"]
    assert trade["peak_bytes_with"][0] < trade["peak_bytes_without"][0]
    assert trade["predicted_peak_bytes_with"] == [float(b) for b in trade["peak_bytes_with"]]


def test_text_output(capsys):
    assert main(["run", "--local", "--schedule", "gpipe", "-p", "2", "-m", "4", "--check",
                 "--recompute", "--chart-width", "60", *SMALL]) == 0
    text = capsys.readouterr().out
    for needle in ("rank 0", "rank 1", "measured vs predicted", "step time", "bubble",
                   "loss", "largest gradient difference", "activation recomputation"):
        assert needle in text, needle


@pytest.mark.parametrize("args, message", [
    (["--schedule", "1f1b", "-p", "4", "-m", "2", "--layers", "3"],
     "the model has 3 layers, fewer than the 4 stages (ranks x chunks); at most 3 stages"),
    (["--schedule", "1f1b", "-p", "2", "-m", "8", "--batch", "4"],
     "--batch 4 is smaller than --microbatches 8"),
    (["--schedule", "1f1b", "-p", "2", "-m", "2", "--model", "resnet"],
     "unknown model 'resnet'; valid are mlp, transformer"),
    (["--schedule", "nope", "-p", "2", "-m", "2"], "unknown schedule 'nope'"),
    (["--schedule", "1f1b", "-p", "2", "-m", "2", "--boundaries", "1,2"],
     "boundaries has 2 cut points; 2 stages need 1"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, message):
    assert main(["run", "--local", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipebubble: error: ") and message in err


def test_local_refuses_data_parallel(capsys):
    # one process per rank (and replica) needs the distributed launch (tests/test_distributed.py)
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--dp", "2"]) == 2
    assert "drop --local" in capsys.readouterr().err


def test_setup_and_report_are_reusable():
    """The distributed path reuses build_setup and analyse/report_json."""
    from pipebubble.runtime.local import run_local

    args = argparse.Namespace(schedule="gpipe", ranks=2, microbatches=2, chunks=None,
                              model="mlp", layers=4, width=8, heads=2, vocab=16, seq=4,
                              batch=4, boundaries="1", seed=0, device="cpu")
    setup = run_cmd.build_setup(args, reference=True)
    assert setup.boundaries == [1] and [len(s.layers) for s in setup.stages] == [1, 3]
    r = run_local(setup.schedule, setup.stages, setup.inputs, setup.targets,
                  setup.spec.loss_fn)
    report = run_cmd.analyse(setup, r.timeline, r.loss, r.peak_bytes)
    out = run_cmd.report_json(report)
    assert out["loss"] == r.loss and len(out["events"]) == 8
    grad_diff, loss_diff = run_cmd.check_against_unsplit(setup, r.loss)
    assert grad_diff < 1e-5 and loss_diff < 1e-5


def test_dualpipe_runs_two_model_copies(capsys):
    # 2 ranks, 4 microbatches in total (2 per direction): the model is cut into 2 stages and
    # the second chain runs a copy; the copies' gradients add up to the unsplit model's.
    out = run_json(capsys, "--schedule", "dualpipe", "-p", "2", "-m", "4", "--batch", "8",
                   "--check", *SMALL)
    assert out["microbatches"] == 4 and out["stages"] == 4
    assert len(out["events"]) == get_schedule("dualpipe", 2, 4).num_actions()
    assert {(e["stage"], e["microbatch"]) for e in out["events"]} == {
        (s, m) for s in range(4) for m in range(2)}  # every stage of both chains ran both
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5


# ---- run --csv: the order from a torch compute-only CSV ------------------------------------
@pytest.fixture
def auto_csv(tmp_path):
    """An ``auto`` order in V placement (4 stages on 2 ranks, split backward) as torch's CSV."""
    from pipebubble.costs import CostModel
    from pipebubble.interop.torch_csv import write_torch_csv
    from pipebubble.schedules.auto import auto_schedule

    sched = auto_schedule(2, 4, CostModel(f=1, b=2, w=1), placement="v")
    path = tmp_path / "auto.csv"
    write_torch_csv(sched, path)
    return sched, str(path)


def test_csv_order_runs_and_gives_exact_gradients(capsys, auto_csv):
    sched, path = auto_csv
    out = run_json(capsys, "--csv", path, "-p", "2", "-m", "4", "--batch", "8", "--check",
                   "--width", "16", "--warmup", "0", "--repeat", "2")
    assert (out["ranks"], out["microbatches"], out["stages"]) == (2, 4, 4)
    assert out["closed_form_bubble"] is None  # the file is not a family
    # Every action of the file ran, on the rank the file puts it, in the file's order.
    ev = sorted(out["events"], key=lambda e: (e["rank"], e["start"]))
    for r, order in enumerate(sched.orders):
        got = [f"{e['stage']}{e['kind']}{e['microbatch']}" for e in ev if e["rank"] == r]
        assert got == [str(a) for a in order]
    assert out["grad_max_abs_diff"] < 1e-5 and out["loss_abs_diff"] < 1e-5
    assert len(out["step_times"]) == 2 and out["step_time"] == min(out["step_times"])


@pytest.mark.parametrize("extra, message", [
    (["-p", "3"], "the file has 2 rows (one per rank), but 3 ranks were asked for"),
    (["-m", "3"], "microbatch 3 out of range 0..2"),
    (["-m", "5"], "never runs forward 0F4"),
    (["-v", "2"], "--chunks does not apply with --csv"),
])
def test_csv_that_does_not_match_flags_is_one_line(capsys, auto_csv, extra, message):
    assert main(["run", "--local", "--csv", auto_csv[1], *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipebubble: error: ") and message in err


@pytest.mark.parametrize("text, message", [
    ("0F0,0B0\nxx\n", "row 2 (rank 1), column 1, cell 'xx'"),
    ("0F0,0B1\n", "backward of stage 0 for microbatch 1"),
    ("", "no actions"),
])
def test_bad_csv_is_one_line(capsys, tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert main(["run", "--local", "--csv", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipebubble: error: ") and message in err


def test_run_without_schedule_or_csv_is_one_line(capsys):
    assert main(["run", "--local", "-p", "2", "-m", "2"]) == 2
    assert "--schedule required (or --csv FILE)" in capsys.readouterr().err


def test_distributed_config_carries_the_csv_to_every_worker(auto_csv):
    """Each worker builds its schedule from the same DistConfig: with ``csv`` set it reads
    the file (the order as data), never a search that could come out differently."""
    from pipebubble.runtime.dist.worker import DistConfig, make_schedule_for

    sched, path = auto_csv
    cfg = DistConfig(schedule="auto", ranks=2, microbatches=4, csv=path)
    got = make_schedule_for(cfg)
    assert got.orders == sched.orders and got.stage_to_rank == sched.stage_to_rank
    with pytest.raises(ValueError, match="3 ranks were asked for"):
        make_schedule_for(DistConfig(schedule="auto", ranks=3, microbatches=4, csv=path))
