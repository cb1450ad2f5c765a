"""Library parameter names as the command line spells them: the one table of flags.

Library errors name parameters in the library's words, marked
(:func:`pipebubble.errors.param`): ``steps must be >= 1, got 0``. The command line writes
each marked name as its flag, ``--steps must be >= 1, got 0``: by default ``--`` and the
name with ``-`` for ``_`` (``memory_limit`` -> ``--memory-limit``); :data:`FLAGS` lists the
names whose flag differs.

>>> flag("memory_limit"), flag("model_args"), flag("--gpu")
('--memory-limit', '--model-arg', '--gpu')
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..errors import ParamError, UserError

FLAGS: dict[str, str] = {
    "model_args": "--model-arg",  # RunConfig.model_args: one --model-arg KEY=VALUE each
    # the planner (plan/): the library's argument or Request field -> plan's flag
    "hardware": "--gpu",  # search(hardware=...): the GPU preset --gpu names
    "profiles": "--profile",  # ProfileSet(profiles): one --profile FILE each
    "shardings": "--sharding",  # Request.shardings
    "microbatch_sizes": "--microbatch-size",  # Request.microbatch_sizes
    "grad_bytes": "--grad-wire-bytes",  # Request.grad_bytes: a gradient's bytes on the wire
    "gradient_bytes": "--grad-bytes",  # Request.state_bytes[1]: a held gradient's bytes
    "measured": "--measured-step",  # fit_efficiency(measured=...)
    "fp8_peak_flops": "--fp8-peak-tflops",  # Hardware.fp8_peak_flops (the flag in TFLOP/s)
}
"""Library names whose flag is not ``--`` + the name with ``-`` for ``_``."""


def flag(name: str) -> str:
    """The flag of library parameter ``name`` (a flag already, ``-p``, as it is)."""
    if name.startswith("-"):
        return name
    return FLAGS.get(name) or "--" + name.replace("_", "-")


def render(exc: UserError) -> str:
    """The message of ``exc`` with every parameter named by its flag."""
    return exc.render(flag)


def arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: a :class:`ParamError` becomes argparse's error, its
    parameter names written as flags (the argparse adapter of :mod:`pipebubble.params`)."""

    def adapted(text: str) -> Any:
        try:
            return parse(text)
        except ParamError as exc:
            raise argparse.ArgumentTypeError(render(exc)) from None

    return adapted
