"""Search over large orders, kept beside the benchmarks (no product path reaches it).

- ``critical.py``: critical-path analysis, each step's *tail* (its longest path to the end
  of the step), kept up to date backwards, and the step time of a window rewrite from heads
  and tails without re-timing it.
- ``core.py``: :class:`TailsCompiled`, the product's evaluation core
  (``pipebubble.sim.program.Compiled``) plus moves answered from the tails, left pending.
- ``search.py``: :func:`local_search`, short moves of critical actions on orders of 5,000
  to 50,000 actions.

They engage from 4,096 steps, while ``auto`` searches at most 300 actions; measured by
``bench/bench_simulate.py`` (sections 5 to 7), the search gains 0.03 % to 0.25 % of the step
on the Table 8 settings and nothing on the Zero Bubble Table 9 rows: too little to wire into
``auto``. Import with ``bench/`` on ``sys.path`` (``bench_simulate.py`` and
``tests/test_large_search.py`` put it there).
"""

from .core import TailsCompiled
from .search import Searched, local_search

__all__ = ["Searched", "TailsCompiled", "local_search"]
