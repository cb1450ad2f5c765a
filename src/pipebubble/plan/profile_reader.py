"""The one checked reader of profiles: measured, analytic or written by hand, nothing trusted.

A profile (see :mod:`pipebubble.plan.profile` for the format) feeds the partitioner and the
planner, which multiply its numbers by microbatch counts and sizes, sum them, divide by them.
A wrong type there is a traceback deep inside numpy; ``"nan"`` or a negative size silently
drops every plan; ``1e308`` overflows to infinity; an all-zero profile has no bubble to
speak of. So every profile, read from a file (``Profile.load``), built from a dict
(``Profile.from_dict``) or about to be written (``Profile.save``), passes these checks
(:func:`check_document`) first, as timelines pass :mod:`pipebubble.timeline_io`:

- the document is an object with a non-empty ``layers`` list of at most
  :data:`~pipebubble.limits.MAX_LAYERS` objects;
- every layer has a non-empty string ``name`` (unique), and ``forward``, ``backward``,
  ``params``, ``activation_bytes``, ``flops``;
- every number, required or optional (:data:`OPTIONAL`: ``weight_backward``,
  ``weight_activation_bytes``, ``output_bytes``, ``activation_bytes_full``,
  ``activation_bytes_selective``, ``recompute_time_full``, ``recompute_time_selective``,
  ``activation_bytes_op``, ``recompute_time_op``), is
  a JSON number (not a string, not ``true``), finite, and 0 or in ``[MIN, MAX]`` for its
  unit (:data:`BOUNDS`): times 1e-12..1e12 s, bytes up to 2^70, FLOPs up to 1e30, params
  a whole number up to 1e18. Below the minimum, sums and ratios underflow (a denormal
  layer time gives a bubble fraction of 1.0); below the maximum, nothing the planner
  computes can overflow a float;
- ``weight_backward`` is at most ``backward`` (W is part of the backward); ``type`` is a
  string; ``modules`` a list of non-empty strings;
- the layers together take some time: forward + backward summed over layers > 0.

Each message names the file, the layer (index and name) and the field, in the user's terms:
``profile file 'p.json': layer 3 ('blk.3'): output_bytes must be a finite number >= 0
(bytes), got 'nan'``.

>>> check_document({"layers": [{"name": "a", "forward": 1e-3, "backward": 2e-3, "params": 1,
...     "activation_bytes": 8, "flops": 10, "output_bytes": 1e300}]}, "p.json")
Traceback (most recent call last):
...
pipebubble.plan.profile_reader.ProfileError: p.json: layer 0 ('a'): output_bytes must be 0 or \
between 1e-12 and 1.18059e+21 bytes, got 1e+300
"""

from __future__ import annotations

import math
import os

from ..errors import UserError, marked
from ..limits import MAX_LAYERS, MAX_TIME, MIN_TIME

FIELDS = ("name", "forward", "backward", "params", "activation_bytes", "flops")
"""The fields every layer has (``plan.profile.FIELDS``, defined here, below it)."""


class ProfileError(UserError):
    """A profile file or dictionary that cannot be used; the message names the bad value."""

MAX_BYTES = float(2**70)
MAX_FLOPS = 1e30
MAX_PARAMS = 10**18

BOUNDS: dict[str, tuple[str, float]] = {
    "forward": ("seconds", MAX_TIME),
    "backward": ("seconds", MAX_TIME),
    "weight_backward": ("seconds", MAX_TIME),
    "recompute_time_full": ("seconds", MAX_TIME),
    "recompute_time_selective": ("seconds", MAX_TIME),
    "recompute_time_op": ("seconds", MAX_TIME),
    "activation_bytes": ("bytes", MAX_BYTES),
    "weight_activation_bytes": ("bytes", MAX_BYTES),
    "output_bytes": ("bytes", MAX_BYTES),
    "activation_bytes_full": ("bytes", MAX_BYTES),
    "activation_bytes_selective": ("bytes", MAX_BYTES),
    "activation_bytes_op": ("bytes", MAX_BYTES),
    "flops": ("FLOPs", MAX_FLOPS),
    "params": ("parameters", float(MAX_PARAMS)),
}
"""Every numeric per-layer field: its unit and largest value (each is 0 or >= MIN_TIME)."""

OPTIONAL = tuple(k for k in BOUNDS if k not in FIELDS)


