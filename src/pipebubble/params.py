"""One table of the schedule and cost parameters, read by the CLI and by the explorer alike.

``pipebubble simulate --f 1 --ranks 4`` and ``GET /api/simulate?f=1&ranks=4`` ask the same
question, so they are checked by the same code and refused with the same words: each
parameter is a :class:`Param` (its query key, its flag, how its text is read and what is
valid) and each way of reading text is one function here. Nothing here knows argparse: the
CLI wraps these readers as argparse types (``commands/_flags.py``'s ``arg_type``, used by
``commands/common.py``'s ``param_type``, ``int_flag``, ``float_flag``, ``time_value``); the
explorer calls :func:`read` on its query. The bounds themselves (digits of an integer, the
shortest and longest time) live in :mod:`pipebubble.limits`.

A reader names its parameter in the library's words: ``name`` is the parameter's name
(``ranks``, ``mem_b``), marked in the message (:func:`pipebubble.errors.param`), and each
front end writes it its way: the CLI and the explorer as the flag (:attr:`Param.flag`).

Rules, for every parameter:

- an integer has at most :data:`~pipebubble.limits.MAX_INT_DIGITS` digits (checked before
  Python converts it: a 4300-digit number is one line of error, never a traceback) and lies
  in its range;
- a time (and a memory amount, which follows the same rules) is a number or a comma list of
  numbers (one per stage), each 0 or in [``MIN_TIME``, ``MAX_TIME``]; ``nan``, ``inf`` and an
  empty item are refused;
- a real number such as ``overlap`` is finite, not denormal (below 2.2e-308 a division by
  it overflows to infinity) and in its range;
- a real number the planner prices with (``--efficiency``, ``--mfu``, a bandwidth, a
  latency, TFLOP/s, a memory size) is in the range :data:`REALS` gives it, read by
  :func:`parse_real` (a plain number) or :func:`parse_size` (a number with a unit, ``80GiB``):
  one table, so ``--efficiency 1e-320`` and ``--nvlink-latency 1e308`` are one line naming
  the range, never an overflow deep in the pricing;
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
pipebubble.errors.ParamError: ranks must be >= 1, got 0
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ParamError, marked, param  # ParamError: also pipebubble.params.ParamError
from .limits import MAX_INT_DIGITS, MAX_TIME, MAX_TIME_VALUES, MIN_TIME, LimitError, check_time


def _plain(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


# ---- ways of reading a value ----------------------------------------------------------------
def parse_int(text: str, name: str, lo: int | None = 1, hi: int | None = None) -> int:
    """An integer in ``lo..hi`` (either end open when None).

    >>> parse_int("7", "width")
    7
    >>> parse_int("1" * 400, "width")
    Traceback (most recent call last):
    ...
    pipebubble.errors.ParamError: width must be an integer >= 1, got a 400-digit number
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
        raise ParamError(f"{param(name)} must be {valid}, got {_plain(text)!r}")
    if len(body.lstrip("0")) > MAX_INT_DIGITS:
        raise ParamError(f"{param(name)} must be {valid}, got a {len(body)}-digit number")
    value = int(text)
    if lo is not None and value < lo:
        raise ParamError(f"{param(name)} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ParamError(f"{param(name)} must be <= {hi}, got {value}")
    return value


def parse_float(text: str, name: str, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite real number in a range (``lo_open``: ``> lo``). ``nan`` and ``inf`` are
    refused (nan compares false with everything, so it would turn a check off).

    >>> parse_float("nan", "overlap", 0, 1, lo_open=True)
    Traceback (most recent call last):
    ...
    pipebubble.errors.ParamError: overlap must be a number in (0, 1], got 'nan'
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
        raise ParamError(f"{param(name)} must be {valid}, got {_plain(text)!r}") from None
    bad = not math.isfinite(value)
    bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
    bad = bad or (hi is not None and (value >= hi if hi_open else value > hi))
    if bad:
        raise ParamError(f"{param(name)} must be {valid}, got {_plain(text)!r}")
    if value != 0 and abs(value) < sys.float_info.min:
        raise ParamError(f"{param(name)} must be {valid} and not denormal (0 or at least "
                         f"{sys.float_info.min:.3g} in size), got {_plain(text)!r}")
    return value


# ---- the real numbers the planner prices with -------------------------------------------------
@dataclass(frozen=True)
class Real:
    """The valid range of a real-valued parameter: ``lo <= x <= hi`` (and 0 when ``zero``),
    in ``unit``. Bounds are where the pricing still computes: a step is a sum of
    ``flops / (peak x efficiency)``, ``bytes / bandwidth`` and latencies over every layer,
    microbatch and message, so a rate below ``lo`` or a time above ``hi`` would overflow it."""

    lo: float
    hi: float
    zero: bool = False
    unit: str = ""

    def valid(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{'0 or ' if self.zero else ''}a number in [{self.lo:g}, {self.hi:g}]{unit}"

    def check(self, value: float, name: str, text: str | None = None) -> float:
        """``value`` if it lies in the range, else :class:`ParamError` naming the range."""
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            (self.zero and value == 0) or self.lo <= value <= self.hi)
        if not ok:
            got = _plain(text) if text is not None else value
            raise ParamError(f"{param(name)} must be {self.valid()}, got {got!r}")
        return float(value)


_BANDWIDTH = Real(1.0, 1e18, unit="bytes/s")
_LATENCY = Real(MIN_TIME, MAX_TIME, zero=True, unit="s")
_FRACTION = Real(1e-3, 1.0)
_MEMORY = Real(1.0, 1e18, unit="bytes")
REALS: dict[str, Real] = {
    "efficiency": _FRACTION,  # the fraction of peak large GEMMs reach
    "mfu": _FRACTION,
    "bus_fraction": _FRACTION,
    "peak_tflops": Real(1e-3, 1e6, unit="TFLOP/s"),
    "fp8_peak_tflops": Real(1e-3, 1e6, unit="TFLOP/s"),
    "tflops": Real(1e-3, 1e6, unit="TFLOP/s"),
    "hbm_bandwidth": _BANDWIDTH,
    "nvlink_bandwidth": _BANDWIDTH,
    "inter_node_bandwidth": _BANDWIDTH,
    "p2p_bandwidth": _BANDWIDTH,
    "allreduce_bandwidth": _BANDWIDTH,
    "ep_bandwidth": _BANDWIDTH,
    "latency": _LATENCY,
    "nvlink_latency": _LATENCY,
    "inter_node_latency": _LATENCY,
    "measured_step": Real(MIN_TIME, MAX_TIME, unit="s"),
    "gpu_memory": _MEMORY,
    "reserve": _MEMORY,
    "bytes_per_param": Real(1e-3, 1e3, unit="bytes"),
    "grad_bytes": Real(1e-3, 1e3, unit="bytes"),
    "param_bytes": Real(1e-3, 1e3, unit="bytes"),
    "optimizer_bytes": Real(1e-3, 1e3, unit="bytes"),
    "grad_wire_bytes": Real(1e-3, 1e3, unit="bytes"),
}
"""The range of every real-valued planner parameter, by name (library checks use the same
entries: :meth:`pipebubble.plan.hardware.Hardware.check`, the planner's ``Request.check``).
A name missing here gets :data:`DEFAULT_REAL`."""

DEFAULT_REAL = Real(1e-3, 1e18)
"""The range of a real parameter with no entry in :data:`REALS`: positive, normal, finite."""

UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
         "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
"""The units :func:`parse_size` reads (case-insensitive; ``/s`` may follow)."""


def real_range(name: str) -> Real:
    """The range of parameter ``name`` (:data:`REALS`, else :data:`DEFAULT_REAL`); a flag
    (``--gpu-memory``, as callers that still pass flags do) finds its name's entry."""
    return REALS.get(name.lstrip("-").replace("-", "_"), DEFAULT_REAL)


def check_real(value: float, name: str) -> float:
    """``value`` checked against the range of ``name`` (library callers: a number already).

    >>> check_real(1e-320, "efficiency")
    Traceback (most recent call last):
    ...
    pipebubble.errors.ParamError: efficiency must be a number in [0.001, 1], got 1e-320
    """
    return real_range(name).check(value, name)


def parse_real(text: str, name: str) -> float:
    """A plain real number in the range of ``name`` (``nan``, ``inf``, ``1e308`` and denormals
    fall outside every range).

    >>> for text in ("2e-6", "1e308"):
    ...     try:
    ...         print(parse_real(text, "nvlink_latency"))
    ...     except ParamError as exc:
    ...         print(exc)
    2e-06
    nvlink_latency must be 0 or a number in [1e-12, 1e+12] s, got '1e308'
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    return real_range(name).check(value, name, text)


def parse_size(text: str, name: str) -> float:
    """A number with an optional unit (``80GiB``, ``512MiB``, ``24e9``, ``50GB/s``) in the range
    of ``name``.

    >>> parse_size("80GiB", "gpu_memory") == 80 * 2**30
    True
    """
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Z]*)\s*(?:/s)?\s*", text)
    unit = m.group(2).lower() if m else None
    value = math.nan
    if m and unit in UNITS:
        try:
            value = float(m.group(1)) * UNITS[unit]
        except ValueError:
            pass
    r = real_range(name)
    if not (r.zero and value == 0 or r.lo <= value <= r.hi):
        raise ParamError(f"{param(name)} must be {r.valid()}, with an optional unit (80GiB, "
                         f"512MiB, 24e9, 50GB), got {_plain(text)!r}")
    return value


def parse_times(text: str, name: str) -> float | list[float]:
    """A scalar or a comma list of times (one per stage): each 0 or in
    [``MIN_TIME``, ``MAX_TIME``] (below, sums and ratios underflow; above, m x (F + B)
    overflows to infinity).

    >>> parse_times("1e308", "f")
    Traceback (most recent call last):
    ...
    pipebubble.errors.ParamError: f must be 0 or between 1e-12 and 1e+12, got 1e+308
    """
    if text.count(",") >= MAX_TIME_VALUES:
        raise ParamError(f"{param(name)}: at most {MAX_TIME_VALUES:,} values")
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ParamError(f"{param(name)} must be a number or a comma list of numbers, got "
                         f"{_plain(text)!r}") from None
    for v in values:  # the one rule for times (limits.check_time)
        try:
            check_time(v, name)
        except LimitError as exc:
            raise ParamError(marked(exc)) from None
    return values[0] if len(values) == 1 else values


# ---- the table --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One parameter: ``key``, its name (in the explorer's query too), ``flag`` on the
    command line, how its text is read (``parse(text, key)``, whose error marks ``key``),
    its default, and a line of help."""

    key: str
    flag: str
    parse: Callable[[str, str], Any]
    default: Any = None
    help: str = ""

    def __call__(self, text: str) -> Any:
        return self.parse(text, self.key)


def _positive(text: str, name: str) -> int:
    return parse_int(text, name, 1)


def _overlap(text: str, name: str) -> float:
    return parse_float(text, name, 0, 1, lo_open=True)


def _one_time(text: str, name: str) -> float:
    value = parse_times(text, name)
    if isinstance(value, list):
        raise ParamError(f"{param(name)} takes one value (time per hop), got a list")
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
    Param("a2a_f", "--a2a-f", parse_times, 0.0,
          "all-to-all time inside one F (expert parallelism; part of --f) (0)"),
    Param("a2a_b", "--a2a-b", parse_times, 0.0,
          "all-to-all time inside one B or I (part of --b minus --w) (0)"),
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
