"""``run --resume`` never runs code from the folder, every damaged checkpoint is one line,
``--save`` is checked before the first step, and a save is atomic (issue 31, item 1).

Each case starts from one real checkpoint (4 layers of width 16, AdamW, one step), copies
it, breaks one thing and checks the CLI's answer: exit 2, one line ``pipebubble: error:``
naming the file and what is wrong, no traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipebubble.cli import main
from pipebubble.runtime import checkpoint as ckpt

RUN = ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--width", "16",
       "--layers", "4", "--warmup", "0", "--dtype", "float64", "--optimizer", "adamw"]
SHARD = "__0_0.distcp"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("base") / "ck"
    assert main([*RUN, "--lr", "0.01", "--save", str(d), "--json"]) == 0
    assert sorted(os.listdir(d)) == [".metadata", SHARD, ckpt.META]
    return d


@pytest.fixture
def ck(base, tmp_path) -> Path:
    d = tmp_path / "ck"
    shutil.copytree(base, d)
    return d


def one_line(capsys, argv: list[str], code: int = 2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipebubble: error:"), err
    assert "Traceback" not in err
    return err


def resume_refused(capsys, d: Path, *needles: str) -> str:
    err = one_line(capsys, [*RUN, "--resume", str(d)])
    for n in needles:
        assert n in err, err
    return err


def edit_meta(d: Path, **fields) -> None:
    meta = json.loads((d / ckpt.META).read_text())
    meta.update(fields)
    (d / ckpt.META).write_text(json.dumps(meta))


def dcp_metadata(d: Path):
    with open(d / ".metadata", "rb") as fh:
        return pickle.load(fh)  # our own trusted file, read to build hostile variants


# ---- 1. no code from the folder ------------------------------------------------------------
class _OpenFile:
    """Unpickling this calls ``open(path, "w")``: it creates a file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _System:
    """Unpickling this runs a shell command (``os.system``)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("evil", [_OpenFile, _System], ids=["open", "os.system"])
def test_a_metadata_that_runs_code_is_refused_and_runs_nothing(capsys, ck, tmp_path, evil):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(evil(str(marker)))
    pickle.loads(payload)  # what DCP's own pickle.load would do: the file appears
    assert marker.exists()
    marker.unlink()
    (ck / ".metadata").write_bytes(payload)
    resume_refused(capsys, ck, str(ck / ".metadata"), "refused", "not DCP metadata",
                   "nothing in it was run")
    assert not marker.exists()


def test_a_metadata_that_sets_attributes_of_a_class_is_refused(capsys, ck):
    from torch.distributed.checkpoint.metadata import Metadata

    # GLOBAL Metadata; BUILD (None, {"evil": 1}): a plain unpickler does setattr(Metadata, ...)
    payload = (b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"
               b"N}X\x04\x00\x00\x00evilK\x01s\x86b.")
    (ck / ".metadata").write_bytes(payload)
    resume_refused(capsys, ck, "refused", "sets the state of a type")
    assert not hasattr(Metadata, "evil")


def test_an_index_pointing_outside_the_folder_is_refused(capsys, ck):
    md = dcp_metadata(ck)
    info = next(iter(md.storage_data.values()))
    info.relative_path = "../../etc/passwd"
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    resume_refused(capsys, ck, "'../../etc/passwd', not a shard file of this folder")


def test_a_key_stored_as_bytes_is_refused(capsys, ck):
    """DCP loads a BytesStorageMetadata entry with ``torch.load(weights_only=False)``: code
    in a shard would run. pipebubble saves tensors only, so such an index is refused."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = dcp_metadata(ck)
    md.state_dict_metadata["model.layers.0.linear.weight"] = BytesStorageMetadata()
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    resume_refused(capsys, ck, "'model.layers.0.linear.weight' is a BytesStorageMetadata, "
                   "not a tensor")


