"""How long does the ``pipebubble`` command take, start to finish, in a fresh process?

Each command line runs several times; we print the best wall-clock time (on a shared machine
the least disturbed run) and the CPU time of the child process (user + system), next to the
same figures for a bare ``python -c pass`` (the interpreter's own start-up, which no command
can beat) and ``python -c 'import numpy'`` (the timeline's metrics need numpy), measured in
this run.

Targets (issue 10): ``simulate --schedule 1f1b -p 4 -m 8 --json`` < 0.3 s; the 1M-action
``simulate --schedule 1f1b -p 64 -m 8192`` < 2 s with its terminal chart, < 4 s with --json.

Run: ``.venv/bin/python bench/bench_cli.py``. Prints; asserts nothing.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

CASES = [
    ("python -c pass (baseline)", [sys.executable, "-c", "pass"], None, 10),
    ("python -c 'import numpy' (baseline)", [sys.executable, "-c", "import numpy"], None, 10),
    ("--help", ["--help"], None, 10),
    ("simulate 1f1b -p 4 -m 8 --json", ["simulate", "--schedule", "1f1b", "-p", "4", "-m", "8",
                                        "--json"], 0.3, 10),
    ("simulate 1f1b -p 64 -m 8192", ["simulate", "--schedule", "1f1b", "-p", "64", "-m",
                                     "8192", "--width", "100"], 2.0, 3),
    ("simulate 1f1b -p 64 -m 8192 --json", ["simulate", "--schedule", "1f1b", "-p", "64",
                                            "-m", "8192", "--json"], 4.0, 3),
]


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run, output discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True,
                   env={**os.environ, "COLUMNS": "120"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    cli = [sys.executable, "-m", "pipebubble"]
    for label, argv, target, repeats in CASES:
        full = argv if argv[0] == sys.executable else cli + argv
        wall, cpu = min(timed(full) for _ in range(repeats))
        goal = f"  target < {target} s" if target else ""
        print(f"{label:38s} best of {repeats:2d}: {wall:6.3f} s wall, {cpu:6.3f} s CPU{goal}")


if __name__ == "__main__":
    main()
