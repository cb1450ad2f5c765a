"""Fit the compute model's efficiency to one measured step (``plan --measured-step``).

The predicted step of a fixed configuration falls as the efficiency rises (every GEMM and
attention time is divided by it; communication and memory-bound time are not). So the
efficiency that reproduces a measured step is found by bisection on ``[LOW, 1]``. A measured
step below the prediction at efficiency 1 (faster than the GPU's peak allows with this
network) or above the prediction at ``LOW`` contradicts the model: the error says so.

>>> fit_efficiency(lambda e: 1.0 + 2.0 / e, measured=5.0)   # 1 + 2 / 0.5 = 5
0.5
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UserError, param

LOW = 0.01


def fit_efficiency(predict: Callable[[float], float], measured: float,
                   tol: float = 1e-7) -> float:
    """The efficiency ``e`` with ``predict(e) == measured``, to ``tol`` in ``e``."""
    if not (measured > 0 and measured != float("inf")):
        raise UserError(f"{param('measured')} must be a finite number of seconds > 0, got "
                         f"{measured!r}")
    fast, slow = predict(1.0), predict(LOW)
    if measured < fast:
        raise UserError(f"{param('measured')} {measured:g} s is faster than this configuration "
                         f"can run even at {param('efficiency')} 1 ({fast:.4g} s predicted: "
                         "the communication and memory-bound time alone take longer); check "
                         f"{param('config')}, {param('hardware')} and the network")
    if measured > slow:
        raise UserError(f"{param('measured')} {measured:g} s is slower than this configuration "
                         f"at {param('efficiency')} {LOW} ({slow:.4g} s predicted); check "
                         f"{param('config')} and {param('global_batch')}")
    lo, hi = LOW, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if predict(mid) > measured:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 6)
