"""The ``pipebubble`` command line.

Each subcommand lives in ``pipebubble/commands/<name>.py`` and exposes
``register(subparsers)``; this module discovers them, so adding a command touches no other
file.

User mistakes print one line ``pipebubble: error: ...`` and exit 2, no traceback. A user
mistake is exactly: a :class:`~pipebubble.errors.UserError` (``ScheduleError``,
``ProfileError``, ``PartitionError`` and ``Deadlock`` derive from it), an argparse error, or a
file the user named that is missing, a directory, or unreadable. Any other exception is a bug
and propagates with its traceback (in tests: a failure, never a silent exit 2)::

    >>> main(["--version"])
    pipebubble 0.1.0
    0
"""

from __future__ import annotations

import argparse
import errno
import importlib
import pkgutil
import sys

from . import __version__, commands
from .commands._flags import render
from .errors import UserError
from .files import flush_stdout, stdout_failed
from .libwarnings import held

# What counts as the user's mistake (exit 2). Not ValueError, KeyError or TypeError: those
# are bugs unless library code wrapped them in a UserError that names the bad value.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    FileNotFoundError,
    IsADirectoryError,
    PermissionError,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        sys.stderr.write(f"pipebubble: error: {message}\n")
        raise SystemExit(2)

    def _print_message(self, message: str, file=None) -> None:
        """argparse drops an OSError here, so ``--help > /dev/full`` would exit 0: a failed
        write to standard output is an error (a closed pipe, ``| head``, stays quiet)."""
        if not message:
            return
        file = file or sys.stderr
        try:
            file.write(message)
        except BrokenPipeError:
            pass
        except OSError as exc:
            if file is sys.stdout:
                raise stdout_failed(exc) from None

    def _get_values(self, action: argparse.Action, arg_strings: list[str]):  # noqa: ANN202
        # Python 3.11's argparse drops a value that is exactly "--" (``-m=--``) and hands
        # the flag an empty list past its type check; the value is the text "--" instead.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per module in ``pipebubble.commands``."""
    parser = _Parser(
        prog="pipebubble",
        description="Plan, simulate, draw and run pipeline-parallel training schedules.",
    )
    parser.add_argument("--version", action="version", version=f"pipebubble {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def error_line(exc: BaseException) -> str:
    """The one line printed for a user error: its message's first line, or its type's name.
    Parameter names the library marked in it are written as their flags
    (:mod:`pipebubble.commands._flags`).

    >>> from pipebubble.errors import ParamError, param
    >>> error_line(ParamError(f"{param('microbatches')} must be >= 1, got 0\\nmore detail"))
    '--microbatches must be >= 1, got 0'
    >>> error_line(FileNotFoundError(2, "No such file or directory", "x.csv"))
    "No such file or directory: 'x.csv'"
    """
    text = render(exc) if isinstance(exc, UserError) else str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror + (f": {exc.filename!r}" if exc.filename is not None else "")
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (0 success, 2 bad input).

    ``--help`` and ``--version`` return 0 and bad flags return 2 instead of raising
    ``SystemExit``, so tests and other programs can call ``main([...])`` in-process.
    Warnings of torch and transformers are held while the command runs and written after
    its result, or dropped when it fails (:mod:`pipebubble.libwarnings`).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
        if code == 0:  # --help, --version: the text must reach stdout (> /dev/full fails)
            try:
                flush_stdout()
            except UserError as err:
                sys.stderr.write(f"pipebubble: error: {error_line(err)}\n")
                return 2
        return code
    except USER_ERRORS as exc:  # standard output failed while printing --help
        sys.stderr.write(f"pipebubble: error: {error_line(exc)}\n")
        return 2
    try:
        with held() as kept:  # torch/transformers warnings: shown after a result only
            rc = int(args.func(args) or 0)
            flush_stdout()  # a full disk on stdout: one line, not "Exception ignored" at exit
        kept.write()  # (on an error they are dropped: the error stays one line)
        return rc
    except USER_ERRORS as exc:
        sys.stderr.write(f"pipebubble: error: {error_line(exc)}\n")
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
