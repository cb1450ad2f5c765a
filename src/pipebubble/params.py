"""One table of the schedule and cost parameters, read by the CLI and by the explorer alike.

``pipebubble simulate --f 1 --ranks 4`` and ``GET /api/simulate?f=1&ranks=4`` ask the same
question, so they are checked by the same code and refused with the same words: each
parameter is a :class:`Param` (its query key, its flag, how its text is read and what is
valid) and each way of reading text is one function here. The CLI wraps them as argparse
types (:meth:`Param.arg_type`, and ``commands/common.py``'s ``int_flag``, ``float_flag``,
``time_value`` for its other flags); the explorer calls :func:`read` on its query. The
bounds themselves (digits of an integer, the shortest and longest time) live in
:mod:`pipebubble.limits`.

Rules, for every parameter:

- an integer has at most :data:`~pipebubble.limits.MAX_INT_DIGITS` digits (checked before
  Python converts it: a 4300-digit number is one line of error, never a traceback) and lies
  in its range;
- a time (and a memory amount, which follows the same rules) is a number or a comma list of
  numbers (one per stage), each 0 or in [``MIN_TIME``, ``MAX_TIME``]; ``nan``, ``inf`` and an
  empty item are refused;
- a real number such as ``overlap`` is finite and in its range;
- empty text is a bad value, never "use the default" (``--ranks ''`` and ``ranks=`` alike).

>>> read({"ranks": "4"}, "ranks")
4
>>> read({}, "f")
1.0
>>> read({"f": "1,2"}, "f")
[1.0, 2.0]
>>> read({"ranks": "0"}, "ranks")
Traceback (most recent call last):
...
pipebubble.params.ParamError: --ranks must be >= 1, got 0
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import UserError
from .limits import MAX_INT_DIGITS, MAX_TIME_VALUES, LimitError, check_time


class ParamError(UserError):
    """A parameter's text is not a valid value; the message names the flag and what is valid."""


