"""Generated fuzz cases for every subcommand, and a runner that isolates each one.

The cases are not a list of yesterday's findings: they are drawn, with a fixed seed, from
the argparse parser that ``pipebubble.cli.build_parser`` builds, so a new command or flag
is fuzzed the day it is added:

- each case starts from the command's smallest valid command line (:data:`BASES`; a new
  command without one fails ``test_every_command_has_a_base``), then sets one or two of its
  flags (any flag argparse knows, required ones included) to a hostile value;
- a flag with ``choices`` draws from its choices and from wrong names; a flag that names a
  file (its metavar says FILE, OUT or LIST of files, or it is an output flag) draws from
  hostile paths and hostile files (binary junk, deeply nested JSON, a marker-only CSV, NaN
  in JSON, a FIFO, a directory, /dev/full, ...) as well as from the numbers; every other
  flag draws from hostile numbers and text (empty, negative, zero, 10**400, 1e308, nan,
  inf, non-ASCII digits, emoji, a 10,000-character word);
- a store-true flag is sometimes added on top.

:func:`run_case` runs a case through ``pipebubble.cli.main`` in a forked child of the test
process (modules already imported, so a case costs milliseconds, not an interpreter start)
under a memory cap and a time limit, and reports the exit code, stderr and whether it was
killed. A case may write files only in its own temporary directory.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

BIG_DIGITS = "1" + "0" * 400  # 10**400
HUGE_DIGITS = "9" * 4400  # over Python's int-conversion limit
NUMBERS = [
    "", " ", "0", "-0", "-1", "1", "2", "3", "-7", BIG_DIGITS, "-" + BIG_DIGITS, HUGE_DIGITS,
    "99999999999999999", "4294967296", "1e308", "-1e308", "1e-308", "5e-324", "nan", "-nan",
    "inf", "-inf", "Infinity", "0.5", "1.5", "-0.5", "1e3", "0x10", "1_000", "+3", "٣",
    "１２", "½", "💥", "1,2", "1,,2", ",", "1,2,3,4,5,6,7,8", "1..4", "4..1", "1..", "0..0",
    "1..1000000000", "a" * 10_000, "-", "--", "all", "auto", "none", "é", "\u202e1",
]
PATHS = [
    "", "/dev/full", "/dev/null", "/dev/zero", "{d}", "{d}/", "{d}/missing.json",
    "{d}/nodir/x.json", "{d}/newdir/", "{d}/" + "a" * 300 + ".json", "{d}/junk.bin",
    "{d}/deep.json", "{d}/markers.csv", "{d}/empty", "{d}/fifo", "{d}/nan.json",
    "{d}/bignum.json", "{d}/list.json", "{d}/latin1.csv", "{d}/prof.json", "{d}/tl.json",
    "{d}/ok.csv", "{d}/out.png", "{d}/out.svg", "{d}/out.json", "{d}/out.csv",
    "{d}/prof.json/x", "-",
]
NAMES = ["", "nope", "NOPE", "auto", "GPIPE", "1f1b,", ",", "💥", "a" * 10_000, "gpipe,,1f1b"]

# The smallest valid command line of each command: cheap (milliseconds to a second),
# nothing launched. {d} is the case's directory, holding the files of make_files().
BASES: dict[str, list[str]] = {
    "simulate": ["simulate", "--schedule", "1f1b", "-p", "2", "-m", "2"],
    "compare": ["compare", "-p", "2", "-m", "4"],
    "sweep": ["sweep", "-p", "2", "-m", "1..4"],
    "export": ["export", "--schedule", "1f1b", "-p", "2", "-m", "2", "--csv", "-"],
    "wire": ["wire", "--schedule", "1f1b", "-p", "2", "-m", "2"],
    "partition": ["partition", "--profile", "{d}/prof.json", "--ranks", "2"],
    "plan": ["plan", "--profile", "{d}/prof.json", "--gpus", "2", "--global-batch", "8"],
    "run": ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "4",
            "--width", "8", "--warmup", "0", "--repeat", "1"],
    "profile": ["profile", "--model", "mlp", "--layers", "2", "--width", "8", "--warmup",
                "0", "--repeats", "1"],
    "demo": ["demo", "--stages", "2", "-m", "2"],
    "explore": ["explore", "--port", "0", "--no-browser"],
    # no checkpoint in {d}: every case is refused (one line); tests/test_export_hf.py exports
    "export-hf": ["export-hf", "{d}/ckpt", "{d}/hf-out"],
}

# Flags whose valid values launch processes or runs: fuzzed only with values that cannot
# be valid (a case must stay in its own process and within its time).
LAUNCHING = {("plan", "--validate"), ("run", "--local")}


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return self.argv[0]

    def id(self) -> str:
        shown = [a if len(a) <= 24 else a[:10] + f"…({len(a)})" for a in self.argv]
        return " ".join(shown)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from pipebubble.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flag(action: argparse.Action) -> str:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return (longs or action.option_strings)[0]


def _is_path(action: argparse.Action) -> bool:
    from pipebubble.commands.common import OUTPUT_FLAGS

    metavar = str(action.metavar or "")
    return ("FILE" in metavar or metavar == "OUT" or action.dest in OUTPUT_FLAGS
            or action.dest in ("csv", "profile", "measured"))


def _values(action: argparse.Action, rng: random.Random) -> str:
    if action.choices is not None:
        pool = [*map(str, action.choices), *NAMES]
    elif _is_path(action):
        pool = PATHS + rng.sample(NUMBERS, 4)
    elif action.dest in ("schedule", "schedules", "method", "model", "recompute", "device",
                         "dtype", "host", "inject_fault", "current_cut", "boundaries"):
        pool = NAMES + NUMBERS
    else:
        pool = NUMBERS
    return rng.choice(pool)


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replacing the base's value), written
    ``--flag=value`` so that a value such as ``-inf`` is not read as a flag."""
    out, skip = [], False
    aliases = {flag}
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in aliases and i + 1 < len(argv):
            skip = True
            continue
        out.append(a)
    return [*out, f"{flag}={value}"]