def load_document(path: str | os.PathLike, what: str = "profile file") -> tuple[object, str]:
    """The parsed JSON of a profile file, and the name its messages start with
    (``profile file 'p.json'``); ``Profile.load`` checks it with :func:`check_document`."""
    from ..files import FileError, read_json_file

    try:  # a regular UTF-8 file under the size limit, sane nesting, finite numbers
        return read_json_file(path, what), f"{what} {os.fspath(path)!r}"
    except FileError as exc:
        raise ProfileError(marked(exc)) from None


def check_document(data: object, where: str = "profile") -> dict:
    """Check a profile document (a dict as read from JSON) field by field (module doc) and
    return it; ``where`` starts every message (the file, or the flag it is written to)."""
    if not isinstance(data, dict) or "layers" not in data:
        got = type(data).__name__ + (" without 'layers'" if isinstance(data, dict) else "")
        raise ProfileError(f"{where}: a profile must be a JSON object with a 'layers' list, "
                           f"got {got}")
    raw = data["layers"]
    if not isinstance(raw, list):
        raise ProfileError(f"{where}: 'layers' must be a list, got {type(raw).__name__}")
    if not raw:
        raise ProfileError(f"{where}: profile has no layers ('layers' is empty); it needs "
                           "at least one")
    if len(raw) > MAX_LAYERS:
        raise ProfileError(f"{where}: {len(raw):,} layers, over the limit of {MAX_LAYERS:,}")
    seen: set[str] = set()
    total = 0.0
    for i, item in enumerate(raw):
        _check_layer(item, i, where)
        if item["name"] in seen:
            raise ProfileError(f"{where}: layer {i}: name {item['name']!r} appears twice; "
                               "layer names must be unique")
        seen.add(item["name"])
        total += item["forward"] + item["backward"]
    if not total > 0 and data.get("hardware_free") is not True:  # an analytic profile
        # without --tflops holds shapes, not times: plan --gpu prices its layers
        raise ProfileError(f"{where}: every layer's forward and backward is 0 s; a profile "
                           "needs some time to balance (measure it, or give the times)")
    return data


def _check_layer(item: object, i: int, where: str) -> None:
    if not isinstance(item, dict):
        raise ProfileError(f"{where}: layer {i} must be an object with "
                           f"{', '.join(FIELDS)}, got {type(item).__name__}")
    name = item.get("name")
    label = f"{where}: layer {i}" + (f" ({name!r})" if isinstance(name, str) else "")
    missing = [k for k in FIELDS if k not in item]
    if missing:
        raise ProfileError(f"{label} is missing {', '.join(repr(k) for k in missing)}; every "
                           f"layer needs {', '.join(FIELDS)}")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{label}: name must be a non-empty string, got {_show(name)}")
    for key, (unit, top) in BOUNDS.items():
        if key in item:
            _check_number(item[key], key, unit, top, label)
    if float(item["params"]) != int(item["params"]):
        raise ProfileError(f"{label}: params must be a whole number, got {_show(item['params'])}")
    if "weight_backward" in item and item["weight_backward"] > item["backward"]:
        raise ProfileError(f"{label}: weight_backward {item['weight_backward']!r} s is more than "
                           f"backward {item['backward']!r} s; W is part of the backward")
    kind = item.get("type")
    if kind is not None and not isinstance(kind, str):
        raise ProfileError(f"{label}: type must be a string, got {_show(kind)}")
    modules = item.get("modules")
    if modules is not None and (not isinstance(modules, list) or len(modules) > MAX_LAYERS
                                or not all(isinstance(m, str) and m for m in modules)):
        raise ProfileError(f"{label}: modules must be a list of non-empty strings (module "
                           f"names), got {_show(modules)}")


def _check_number(v: object, key: str, unit: str, top: float, label: str) -> None:
    if (isinstance(v, bool) or not isinstance(v, int | float)
            or (isinstance(v, float) and not math.isfinite(v)) or v < 0):
        raise ProfileError(f"{label}: {key} must be a finite number >= 0 ({unit}), got "
                           f"{_show(v)}")
    if isinstance(v, int) and abs(v) > 10**30:  # float() of a huge int would overflow
        raise ProfileError(f"{label}: {key} must be 0 or between {MIN_TIME:g} and {top:g} "
                           f"{unit}, got a {len(str(abs(v)))}-digit number")
    if not (v == 0 or MIN_TIME <= v <= top):
        raise ProfileError(f"{label}: {key} must be 0 or between {MIN_TIME:g} and {top:g} "
                           f"{unit}, got {v!r}")


def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