def _plain(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


# ---- ways of reading a value ----------------------------------------------------------------
def parse_int(text: str, name: str, lo: int | None = 1, hi: int | None = None) -> int:
    """An integer in ``lo..hi`` (either end open when None).

    >>> parse_int("7", "--width")
    7
    >>> parse_int("1" * 400, "--width")
    Traceback (most recent call last):
    ...
    pipebubble.params.ParamError: --width must be an integer >= 1, got a 400-digit number
    """
    if lo is not None and hi is not None:
        valid = f"an integer in {lo}..{hi}"
    elif lo is not None:
        valid = f"an integer >= {lo}"
    elif hi is not None:
        valid = f"an integer <= {hi}"
    else:
        valid = "an integer"
    body = text.strip().lstrip("+-")
    if not body.isdigit() or not body.isascii():
        raise ParamError(f"{name} must be {valid}, got {_plain(text)!r}")
    if len(body.lstrip("0")) > MAX_INT_DIGITS:
        raise ParamError(f"{name} must be {valid}, got a {len(body)}-digit number")
    value = int(text)
    if lo is not None and value < lo:
        raise ParamError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ParamError(f"{name} must be <= {hi}, got {value}")
    return value


def parse_float(text: str, name: str, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite real number in a range (``lo_open``: ``> lo``). ``nan`` and ``inf`` are
    refused (nan compares false with everything, so it would turn a check off).

    >>> parse_float("nan", "--overlap", 0, 1, lo_open=True)
    Traceback (most recent call last):
    ...
    pipebubble.params.ParamError: --overlap must be a number in (0, 1], got 'nan'
    """
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    if lo is not None and hi is not None:
        valid = f"a number in {left}{lo:g}, {hi:g}{right}"
    elif lo is not None:
        valid = f"a number {'>' if lo_open else '>='} {lo:g}"
    elif hi is not None:
        valid = f"a number {'<' if hi_open else '<='} {hi:g}"
    else:
        valid = "a finite number"
    try:
        value = float(text)
    except ValueError:
        raise ParamError(f"{name} must be {valid}, got {_plain(text)!r}") from None
    bad = not math.isfinite(value)
    bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
    bad = bad or (hi is not None and (value >= hi if hi_open else value > hi))
    if bad:
        raise ParamError(f"{name} must be {valid}, got {_plain(text)!r}")
    return value


def parse_times(text: str, name: str) -> float | list[float]:
    """A scalar or a comma list of times (one per stage): each 0 or in
    [``MIN_TIME``, ``MAX_TIME``] (below, sums and ratios underflow; above, m x (F + B)
    overflows to infinity).

    >>> parse_times("1e308", "--f")
    Traceback (most recent call last):
    ...
    pipebubble.params.ParamError: --f must be 0 or between 1e-12 and 1e+12, got 1e+308
    """
    if text.count(",") >= MAX_TIME_VALUES:
        raise ParamError(f"{name}: at most {MAX_TIME_VALUES:,} values")
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ParamError(f"{name} must be a number or a comma list of numbers, got "
                         f"{_plain(text)!r}") from None
    for v in values:  # the one rule for times (limits.check_time)
        try:
            check_time(v, name)
        except LimitError as exc:
            raise ParamError(str(exc)) from None
    return values[0] if len(values) == 1 else values


def as_arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: a :class:`ParamError` becomes argparse's error."""

    def arg_type(text: str) -> Any:
        try:
            return parse(text)
        except ParamError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return arg_type


# ---- the table --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One parameter: ``key`` in the explorer's query, ``flag`` on the command line, how its
    text is read (``parse(text, flag)``), its default, and a line of help."""

    key: str
    flag: str
    parse: Callable[[str, str], Any]
    default: Any = None
    help: str = ""

    def __call__(self, text: str) -> Any:
        return self.parse(text, self.flag)

    @property
    def arg_type(self) -> Callable[[str], Any]:
        """The argparse ``type`` of this flag (same checks, same message)."""
        return as_arg_type(self)


def _positive(text: str, name: str) -> int:
    return parse_int(text, name, 1)


def _overlap(text: str, name: str) -> float:
    return parse_float(text, name, 0, 1, lo_open=True)


def _one_time(text: str, name: str) -> float:
    value = parse_times(text, name)
    if isinstance(value, list):
        raise ParamError(f"{name} takes one value (time per hop), got a list")
    return value


PARAMS: dict[str, Param] = {p.key: p for p in (
    Param("ranks", "--ranks", _positive, 4, "pipeline ranks (workers, one per device)"),
    Param("microbatches", "--microbatches", _positive, 8, "microbatches per training step"),
    Param("chunks", "--chunks", _positive, None,
          "stages per rank (interleaved schedules); default: the schedule's own"),
    Param("f", "--f", parse_times, 1.0, "forward (1)"),
    Param("b", "--b", parse_times, 2.0, "full backward B = I + W (2)"),
    Param("w", "--w", parse_times, 1.0, "weight-gradient part W of the backward (1)"),
    Param("comm", "--comm", _one_time, 0.0, "time per hop between ranks (0)"),
    Param("overlap", "--overlap", _overlap, 1.0,
          "overlapped F&B pair time as a fraction of F + B (1.0)"),
    Param("mem_b", "--mem-b", parse_times, 1.0, "activation memory M_B one forward adds (1)"),
    Param("mem_w", "--mem-w", parse_times, 0.0,
          "the part M_W of M_B that W still needs after I frees the rest (0)"),
    Param("memory_limit", "--memory-limit", parse_times, None,
          "the most activation memory a rank may hold (none)"),
)}
"""Every schedule and cost parameter, by query key (the flag with ``_`` for ``-``)."""

BY_FLAG: dict[str, Param] = {p.flag: p for p in PARAMS.values()}


def read(query: Mapping[str, str], key: str) -> Any:
    """The value of parameter ``key`` in ``query`` (the explorer's request): its default
    when absent, else the parsed text (empty text is a bad value, as on the command line).
    Raises :class:`ParamError` with the CLI's message."""
    param = PARAMS[key]
    if key not in query:
        return param.default
    return param(str(query[key]))
