"""The commands that run no tensors load neither torch nor matplotlib.

Each case runs in a fresh interpreter (a module imported by another test would hide an
import), calls ``pipebubble.cli.main`` with the command line and prints the heavy packages
found in ``sys.modules`` afterwards. torch takes seconds to import; ``pipebubble simulate
--json`` must not pay for it (issue 10, part 1).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "matplotlib")

RUNNER = """
import contextlib, io, json, sys
from pipebubble.cli import main
argv = json.loads(sys.argv[1])
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        rc = main(argv)
except SystemExit as exc:
    rc = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps({"rc": rc, "heavy": heavy}))
"""


def loaded_after(argv: list[str] | None) -> dict:
    """Run ``main(argv)`` (or only ``import pipebubble`` when None) in a fresh process."""
    if argv is None:
        code = ("import sys, json, pipebubble; print(json.dumps({'rc': 0, 'heavy': sorted("
                "{m.split('.')[0] for m in sys.modules} & set(json.loads(sys.argv[2])))}))")
        args = [sys.executable, "-c", code, "[]", json.dumps(HEAVY)]
    else:
        args = [sys.executable, "-c", RUNNER, json.dumps(argv), json.dumps(HEAVY)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    """A hand-written layer profile: partition reads it without measuring anything."""
    path = tmp_path_factory.mktemp("prof") / "profile.json"
    layers = [{"name": str(i), "forward": 1.0, "backward": 2.0, "params": 10,
               "activation_bytes": 4.0, "flops": 0.0} for i in range(8)]
    path.write_text(json.dumps({"device": "test", "layers": layers}))
    return str(path)


def test_import_pipebubble_loads_no_torch():
    assert loaded_after(None)["heavy"] == []


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["simulate", "--schedule", "1f1b", "-p", "4", "-m", "8", "--json"],
    ["simulate", "--schedule", "zbv", "-p", "2", "-m", "4"],
    ["compare", "-p", "4", "-m", "8"],
    ["sweep", "-p", "2", "-m", "2..4", "--schedules", "gpipe,1f1b"],
    ["wire", "--schedule", "1f1b", "-p", "2", "-m", "2"],
    ["run", "--help"],
], ids=lambda a: " ".join(a[:2]))
def test_command_loads_no_torch_nor_matplotlib(argv):
    got = loaded_after(argv)
    assert got["rc"] == 0
    assert got["heavy"] == []


def test_export_loads_no_torch(tmp_path):
    out = tmp_path / "s.csv"
    got = loaded_after(["export", "--schedule", "zb-h1", "-p", "2", "-m", "4", "--csv", str(out)])
    assert got == {"rc": 0, "heavy": []}
    assert out.read_text().splitlines()[0].split(",")[0] == "0F0"


def test_partition_from_a_profile_file_loads_no_torch(profile_file):
    got = loaded_after(["partition", "--profile", profile_file, "--ranks", "2", "--json"])
    assert got == {"rc": 0, "heavy": []}


def test_png_does_load_matplotlib(tmp_path):
    """The check above can fail: asking for a figure does load matplotlib."""
    got = loaded_after(["simulate", "--schedule", "1f1b", "-p", "2", "-m", "2", "--json",
                        "--png", str(tmp_path / "g.png")])
    assert got["rc"] == 0 and "matplotlib" in got["heavy"]