def test_dcp_never_unpickles_the_metadata_itself(capsys, ck, monkeypatch):
    """The load goes through the checked reader: with DCP's pickle.load disabled it still
    resumes, and the losses are those of the checkpoint's weights."""
    import torch.distributed.checkpoint.filesystem as fs

    def refuse(*a, **k):
        raise AssertionError("DCP's pickle.load was called")

    monkeypatch.setattr(fs.pickle, "load", refuse)
    assert main([*RUN, "--resume", str(ck), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["first_step"] == 1


def test_the_real_metadata_passes_the_allow_list(base):
    with open(base / ".metadata", "rb") as fh:
        plain = pickle.load(fh)
    assert ckpt.read_dcp_metadata(base) == plain


# ---- 2. every damaged checkpoint is one line -------------------------------------------------
def _truncate(p: Path, keep: float = 0.5) -> None:
    data = p.read_bytes()
    p.write_bytes(data[:int(len(data) * keep)])


def _zero(p: Path) -> None:
    p.write_bytes(bytes(p.stat().st_size))


def _flip_inside_a_record(p: Path, at: int | None = None) -> None:
    """Overwrite 40 bytes inside the first record (``at`` bytes in; by default its middle,
    the tensor's data): the zip frame stays. ``torch.load`` checks no CRC, so only the
    recorded SHA-256 sees a change to the data; at 70 bytes in, its pickle breaks."""
    md = dcp_metadata(p.parent)
    info = next(i for i in md.storage_data.values() if i.relative_path == p.name)
    data = bytearray(p.read_bytes())
    start = info.offset + (info.length // 2 if at is None else at)
    data[start:start + 40] = b"\xff" * 40
    p.write_bytes(bytes(data))


def _without_digests(d: Path) -> None:
    """As a checkpoint written before pipebubble.json recorded each file's SHA-256."""
    meta = json.loads((d / ckpt.META).read_text())
    del meta["files"]
    (d / ckpt.META).write_text(json.dumps(meta))


DAMAGE = {
    "metadata missing": (lambda d: (d / ".metadata").unlink(), [".metadata) is missing"]),
    "metadata empty": (lambda d: (d / ".metadata").write_bytes(b""), [".metadata is empty"]),
    "metadata garbage": (lambda d: (d / ".metadata").write_bytes(os.urandom(512)),
                         [".metadata is refused: not DCP metadata"]),
    "metadata truncated": (lambda d: _truncate(d / ".metadata"),
                           [".metadata is refused: not DCP metadata"]),
    "metadata a dict": (lambda d: (d / ".metadata").write_bytes(pickle.dumps({"a": 1})),
                        ["holds a dict, not DCP's Metadata"]),
    "metadata a FIFO": (lambda d: ((d / ".metadata").unlink(), os.mkfifo(d / ".metadata")),
                        ["not a regular file"]),
    "shard missing": (lambda d: (d / SHARD).unlink(), [f"shard {{d}}/{SHARD} is missing"]),
    "shard truncated": (lambda d: _truncate(d / SHARD),
                        [f"shard {{d}}/{SHARD} is truncated", "the index needs"]),
    "shard zeroed": (lambda d: _zero(d / SHARD),
                     [f"shard {{d}}/{SHARD} is damaged", "is not a saved tensor"]),
    "shard a folder": (lambda d: ((d / SHARD).unlink(), (d / SHARD).mkdir()),
                       ["is not a regular file"]),
    "shard corrupt inside": (lambda d: _flip_inside_a_record(d / SHARD),
                             [f"{{d}}/{SHARD} is damaged: its SHA-256 differs"]),
    "old checkpoint, a record's pickle corrupt": (
        lambda d: (_without_digests(d), _flip_inside_a_record(d / SHARD, at=70)),
        [f"shard {{d}}/{SHARD} is damaged: the record of 'model.layers.0.linear.weight' does "
         "not load"]),
    "digest of a shard missing": (
        lambda d: edit_meta(d, files={".metadata": json.loads(
            (d / ckpt.META).read_text())["files"][".metadata"]}),
        [f"records no digest of {SHARD}"]),
    "json empty": (lambda d: (d / ckpt.META).write_text(""), ["pipebubble.json", "damaged"]),
    "json garbage": (lambda d: (d / ckpt.META).write_text("{not json"),
                     ["pipebubble.json", "is unreadable (not valid JSON)"]),
    "json deep": (lambda d: (d / ckpt.META).write_text("[" * 100_000 + "]" * 100_000),
                  ["pipebubble.json", "nests 100000 levels deep"]),
    "json huge number": (lambda d: (d / ckpt.META).write_text(
        (d / ckpt.META).read_text().replace("\"steps_done\": 1", "\"steps_done\": 1" + "0" * 5000)),
                         ["pipebubble.json", "an integer with 5001 digits"]),
    "json a list": (lambda d: (d / ckpt.META).write_text("[1]"),
                    ["is not a pipebubble checkpoint's metadata"]),
    "losses not numbers": (lambda d: edit_meta(d, losses=["low"]),
                           ["has loss \"low\" at step 0; a loss is a number"]),
    "losses too few": (lambda d: edit_meta(d, losses=[]),
                       ["has losses []; it must list one loss per step done (1)"]),
    "steps_done -1": (lambda d: edit_meta(d, steps_done=-1, next_step=-1),
                      ["has steps_done -1; it must be an integer in 1..1000000000000"]),
    "steps_done true": (lambda d: edit_meta(d, steps_done=True),
                        ["has steps_done true; it must be an integer"]),
    "steps_done missing": (lambda d: edit_meta(d, steps_done=None),
                           ["has steps_done null"]),
    "seed negative": (lambda d: edit_meta(d, seed=-3), ["has seed -3; it must be an integer"]),
    "lr negative": (lambda d: edit_meta(d, lr=-1), ["has lr -1; it must be a number in 0..1000"]),
    "optimizer unknown": (lambda d: edit_meta(d, optimizer="lion"),
                          ["has optimizer \"lion\"; it must be one of sgd, adamw"]),
    "shape negative": (lambda d: edit_meta(d, parameters={
        **json.loads((d / ckpt.META).read_text())["parameters"],
        "layers.0.linear.bias": [-16]}),
        ["gives parameter 'layers.0.linear.bias' the shape [-16]"]),
    "version": (lambda d: edit_meta(d, version=99), ["checkpoint version 99"]),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_naming_the_file(capsys, ck, case):
    damage, needles = DAMAGE[case]
    damage(ck)
    resume_refused(capsys, ck, *(n.replace("{d}", str(ck)) for n in needles))


def test_index_and_pipebubble_json_must_agree(capsys, ck):
    md = dcp_metadata(ck)
    import torch

    md.state_dict_metadata["optim.layers.1.linear.weight.exp_avg"].size = torch.Size([8, 8])
    md.state_dict_metadata["optim.layers.1.linear.weight.exp_avg"].chunks[0].sizes = \
        torch.Size([8, 8])
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    resume_refused(capsys, ck, "gives 'optim.layers.1.linear.weight.exp_avg' shape [8, 8], "
                   "pipebubble.json [16, 16]")


def test_a_diverged_loss_is_saved_as_null_and_resumes(capsys, tmp_path):
    d = tmp_path / "ck"
    meta = ckpt.checkpoint_meta(model="m", description="", shapes={"w": (2,)}, steps_done=2,
                                seed=0, optimizer="sgd", lr=0.1, schedule="1f1b",
                                boundaries=[1], batch=2, losses=[1.0, float("nan")])
    assert meta["losses"] == [1.0, None]
    d.mkdir()
    ckpt.write_json_atomic(d / ckpt.META, {**meta, "format": ckpt.FORMAT, "version": 1})
    ckpt._check_fields(str(d), d / ckpt.META, json.loads((d / ckpt.META).read_text()))


def test_an_old_checkpoint_without_digests_still_resumes(capsys, ck):
    _without_digests(ck)
    assert main([*RUN, "--resume", str(ck), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["first_step"] == 1


def test_a_record_damaged_after_the_checks_is_still_one_line(capsys, ck):
    """The last resort: DCP's own read fails (here the folder changed after read_meta); the
    checked reader names the shard."""
    import torch

    meta = ckpt.read_meta(str(ck))
    _flip_inside_a_record(ck / SHARD, at=70)
    state = {"model.layers.0.linear.weight": torch.zeros(16, 16)}
    with pytest.raises(ckpt.CheckpointError, match=f"shard {ck / SHARD} is damaged"):
        ckpt.load(str(ck), state, no_dist=True)
    assert meta["steps_done"] == 1


def test_resume_empty_path_is_an_error(capsys):
    one_line(capsys, [*RUN, "--resume", ""])


# ---- 3. --save checked before the first step ---------------------------------------------
def save_refused(capsys, target: str, *needles: str, extra=()) -> None:
    err = one_line(capsys, [*RUN, "--save", target, *extra])
    for n in needles:
        assert n in err, err


def test_save_targets_refused_before_any_step(capsys, tmp_path, base, monkeypatch):
    from pipebubble.runtime.run import Run

    def no_training(*a, **k):
        raise AssertionError("training started before --save was checked")

    monkeypatch.setattr(Run, "train", no_training)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "p.partial").write_text("x")
    (tmp_path / "q.partial").mkdir()
    (tmp_path / "q.partial" / "notes.txt").write_text("mine")
    cases = [
        ("", "empty folder name"),
        (".", "not '.', '..' or '/'"),
        ("..", "not '.', '..' or '/'"),
        ("/", "not '.', '..' or '/'"),
        (str(tmp_path), "is the current folder"),
        ("/proc/pb-ck", "inside /proc, a kernel file system"),
        ("/sys/kernel/pb-ck", "inside /sys"),
        ("/dev/null", "inside /dev"),
        ("file", "exists and is not a folder"),
        ("link", "is a symbolic link"),
        ("p", "p.partial exists and is a file"),
        ("q", "q.partial is a folder that an interrupted save did not leave"),
        ("nope/ck", "the parent folder"),
        ("file/ck", "the parent folder"),
        ("x" * 250, "at most 247 fit this file system"),
        (str(base), "is a checkpoint already; add --overwrite"),
    ]
    for target, needle in cases:
        save_refused(capsys, target, needle)
    assert sorted(os.listdir(tmp_path)) == ["file", "link", "p.partial", "q.partial"]


def test_save_into_a_read_only_folder_is_refused_before_training(capsys, tmp_path,
                                                                 monkeypatch):
    """A folder where nothing can be created: a 0o555 one, or, as root (who writes there
    anyway), a read-only file system, simulated at the probe's mkdtemp (EROFS)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.geteuid() == 0:
            def read_only(*a, **k):
                raise OSError(30, "Read-only file system")

            monkeypatch.setattr(ckpt.tempfile, "mkdtemp", read_only)
            needle = "Read-only file system"
        else:
            needle = "Permission denied"
        save_refused(capsys, str(ro / "ck"), f"cannot create a folder in {ro} ({needle})")
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o755)


def test_overwrite_replaces_an_existing_checkpoint(capsys, ck):
    assert main([*RUN, "--resume", str(ck), "--save", str(ck), "--overwrite", "--json"]) == 0
    assert ckpt.read_meta(str(ck))["steps_done"] == 2
    assert sorted(os.listdir(ck.parent)) == ["ck"]  # no .partial or .old left


def test_resume_keeps_the_checkpoints_lr_and_warns_when_another_is_given(capsys, ck):
    """Without --lr the resumed run steps at the checkpoint's 0.01 (the losses of an
    uninterrupted run); with another --lr it runs, saying so in one warning line."""
    assert main([*RUN, "--lr", "0.01", "--steps", "2", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)["losses"]
    assert main([*RUN, "--resume", str(ck), "--json"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["train"]["lr"] == 0.01 and err == ""
    assert got["losses"] == pytest.approx(full[1:], abs=1e-12)
    assert main([*RUN, "--resume", str(ck), "--lr", "0.5", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["train"]["lr"] == 0.5
    assert err.count("\n") == 1 and err.startswith("pipebubble: warning:")
    assert "trained with --lr 0.01; this run steps with --lr 0.5" in err


# ---- 4. atomic saves -----------------------------------------------------------------------
def test_a_failed_publish_leaves_the_previous_checkpoint_and_reports_the_run(
        capsys, ck, monkeypatch):
    before = (ck / ckpt.META).read_text()

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "write_json_atomic", full)
    assert main([*RUN, "--resume", str(ck), "--save", str(ck), "--overwrite",
                 "--json"]) == 1
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert len(got["losses"]) == 1 and got["train"]["saved_to"] is None
    assert err.count("\n") == 1 and "cannot put the checkpoint in place (No space left" in err
    assert (ck / ckpt.META).read_text() == before
    monkeypatch.undo()
    assert main([*RUN, "--resume", str(ck), "--json"]) == 0  # and it still resumes


def test_a_shard_write_failing_inside_dcp_is_one_line_and_keeps_the_checkpoint(
        capsys, ck, monkeypatch):
    """A write error deep in DCP's writer reaches us wrapped in its CheckpointException (a
    BaseException): it is still one line with the cause, and the run's losses are kept."""
    import torch.distributed.checkpoint.filesystem as fs

    before = (ck / ckpt.META).read_text()

    def enospc(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs._FileSystemWriter, "write_data", enospc)
    assert main([*RUN, "--resume", str(ck), "--save", str(ck), "--overwrite",
                 "--json"]) == 1
    out, err = capsys.readouterr()
    assert len(json.loads(out)["losses"]) == 1
    assert err.count("\n") == 1
    assert "writing the shards failed (rank 0: No space left on device)" in err
    assert (ck / ckpt.META).read_text() == before


def test_recover_completes_a_swap_cut_between_its_renames(ck, base):
    """Where renameat2 is missing the swap is two renames; a crash between them leaves no
    DIR, the previous checkpoint at DIR.old and the new one whole at DIR.partial: the next
    --resume or --save puts the new one in place. A DIR.old alone (the user's own) stays."""
    old, partial = ck.with_name("ck.old"), ck.with_name("ck.partial")
    os.rename(ck, old)
    ckpt.recover(ck)
    assert not ck.exists() and old.exists()  # nothing to finish: untouched
    shutil.copytree(base, partial)
    edit_meta(partial, description="the new one")
    ckpt.recover(ck)
    assert json.loads((ck / ckpt.META).read_text())["description"] == "the new one"
    assert not old.exists() and not partial.exists()


def test_save_without_renameat2_is_still_whole(capsys, ck, monkeypatch):
    monkeypatch.setattr(ckpt, "_exchange", lambda a, b: False)
    assert main([*RUN, "--resume", str(ck), "--save", str(ck), "--overwrite", "--json"]) == 0
    assert ckpt.read_meta(str(ck))["steps_done"] == 2
    assert sorted(os.listdir(ck.parent)) == ["ck"]


TRIALS = 20


@pytest.mark.slow
def test_sigkill_during_saving_never_loses_the_last_checkpoint(tmp_path):
    """20 training runs with ``--resume DIR --save DIR --overwrite``, each killed with
    SIGKILL at a random moment of its save (uniform over a save's measured duration, from
    the moment the child says its save began):
    after every kill ``DIR`` is a whole checkpoint that resumes, with the previous step
    count or the next one."""
    proc = subprocess.run([sys.executable, __file__, str(tmp_path / "ck"), str(TRIALS)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["trials"] == TRIALS and result["lost"] == 0, result
    assert result["killed_mid_save"] >= TRIALS // 2, result  # the kills did land in saves
    assert result["kept_previous"] + result["new_one_in_place"] == TRIALS


def _child(argv: list[str], signal_fd: int | None = None) -> int:
    """Fork a pipebubble run (this process has already run one: the child starts warm).
    With ``signal_fd`` the child writes ``S`` there when its save starts and ``E`` when it
    returns (the test's own hook around ``checkpoint.save``; the code saving is unchanged)."""
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        if signal_fd is not None:
            real = ckpt.save

            def traced(*a, **k):
                os.write(signal_fd, b"S")
                try:
                    return real(*a, **k)
                finally:
                    os.write(signal_fd, b"E")

            ckpt.save = traced
        try:
            code = main(argv)
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    if signal_fd is not None:
        os.close(signal_fd)
    return pid


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _saving(argv: list[str]) -> tuple[int, int]:
    """Start a run whose save signals; return (pid, read end) once its save has begun."""
    r, w = os.pipe()
    pid = _child(argv, w)
    if os.read(r, 1) != b"S":
        raise AssertionError("the run ended before saving")
    return pid, r


def _sigkill_trials(d: Path, trials: int) -> dict:
    """The body of the SIGKILL test, in a fresh process that forks each run."""
    import torch

    torch.set_num_threads(1)  # before any torch work: forked children inherit no pool
    argv = [*RUN, "--lr", "0.01", "--repeat", "1"]
    warm = d.with_name("warm")  # one run here first: every child then starts warm
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        assert main([*argv, "--save", str(warm)]) == 0
    assert _wait(_child([*argv, "--save", str(d)])) == 0
    again = [*argv, "--resume", str(d), "--save", str(d), "--overwrite"]
    pid, r = _saving(again)  # how long a save takes (the kills fall inside it)
    t0 = time.perf_counter()
    assert os.read(r, 1) == b"E"
    span = time.perf_counter() - t0
    os.close(r)
    assert _wait(pid) == 0
    steps = ckpt.read_meta(str(d))["steps_done"]
    rng = random.Random(31)
    lost = killed = kept = advanced = 0
    for _ in range(trials):
        pid, r = _saving(again)
        time.sleep(rng.uniform(0, span))
        os.kill(pid, signal.SIGKILL)
        _wait(pid)
        os.set_blocking(r, False)
        try:
            finished = b"E" in os.read(r, 8)
        except BlockingIOError:
            finished = False
        os.close(r)
        try:
            now = ckpt.read_meta(str(d))["steps_done"]
            ok = now in (steps, steps + 1) and _wait(_child([*argv, "--resume", str(d)])) == 0
        except Exception:  # noqa: BLE001
            ok, now = False, None
        killed += not finished
        kept += now == steps
        advanced += now == steps + 1
        lost += not ok
        steps = now if now is not None else steps
    return {"trials": trials, "lost": lost, "killed_mid_save": killed,
            "kept_previous": kept, "new_one_in_place": advanced,
            "save_span_s": round(span, 3)}


if __name__ == "__main__":  # the SIGKILL test's worker: python this_file DIR TRIALS
    print(json.dumps(_sigkill_trials(Path(sys.argv[1]), int(sys.argv[2]))))