def generate(n: int, seed: int) -> list[Case]:
    """``n`` cases drawn with ``seed``: commands in proportion to their flags."""
    rng = random.Random(seed)
    commands = subcommands()
    flags: dict[str, list[argparse.Action]] = {}
    for name, parser in commands.items():
        flags[name] = [a for a in parser._actions if a.option_strings
                       and not isinstance(a, argparse._HelpAction)]
    weighted = [name for name in commands for _ in flags[name]]
    cases: list[Case] = []
    seen: set[tuple[str, ...]] = set()
    tries = 0
    while len(cases) < n and tries < 50 * n:
        tries += 1
        name = rng.choice(weighted)
        aliases = {}
        argv = list(BASES.get(name, [name]))
        for action in rng.sample(flags[name], min(len(flags[name]), rng.choice((1, 1, 1, 2)))):
            flag = _flag(action)
            for alias in action.option_strings:  # the base may spell it -p
                aliases[alias] = flag
            argv = [aliases.get(a, a) for a in argv]
            if action.nargs == 0:  # store_true: add it
                if (name, flag) in LAUNCHING or flag in argv:
                    continue
                argv.append(flag)
                continue
            value = _values(action, rng)
            if (name, flag) in LAUNCHING and value.strip().isdigit() and 0 < int(
                    value if len(value) < 4000 else "0") < 10**6:
                continue
            argv = _set(argv, flag, value)
        case = tuple(argv)
        if case not in seen:
            seen.add(case)
            cases.append(Case(case))
    return cases


def make_files(d: str) -> None:
    """The hostile (and a few good) input files every case's directory holds."""
    def write(name: str, data: str | bytes) -> None:
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(os.path.join(d, name), mode) as f:
            f.write(data)

    write("junk.bin", bytes(range(256)) * 64)
    write("deep.json", "[" * 100_000 + "]" * 100_000)
    write("markers.csv", "0UNSHARD,0RESHARD\n1UNSHARD,1REDUCE_GRAD\n")
    write("empty", "")
    write("list.json", "[1, 2, 3]")
    write("latin1.csv", b"0F\xe90\n")
    write("ok.csv", "0F0,0F1,1B0,1B1\n")  # not a valid schedule either: B before its F
    layer = ('{"name": "l%d", "forward": %s, "backward": 0.002, "params": 1000, '
             '"activation_bytes": 4096, "flops": 1000000}')
    def profile(*layers: str) -> str:
        return '{"layers": [' + ", ".join(layers) + "]}"

    write("prof.json", profile(*(layer % (i, "0.001") for i in range(4))))
    write("nan.json", profile(layer % (0, "NaN")))
    write("bignum.json", profile(layer % (0, "1e308")))
    ev = '{"rank": %d, "stage": %d, "kind": "%s", "microbatch": 0, "start": %d, "end": %d}'
    events = [ev % (0, 0, "F", 0, 1), ev % (1, 1, "F", 1, 2), ev % (1, 1, "B", 2, 4),
              ev % (0, 0, "B", 4, 6)]
    write("tl.json", '{"ranks": 2, "stages": 2, "microbatches": 1, "events": ['
          + ", ".join(events) + "]}")
    os.mkfifo(os.path.join(d, "fifo"))


@dataclass
class Result:
    rc: int | None  # None: killed (time or memory)
    err: str
    seconds: float
    how: str = ""  # "timeout" when killed for time


def _child(argv: list[str], err_path: str, mem_bytes: int) -> None:  # pragma: no cover
    """In the forked child: cap memory, send stdout to /dev/null, stderr to a file, run."""
    rc = 99
    try:
        soft = _vm_size() + mem_bytes
        resource.setrlimit(resource.RLIMIT_AS, (soft, soft))
        out = os.open(os.devnull, os.O_WRONLY)
        err = os.open(err_path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.environ.pop("RANK", None)  # never act as a worker
        from http.server import HTTPServer

        def stop(self, poll_interval=0.5):  # explore: serve, then Ctrl-C at once
            raise KeyboardInterrupt

        HTTPServer.serve_forever = stop  # type: ignore[method-assign]
        import webbrowser

        webbrowser.open = lambda *a, **k: True  # type: ignore[assignment]
        from pipebubble.cli import main

        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # a bug: its traceback is what the test shows
        traceback.print_exc()
        rc = 98
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: S110  (stdout on /dev/full)
            pass
        os._exit(rc if isinstance(rc, int) and 0 <= rc < 256 else 97)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_case(case: Case, timeout: float = 30.0, mem_bytes: int = 2 << 30) -> Result:
    """Run ``case`` in a forked child in a fresh directory (its ``{d}``); kill it after
    ``timeout`` seconds. ``mem_bytes``: address space it may add to what it inherits."""
    with tempfile.TemporaryDirectory(prefix="pbfuzz") as d:
        make_files(d)
        argv = [a.replace("{d}", d) for a in case.argv]
        err_path = os.path.join(d, ".stderr")
        open(err_path, "w").close()
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            os.chdir(d)
            _child(argv, err_path, mem_bytes)
        rc: int | None = None
        how = ""
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - started > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                how = "timeout"
                break
            time.sleep(0.005)
        seconds = time.monotonic() - started
        with open(err_path, errors="replace") as f:
            err = f.read().replace(d, "{d}")
    return Result(rc, err, seconds, how)
