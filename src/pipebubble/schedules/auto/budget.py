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

**No clock by default.** Nothing in a search reads the time unless asked: the same
command gives the same order on any machine and under any load (a busy machine only takes
longer). A wall-clock limit is an explicit request, ``search_deadline=S`` in the library
(``auto_schedule``, ``get_schedule("auto", ...)``) and ``--search-deadline S`` on the
commands that take auto's budget: ``S`` seconds after the ledger is made (after the
registered schedules) every stage stops at its next check (and a running solve at its time
limit, the seconds left), and ``Budget.hit`` is set (``safety_net_hit`` in the JSON). What
runs past it is the one step in flight (a greedy pass, one order grown and scored, one
solver check), meant to stay within :func:`slack`. Only then may the result depend on the
machine. (In a distributed run one rank searches and sends the order, so the ranks agree
either way.) The environment variable ``PIPEBUBBLE_AUTO_SAFETY_NET`` of earlier versions
(which turned a default deadline off) is no longer read: there is no default deadline.

>>> b = Budget(0.0)
>>> b.spend(1.0, "greedy"), b.spent, b.by_stage
(False, 0.0, {})
>>> b.charge(2.0, "tail windows"), b.spent, b.left
(False, 2.0, -2.0)
"""

from __future__ import annotations

import time

WORK_PER_SECOND = 200_000  # work units a second on the reference machine (2 loaded cores)
SLACK_SECONDS = 0.25  # what the step in flight may run past the deadline, at most
SLACK_SHARE = 0.1  # or this share of the budget, whichever is more


def slack(seconds: float) -> float:
    """How far past a deadline of ``seconds`` a search may run: the step in flight."""
    return max(SLACK_SECONDS, SLACK_SHARE * seconds)


class Budget:
    """Work a search may do, in work units (see the module docstring), shared by every
    stage: ``spend(work, stage)`` charges it (kept per stage in ``by_stage``) if the
    ledger has that much left, else refuses it; ``charge(work, stage)`` charges work
    already done; ``afford(work)`` asks without charging. ``deadline``: seconds of wall
    clock from now after which every stage stops (None, the default: no clock at all)."""

    def __init__(self, seconds: float, deadline: float | None = None):
        self.seconds = float(seconds)
        self.total = self.seconds * WORK_PER_SECOND
        self.left = self.total
        self.by_stage: dict[str, float] = {}
        self.hit = False
        self.deadline = (float("inf") if deadline is None
                         else time.perf_counter() + float(deadline))

    @property
    def spent(self) -> float:
        """Work units charged so far, all stages together."""
        return self.total - self.left

    def spend(self, work: float, stage: str = "search") -> bool:
        """Charge ``work`` and say True if it fits in what is left (and the deadline, if
        one was asked for, is not past); else charge nothing and say False."""
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
        """Whether the asked-for deadline is past (it sets ``hit``); never without one,
        and then the clock is not read."""
        if self.deadline == float("inf"):
            return False
        if not self.hit and time.perf_counter() > self.deadline:
            self.hit = True
        return self.hit

    def seconds_left(self) -> float:
        """Seconds to the deadline (a solver's time limit); inf without one."""
        if self.deadline == float("inf"):
            return float("inf")
        return max(0.0, self.deadline - time.perf_counter())
