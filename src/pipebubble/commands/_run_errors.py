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

from ..usercode import UserCodeError, user_code


def name_failure(exc: UserCodeError, setup, step: int | None = None) -> UserCodeError:
    """Name the failing layer by its index in the model and the model's own name for it
    (``setup``: the run's :class:`~pipebubble.commands._run_setup.RunSetup`); add the step."""
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
    return user_code("the unsplit model (the --check reference)", step=step,
                     model=setup.spec.name)
