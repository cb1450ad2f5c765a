"""The one user-error type: bad input that the CLI prints as one line and exits 2 for.

Library code raises :class:`UserError` (or a subclass) when the *caller's input* is wrong: a
flag out of range, a file that does not parse, a schedule that does not exist for these
ranks. The message names the bad value and what would be valid::

    raise UserError(f"--microbatches must be >= 1, got {m}")

``pipebubble.cli.main`` turns exactly these (and argparse errors, and a missing or unreadable
file the user named) into ``pipebubble: error: <message>`` and exit code 2. Anything else, a
bare ``ValueError`` from a bug included, surfaces as a traceback, so tests see bugs as bugs.

``UserError`` derives from ``ValueError`` so callers that catch ``ValueError`` keep working.
Its subclasses: :class:`pipebubble.ScheduleError` (and ``Deadlock``),
``plan.profile.ProfileError``, ``plan.partition.PartitionError``.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user; the message is one line naming the value and what is valid."""
