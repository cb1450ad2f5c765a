"""``run --save DIR`` / ``--resume DIR``: a torch.distributed.checkpoint of each rank's stages.

The one property: 3 steps, saved, resumed for 2 more give the losses of 5 uninterrupted steps
(float64: to the last digit JSON keeps), whatever cut or schedule the resumed run uses.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from pipebubble.cli import main
from pipebubble.runtime import checkpoint as ckpt

BASE = ["--width", "16", "--layers", "4", "--warmup", "0", "--dtype", "float64",
        "--optimizer", "adamw", "--lr", "0.01"]


def run_json(capsys, *args):
    assert main(["run", "--local", *args, *BASE, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_save_resume_equals_uninterrupted(capsys, tmp_path):
    d = tmp_path / "ck"
    full = run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "5")
    first = run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "3",
                     "--save", str(d))
    assert first["train"]["saved_to"] == str(d)
    meta = json.loads((d / ckpt.META).read_text())
    assert meta["steps_done"] == 3 and meta["optimizer"] == "adamw"
    # a different cut and schedule: 4 ranks of one layer each, split backward
    rest = run_json(capsys, "--schedule", "zb-h1", "-p", "4", "-m", "4", "--steps", "2",
                    "--resume", str(d), "--check")
    assert rest["train"]["first_step"] == 3
    assert first["losses"] + rest["losses"] == pytest.approx(full["losses"], abs=1e-10)
    # --check resumed the unsplit model from the same checkpoint
    assert rest["reference_losses"] == pytest.approx(full["losses"][3:], abs=1e-10)
    assert rest["param_max_abs_diff"] < 1e-12
    # and a V placement (4 stages on 2 ranks) from the same checkpoint
    v = run_json(capsys, "--schedule", "zbv", "-p", "2", "-m", "4", "--steps", "2",
                 "--resume", str(d))
    assert v["losses"] == pytest.approx(full["losses"][3:], abs=1e-10)


def test_keys_are_the_models_parameter_names(capsys, tmp_path):
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "ck"
    run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--save", str(d))
    keys = set(dcp.FileSystemReader(str(d)).read_metadata().state_dict_metadata)
    names = {f"layers.{i}.linear.{w}" for i in range(4) for w in ("weight", "bias")}
    want = {f"model.{n}" for n in names} | {f"optim.{n}.{k}" for n in names
                                            for k in ("step", "exp_avg", "exp_avg_sq")}
    assert keys == want
    assert sorted(os.listdir(d)) == [".metadata", "__0_0.distcp", ckpt.META]
    assert not (tmp_path / "ck.partial").exists()


def test_saving_over_a_checkpoint_replaces_it_and_a_failed_save_leaves_it(
        capsys, tmp_path, monkeypatch):
    d = tmp_path / "ck"
    run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--save", str(d))
    before = (d / ckpt.META).read_text()
    run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--steps", "2",
             "--resume", str(d), "--save", str(d), "--overwrite")
    assert json.loads((d / ckpt.META).read_text())["steps_done"] == 3
    mid = (d / ckpt.META).read_text()
    assert mid != before

    def boom(*a, **k):
        raise OSError("disk full")

    import torch.distributed.checkpoint as dcp

    monkeypatch.setattr(dcp, "save", boom)
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", *BASE,
                 "--resume", str(d), "--save", str(d), "--overwrite", "--json"]) == 1
    out, err = capsys.readouterr()
    # the run's figures are reported; the one error line says the save failed and why
    got = json.loads(out)
    assert len(got["losses"]) == 1 and got["train"]["saved_to"] is None
    assert "disk full" in got["train"]["save_error"]
    assert err.count("\n") == 1 and "writing the shards failed" in err and "disk full" in err
    assert (d / ckpt.META).read_text() == mid  # the old checkpoint is untouched
    assert ckpt.read_meta(str(d))["steps_done"] == 3


def test_atomic_json_write(tmp_path):
    p = tmp_path / "m.json"
    ckpt.write_json_atomic(p, {"a": 1})
    ckpt.write_json_atomic(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["m.json"]  # no temporary file left behind


@pytest.fixture
def saved(capsys, tmp_path):
    d = tmp_path / "ck"
    run_json(capsys, "--schedule", "1f1b", "-p", "2", "-m", "2", "--save", str(d))
    return d


@pytest.mark.parametrize("argv,needle", [
    (["--width", "32"], "belongs to another model ('mlp'): 'layers.0.linear.weight' has "
                        "shape [16, 16] there, [32, 32] here"),
    (["--layers", "6"], "it has no 'layers.4.linear.weight'"),
    (["--model", "transformer", "--layers", "2", "--vocab", "64", "--seq", "4"],
     "belongs to another model"),
    (["--optimizer", "sgd"], "was trained with --optimizer adamw, not sgd"),
    (["--seed", "7"], "--seed 0, not 7"),
])
def test_resume_into_another_model_is_refused(capsys, saved, argv, needle):
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", *BASE, *argv,
                 "--resume", str(saved)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith("pipebubble: error:")


def test_resume_from_what_is_not_a_checkpoint(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ckpt.META).write_text("{not json")
    (tmp_path / "file").write_text("x")
    for path, needle in ((tmp_path / "missing", "not a folder"),
                         (tmp_path / "file", "not a folder"),
                         (tmp_path / "empty", "not a pipebubble checkpoint"),
                         (tmp_path / "bad", "unreadable")):
        assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", *BASE,
                     "--resume", str(path)]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err


def test_save_into_a_folder_that_is_not_a_checkpoint(capsys, tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", *BASE,
                 "--save", str(d)]) == 2
    assert "not a pipebubble checkpoint" in capsys.readouterr().err
    assert os.listdir(d) == ["notes.txt"]  # nothing written
    assert not (tmp_path / "mine.partial").exists()


# ---- two ranks over gloo ------------------------------------------------------------------
def _dist(*args, timeout=170):
    return subprocess.run(
        [sys.executable, "-m", "pipebubble", "run", *args, *BASE, "--json"],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.distributed
def test_distributed_save_resume_equals_uninterrupted(tmp_path, capsys):
    d = tmp_path / "ck"
    first = _dist("--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "3", "--save", str(d))
    assert first.returncode == 0, first.stderr[-2000:]
    assert sorted(os.listdir(d)) == [".metadata", "__0_0.distcp", "__1_0.distcp", ckpt.META]
    rest = _dist("--schedule", "zbv", "-p", "2", "-m", "4", "--steps", "2", "--resume", str(d),
                 "--check")
    assert rest.returncode == 0, rest.stderr[-2000:]
    # five uninterrupted steps (one process: tests/test_train shows both executors agree)
    losses = json.loads(first.stdout)["losses"] + json.loads(rest.stdout)["losses"]
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "5",
                 *BASE, "--json"]) == 0
    full = json.loads(capsys.readouterr().out)["losses"]
    assert losses == pytest.approx(full, abs=1e-10)
    assert json.loads(rest.stdout)["param_max_abs_diff"] < 1e-12


@pytest.mark.distributed
def test_bad_resume_ends_every_torchrun_worker_with_one_line(tmp_path):
    """Under torchrun every worker checks the checkpoint before joining the group: each
    prints one line and exits 2 (none waits for the others)."""
    (tmp_path / "nope").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "pipebubble", "run", "--schedule", "1f1b", "-p", "2", "-m",
         "2", *BASE, "--resume", str(tmp_path / "nope")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RANK": str(g), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}) for g in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2
        lines = [ln for ln in err.splitlines() if ln.startswith("pipebubble: error:")]
        assert len(lines) == 1 and "not a pipebubble checkpoint" in lines[0], err


def test_launcher_refuses_bad_checkpoint_flags_before_any_worker(tmp_path, capsys):
    """Without --local the launcher checks --save/--resume before forking: one line, exit 2,
    nothing written (in this process: it fails before any worker would start)."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    for argv, needle in ((["--save", str(d)], "not a pipebubble checkpoint"),
                         (["--resume", str(d)], "no pipebubble.json"),
                         (["--steps", "0"], "--steps must be >= 1")):
        assert main(["run", "--schedule", "1f1b", "-p", "2", "-m", "2", *argv]) == 2
        captured = capsys.readouterr()
        assert needle in captured.err and captured.err.count("\n") == 1, captured.err
        assert captured.out == ""
    assert os.listdir(d) == ["notes.txt"] and sorted(os.listdir(tmp_path)) == ["mine"]
