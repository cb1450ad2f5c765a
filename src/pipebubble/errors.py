"""The one user-error type: bad input that the CLI prints as one line and exits 2 for.

Library code raises :class:`UserError` (or a subclass) when the *caller's input* is wrong: a
parameter out of range, a file that does not parse, a schedule that does not exist for these
ranks. The message names the bad value and what would be valid.

Library errors speak the library's words. A message names a parameter by its name in the
library (the keyword argument, the ``RunConfig`` field: ``steps``, ``resume``,
``model_args``), marked with :func:`param`, never by a command-line flag::

    raise ParamError(f"{param('microbatches')} must be >= 1, got {m}")

``str(exc)`` reads the names as they are (``microbatches must be >= 1, got 0``), which is
what a caller of the library passed. :meth:`UserError.render` writes each marked name the
way a front end spells it: ``pipebubble.cli`` with the flag (``--microbatches must be >= 1,
got 0``; the flag is ``--`` and the name with ``-`` for ``_``, except the few names in one
table, ``pipebubble.commands._flags.FLAGS``, such as ``model_args`` -> ``--model-arg``), the
explorer with the flag its parameter table gives. ``exc.params`` lists the names marked, so a
caller can tell which argument was wrong without reading the sentence. A name that is
already a flag (``--gpu``, text from code that still passes flags) is left as it is.

The mark is a NUL character on each side of the name: no command-line argument and no file
name can hold one, and a value shown with ``!r`` escapes it, so a value in the message is
never mistaken for a parameter. A message re-wrapped by library code keeps its marks when it
is built from :func:`marked` (``f"{where}: {marked(exc)}"``), not from ``str(exc)``.

``pipebubble.cli.main`` turns exactly these (and argparse errors, and a missing or unreadable
file the user named) into ``pipebubble: error: <message>`` and exit code 2. Anything else, a
bare ``ValueError`` from a bug included, surfaces as a traceback, so tests see bugs as bugs.

``UserError`` derives from ``ValueError`` so callers that catch ``ValueError`` keep working.
Its subclasses: :class:`ParamError` (a parameter's value is not valid; ``params.ParamError``
is this class), :class:`pipebubble.ScheduleError` (and ``Deadlock``),
``plan.profile.ProfileError``, ``plan.partition.PartitionError``; any of them may mark names.

>>> exc = ParamError(f"{param('steps')} must be >= 1, got 0")
>>> str(exc), exc.params
('steps must be >= 1, got 0', ('steps',))
>>> exc.render(lambda name: "--" + name)
'--steps must be >= 1, got 0'
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MARK = "\0"
_MARKED = re.compile("\0([^\0]*)\0")


def param(name: str) -> str:
    """``name`` marked as a parameter's name inside an error message (see the module doc)."""
    return f"{_MARK}{name}{_MARK}"


def marked(exc: BaseException) -> str:
    """The message of ``exc`` with its parameter marks kept, to build another message from."""
    return str(exc.args[0]) if isinstance(exc, UserError) and exc.args else str(exc)


class UserError(ValueError):
    """Bad input from the user; the message is one line naming the value and what is valid.

    Parameter names in it are marked with :func:`param`: ``str()`` shows them as they are,
    :meth:`render` as a front end spells them."""

    @property
    def params(self) -> tuple[str, ...]:
        """The parameter names the message marks, in order (each once)."""
        return tuple(dict.fromkeys(_MARKED.findall(marked(self))))

    def render(self, spell: Callable[[str], str]) -> str:
        """The message with each marked name written as ``spell(name)`` (a name that is
        already a flag, starting with ``-``, as it is)."""
        return _MARKED.sub(lambda m: m[1] if m[1].startswith("-") else spell(m[1]),
                           marked(self))

    def __str__(self) -> str:
        text = marked(self)
        return _MARKED.sub(r"\1", text) if _MARK in text else super().__str__()


class ParamError(UserError):
    """A parameter's value is not valid; the message marks the parameter's name
    (:func:`param`) and says what is valid."""
