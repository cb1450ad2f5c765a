"""The ``pipebubble`` command line.

Each subcommand lives in ``pipebubble/commands/<name>.py`` and exposes
``register(subparsers)``; this module discovers them, so adding a command touches no other
file. User mistakes print one line ``pipebubble: error: ...`` and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import pkgutil
import sys

from . import commands
from .files import flush_stdout, stdout_failed
from .ir.schedule import ScheduleError


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        sys.stderr.write(f"pipebubble: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipebubble",
        description="Plan, simulate, draw and run pipeline-parallel training schedules.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = int(args.func(args) or 0)
        flush_stdout()  # a full disk on stdout: one line, not "Exception ignored" at exit
        return rc
    except (UsageError, ScheduleError, ValueError, FileNotFoundError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        sys.stderr.write(f"pipebubble: error: {msg}\n")
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # writing stdout failed mid-run (e.g. > /dev/full)
        if exc.errno not in (errno.ENOSPC, errno.EIO):
            raise
        sys.stderr.write(f"pipebubble: error: {stdout_failed(exc)}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
