"""Every write is atomic (files.open_output): a temporary file beside the target, renamed
into place only once complete; and the one JSON serialiser refuses NaN and Infinity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipebubble.cli import main
from pipebubble.files import FileError, json_text, open_output, write_bytes, write_text


def test_a_failing_write_over_an_existing_file_keeps_its_old_content(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old content\n")
    with pytest.raises(RuntimeError):
        with open_output(target) as f:
            f.write("new, half")
            f.flush()
            raise RuntimeError("the writer failed mid-way")
    assert target.read_text() == "old content\n"
    assert os.listdir(tmp_path) == ["out.json"]  # the temporary file is gone too


def test_a_full_disk_mid_write_keeps_the_old_file(tmp_path, monkeypatch):
    """ENOSPC from fsync (what a full disk gives on a delayed write) is one FileError, and
    the old file stays."""
    import errno

    target = tmp_path / "trace.json"
    target.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(FileError, match=r"cannot write --trace .*no space left"):
        write_text(target, "x" * 10_000, "--trace")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["trace.json"]


def test_dev_full_and_dev_null_are_written_in_place():
    with pytest.raises(FileError, match="no space left"):
        write_bytes("/dev/full", b"x" * 100, "--png")
    write_text("/dev/null", "fine")  # a device is not replaced by a regular file
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_a_write_keeps_permissions_and_follows_a_symlink(tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert (real.stat().st_mode & 0o777) == 0o640


def test_a_new_file_gets_the_umask_mode(tmp_path):
    mask = os.umask(0o027)
    try:
        write_text(tmp_path / "new.txt", "x")
    finally:
        os.umask(mask)
    assert (os.stat(tmp_path / "new.txt").st_mode & 0o777) == 0o640


_SLOW_WRITER = """
import sys, time
from pipebubble.files import open_output
with open_output(sys.argv[1], "--trace") as f:
    f.write("partial")
    f.flush()
    print("writing", flush=True)
    time.sleep(60)
    f.write("rest")
"""


@pytest.mark.parametrize("existed", [False, True])
def test_a_write_killed_mid_way_leaves_no_partial_file(tmp_path, existed):
    target = tmp_path / "trace.json"
    if existed:
        target.write_text("old")
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(target)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stdout.close()
    if existed:
        assert target.read_text() == "old"
    else:
        assert not target.exists()
    # all that may remain is the hidden temporary file beside it, never under the final name
    assert all(n == "trace.json" or (n.startswith(".trace.json.") and n.endswith(".tmp"))
               for n in os.listdir(tmp_path))


def test_cli_output_written_whole_and_old_file_kept_on_error(tmp_path):
    out = tmp_path / "t.json"
    out.write_text("old")
    assert main(["simulate", "--schedule", "1f1b", "-p", "2", "-m", "2", "--trace",
                 str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]
    before = out.read_text()
    time.sleep(0)  # nothing else may touch it: a refused run leaves the file as it was
    assert main(["simulate", "--schedule", "nosuch", "-p", "2", "-m", "2", "--trace",
                 str(out)]) == 2
    assert out.read_text() == before


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_json_text_refuses_non_finite_numbers_naming_where(bad):
    with pytest.raises(FileError) as info:
        json_text({"plans": [{"ok": 1.0}, {"step_time": bad}]}, "--json")
    msg = str(info.value)
    assert msg.startswith("--json: plans[1].step_time is ") and "not a finite number" in msg
    assert json.loads(json_text({"a": [1.5, 2]})) == {"a": [1.5, 2]}


def test_a_fifo_nobody_reads_is_refused_at_once_and_one_that_is_read_gets_the_bytes(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(FileError, match="FIFO that no process reads"):
        write_text(fifo, "never\n", "--out")
    assert time.monotonic() - t0 < 5  # refused, not blocked until a reader comes
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:  # cat opens its end soon after it starts
            try:
                write_text(fifo, "through the pipe\n", "--out")
                break
            except FileError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        out, _ = reader.communicate(timeout=10)
    finally:
        reader.kill()
    assert out == "through the pipe\n"
