"""The search budget: one ledger of work for every stage of ``auto``'s search.

``auto_schedule(..., search_seconds=S)`` makes one :class:`Budget` of ``S x
WORK_PER_SECOND`` *work units* (about one pass of a list scheduler over one action; the
rate is that of the reference machine, two loaded cores) and hands it to every stage after
the registered schedules, in turn: the greedy passes, the adaptive V blocks (every list
schedule of a block, its deep warm-up and its cool-down wave, and the simulator's scoring
of each order), the local search, the MIP windows and the tail windows. Each stage charges
what it does, by counts (actions passed over, orders scored, evaluations, solver
iterations and checks), never by the clock, and stops when the ledger is spent; so the
same instance and budget give the same order on any machine and under any load.

The solver is the one stage whose work a count can only bound from outside: HiGHS's root
(presolve, root LP, cut rounds, heuristics) ignores its node limit. Each window is given
a cap on the solver's *checks* (its interrupt callbacks, a deterministic count: one
solver thread) from what is left, and a window that the ledger cannot afford is not
started.

An item the ledger cannot afford is refused and not charged (:meth:`Budget.spend`); what
is only known after the fact (a solve's iterations) is charged then
(:meth:`Budget.charge`), which :func:`.mip.check_cap` keeps within what was left.

The one exception is the **safety net**: a wall-clock deadline ``net x S`` seconds after
the ledger is made (after the registered schedules; ``net`` is 1 for ``pipebubble schedule
auto --search-seconds S``, :data:`PLANNER_NET` in the planner, where the ledger alone bounds
the search and the net is a far last resort, so that the planner's ranking does not depend
on the clock). Past it every stage stops at its next
check (and a running solve at its time limit, the seconds left to the deadline), and
``Budget.hit`` is set; what runs past the deadline is the one step in flight (a greedy
pass, one order grown and scored, one solver check), meant to stay within :func:`slack`
(measured: up to 0.3 s at p = 32, m = 256 on the reference machine, 0.55 s for one
greedy pass when the two cores run five processes). That is the one case in which the
result may depend on the machine: the counts are calibrated so that a normal run stays
inside it. (In a distributed run one rank searches
and sends the order, so the ranks still agree.) The environment variable
``PIPEBUBBLE_AUTO_SAFETY_NET=0`` turns the net off altogether (read when a ledger is made):
the test suite sets it (tests/conftest.py), so no test depends on the machine's load.

>>> b = Budget(0.0)
>>> b.spend(1.0, "greedy"), b.spent, b.by_stage
(False, 0.0, {})
>>> b.charge(2.0, "tail windows"), b.spent, b.left
(False, 2.0, -2.0)
"""

from __future__ import annotations

import os
import time

WORK_PER_SECOND = 200_000  # work units a second on the reference machine (2 loaded cores)
SLACK_SECONDS = 0.25  # what the step in flight may run past the deadline, at most
SLACK_SHARE = 0.1  # or this share of the budget, whichever is more
SAFETY_NET_ENV = "PIPEBUBBLE_AUTO_SAFETY_NET"  # "0": no wall-clock deadline (the tests)
PLANNER_NET = 5.0  # the planner's net: at 5 x its budget (the ledger bounds its search)


def safety_net_on() -> bool:
    """Whether ledgers made now have the wall-clock safety net (:data:`SAFETY_NET_ENV`)."""
    return os.environ.get(SAFETY_NET_ENV, "1").strip() != "0"


def slack(seconds: float) -> float:
    """How far past its budget a search may run: the step in flight at the deadline."""
    return max(SLACK_SECONDS, SLACK_SHARE * seconds)


class Budget:
    """Work a search may do, in work units (see the module docstring), shared by every
    stage: ``spend(work, stage)`` charges it (kept per stage in ``by_stage``) if the
    ledger has that much left, else refuses it; ``charge(work, stage)`` charges work
    already done; ``afford(work)`` asks without charging. ``clock``: the safety net on or
    off (None: :func:`safety_net_on`); ``net``: its deadline, a multiple of ``seconds``."""

    def __init__(self, seconds: float, clock: bool | None = None, net: float = 1.0):
        self.seconds = float(seconds)
        self.total = self.seconds * WORK_PER_SECOND
        self.left = self.total
        self.by_stage: dict[str, float] = {}
        self.hit = False
        on = safety_net_on() if clock is None else clock
        self.deadline = time.perf_counter() + net * self.seconds if on else float("inf")

    @property
    def spent(self) -> float:
        """Work units charged so far, all stages together."""
        return self.total - self.left

    def spend(self, work: float, stage: str = "search") -> bool:
        """Charge ``work`` and say True if it fits in what is left (and the safety net's
        deadline is not past); else charge nothing and say False."""
        if not self.afford(work):
            return False
        self.charge(work, stage)
        return True

    def charge(self, work: float, stage: str = "search") -> bool:
        """Charge ``work`` already done (it may overdraw); whether any is left."""
        self.left -= work
        self.by_stage[stage] = self.by_stage.get(stage, 0.0) + work
        return self.left > 0 and not self.late()

    def afford(self, work: float) -> bool:
        """Whether ``work`` more fits in what is left (nothing is charged)."""
        return self.left >= work and not self.late()

    def late(self) -> bool:
        """Whether the safety net's deadline is past (it sets ``hit``)."""
        if not self.hit and time.perf_counter() > self.deadline:
            self.hit = True
        return self.hit

    def seconds_left(self) -> float:
        """Seconds to the safety net's deadline (a solver's time limit); inf without it."""
        return max(0.0, self.deadline - time.perf_counter())
