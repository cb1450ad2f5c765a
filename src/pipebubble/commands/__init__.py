"""CLI subcommands, one module each, discovered by ``pipebubble.cli``.

A module defines ``register(subparsers)`` that adds its parser and sets ``func`` to a
handler ``(args) -> int``. Shared flags and helpers live in ``common.py``.
"""
