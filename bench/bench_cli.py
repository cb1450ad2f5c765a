"""How long does the ``pipebubble`` command take, start to finish, in a fresh process?

Each command line runs several times; we print the best wall-clock time (on a shared machine
the least disturbed run) and the CPU time of the child process (user + system), next to the
same figures for a bare ``python -c pass`` (the interpreter's own start-up, which no command
can beat) and ``python -c 'import numpy'`` (the timeline's metrics need numpy), measured in
this run.

Targets (issue 10): ``simulate --schedule 1f1b -p 4 -m 8 --json`` < 0.3 s; the 1M-action
``simulate --schedule 1f1b -p 64 -m 8192`` < 2 s with its terminal chart, < 4 s with --json.

Throughput through the command line (issue 30): ``simulate`` with its terminal chart on about
a million actions, less the same command on the fewest microbatches the family takes (which
leaves out the interpreter's start-up and the imports): (actions - actions at the few) /
(CPU time - CPU time at the few), each the best of a few fresh processes. Cases: 1F1B p=64
m=8192 against m=1, DualPipe p=64 m=8192 and DualPipeV p=64 m=4096 (its -v 2 doubles the
stages: about a million actions) against m=128 (both need m >= 2p). Beside it the library's
validate + simulate of the same schedule in this process (``bench/bench_simulate.py``'s
measure: a fresh copy each repeat, best CPU time of 5) and the ratio of the two: the command
adds generation, its metrics and the chart, and pays a fresh process's first touch of its
memory. Target >= 3 M actions/s through the command line for each.

Run: ``.venv/bin/python bench/bench_cli.py`` (``throughput``: only the throughput rows).
Prints; asserts nothing.
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


THROUGHPUT = (("1f1b", 64, 8192, 1), ("dualpipe", 64, 8192, 128), ("dualpipev", 64, 4096, 128))


def library_cpu(name: str, p: int, m: int, repeats: int = 5) -> float:
    """Best CPU seconds of validate + simulate of a fresh copy of the schedule (in this
    process: bench_simulate.py's measure)."""
    from dataclasses import replace

    from pipebubble import CostModel, get_schedule, simulate, validate
    from pipebubble.sim import kernel

    schedule = get_schedule(name, p, m)
    best = float("inf")
    for _ in range(repeats):
        fresh = replace(schedule)  # validated again (validate() remembers the last one)
        kernel.KEPT.cache_clear()  # and simulated again (simulate() keeps large results)
        t = time.process_time()
        validate(fresh)
        simulate(fresh, CostModel())
        best = min(best, time.process_time() - t)
    return best


def throughput(repeats: int = 5) -> None:
    from pipebubble import get_schedule

    cli = [sys.executable, "-m", "pipebubble", "simulate", "--width", "100"]
    print("simulate through the command line, actions per CPU second (issue 30):")
    for name, p, m, few in THROUGHPUT:
        n = get_schedule(name, p, m).num_actions()
        n_few = get_schedule(name, p, few).num_actions()
        cpu = {}
        for _ in range(repeats):  # interleaved: a disturbance hits both sizes alike
            for size in (m, few):
                got = timed(cli + ["--schedule", name, "-p", str(p), "-m", str(size)])[1]
                cpu[size] = min(cpu.get(size, float("inf")), got)
        rate = (n - n_few) / (cpu[m] - cpu[few])
        lib = n / library_cpu(name, p, m)
        print(f"   {name:9s} p={p} m={m:<5d} ({n:,} actions) less m={few:<3d}: "
              f"{cpu[m]:.3f} - {cpu[few]:.3f} s CPU = {rate / 1e6:.2f} M actions/s; library "
              f"validate + simulate {lib / 1e6:.2f} M/s; command / library "
              f"{rate / lib:.2f}  target >= 3.00 M/s")


def main() -> None:
    cli = [sys.executable, "-m", "pipebubble"]
    for label, argv, target, repeats in CASES:
        full = argv if argv[0] == sys.executable else cli + argv
        wall, cpu = min(timed(full) for _ in range(repeats))
        goal = f"  target < {target} s" if target else ""
        print(f"{label:38s} best of {repeats:2d}: {wall:6.3f} s wall, {cpu:6.3f} s CPU{goal}")
    throughput()


if __name__ == "__main__":
    if sys.argv[1:] == ["throughput"]:
        throughput()
    else:
        main()
