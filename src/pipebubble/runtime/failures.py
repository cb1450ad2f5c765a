"""A run's user-code failure in the model's own words: which layer, stage, rank and step.

The stage interpreter knows the stage, the rank and the layer's index *in its stage*
(:class:`~pipebubble.usercode.UserCodeError`); the training loop knows the step and the
model's cut. :func:`training_step` wraps one step of the loop (``run --local``, every
distributed worker) and completes the message::

    model 'mine': layer 3 ('blocks.1', Block) raised RuntimeError during the forward of
    microbatch 2 (stage 1, rank 1, step 4)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import UserError, param
from ..usercode import UserCodeError, user_code

# parameter names, marked in messages (errors.param): the CLI writes them as flags
_ACTION_TIMEOUT = param("action_timeout")
_CHECK = param("check")


def name_failure(exc: UserCodeError, setup, step: int | None = None) -> UserCodeError:
    """Name the failing layer by its index in the model and the model's own name for it
    (``setup``: the run's :class:`~pipebubble.runtime.setup.RunSetup`); add the step."""
    stage, i = exc.where.get("stage"), exc.layer
    if stage is not None and i is not None:
        starts = [0, *setup.boundaries]  # stage s of a later chain (DualPipe) is s mod len
        g = starts[stage % len(starts)] + i
        layers, names = setup.spec.layers, setup.spec.layer_names()
        if 0 <= g < len(layers):
            exc.rename(f"layer {g} ({names[g]!r}, {type(layers[g]).__name__})")
    return exc.at(step=step, model=setup.spec.name)


@contextmanager
def training_step(setup, step: int) -> Iterator[None]:
    """One training step of the loop: a failure of the model's code names where it was."""
    try:
        yield
    except UserCodeError as exc:
        raise name_failure(exc, setup, step) from exc.__cause__


def reference_code(setup, step: int):
    """The unsplit model of ``--check`` runs the user's layers too."""
    return user_code(f"the unsplit model (the {_CHECK} reference)", step=step,
                     model=setup.spec.name)


@contextmanager
def preflight_timeout(seconds: float, where: str = "in the launcher") -> Iterator[None]:
    """Bound the pre-flight check (building the model, its one 2-sample forward, the first
    batch) by ``seconds`` (``--action-timeout``, default at least 300 s): a model whose code
    never returns is one line, not a launcher that hangs before any rank starts.

    A ``SIGALRM`` timer interrupts the Python code of the model (a loop, a ``sleep``); a
    call into C that never returns is not interruptible this way. Only in the main thread
    (elsewhere, and where there is no ``SIGALRM``, it does nothing)."""
    import signal
    import threading

    if (not hasattr(signal, "setitimer") or threading.current_thread()
            is not threading.main_thread()):
        yield
        return

    def expired(signum, frame):  # noqa: ARG001
        raise _PreflightExpired

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _PreflightExpired:
        raise UserError(f"the model did not finish its pre-flight check {where} (build it, "
                        f"make a batch, one forward of 2 samples) within {seconds:g} s "
                        f"({_ACTION_TIMEOUT}); is a forward stuck in a loop?") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class _PreflightExpired(BaseException):
    """Raised by the pre-flight timer; a BaseException so the model's own ``except
    Exception`` cannot swallow it."""
