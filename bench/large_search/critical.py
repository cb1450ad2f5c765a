"""Critical-path analysis: the step time of a locally changed order, without re-timing it.

The kernel's program (``pipebubble.sim.kernel``) is a DAG: step q starts at ``max(end[q - 1],
end[producer[q]] + lag[q])`` and lasts ``duration[q]``. Besides each step's *end* (its head),
keep its **tail**: the longest path from the end of q to the end of the step, over q's
successors v (the next step of its rank, weight 0; the step that waits for q's output,
weight ``lag[v]``) the most of ``weight + duration[v] + tail[v]``, and 0 where nothing
follows. Its **reach** is ``duration[q] + tail[q]``. The step time L is the largest
``end[q] + tail[q]``; the steps that reach it are *critical*.

**One backward pass.** The tails are the kernel's own clock run on the *reversed* program:
each rank's order backwards, each step waiting for the step that waited for it (a lone
action's output has at most one waiter, so the reversed program again has one producer per
step). The reversed step's start is the tail, its end the reach. A change that is kept
changes the tails of what its steps wait for only, and of those only the ones whose
longest path to the end ran through it: :meth:`Tails.update` evaluates the changed steps
again with the loop's arithmetic and passes a change on backwards, stopping where a tail
stays the same (past a few percent of the steps, it runs the loop again over every step
the change's steps wait for instead).

**A window rewrite.** Rank r's steps at positions lo..hi take a new order Z1..Zm (a swap of
neighbours: m = 2; one action moved k places: m = k + 1); p is the step before the window,
n the one after. Let D be what the window's steps reach in the old program. When no Zi waits
for a step of D and each Zi that waits for a window step comes after it:

1. No step outside D changes its end. The new ends of Z1..Zm follow in order from old ends
   (p's, and each producer's): the kernel's own arithmetic, the doubles a full run gives.
2. Nothing after the window (n, the steps waiting for a Zi) can reach the window in the new
   program, so their tails hold. The new tails of Zm..Z1 follow backwards from theirs.

So ``B = max end'(Zi) + tail'(Zi)`` is the longest path through the window, and every other
path is a path of the old program (at most L). Hence: if ``B > L`` the new step time is B;
if ``B <= L`` and no window step was critical, a critical path avoids the window and the
step time stays L; otherwise (a critical step moved and B < L: the step may get shorter)
there is no answer here, and the caller re-times.

**Deadlock.** A cycle of the new program passes a window step. A Zi that waits for a window
step placed after it closes one. A Zi that waits for a step of D: for a swap of neighbours
(X, Y becomes Y, X) that is exactly a cycle (Y waits for something downstream of X, which
now waits for Y); for a longer window that step's end may change: no answer. D is searched
depth-first from the window over steps that end no later than the latest producer asked
about (ends never decrease along an edge), within a budget (past it: no answer).

**Rounding.** B adds the same durations as a full run, in another order (tails run
backwards), so B may differ from the kernel's double in its last bits. Each sum has at most
2 x size terms, all non-negative and at most L, so its rounding error is below
``2 size 2^-53 L``. :func:`tolerance` is eight times that: a window step counts as not
critical only when ``end + tail < L - tolerance``, B counts as longer only above
``L + tolerance`` and as equal within it (the answer is then L). The answer equals the
kernel's step time to within ``2 x tolerance``. Where it stays L it is the old double,
which a full run of the new order gives too, unless two paths tie to within rounding.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from pipebubble.sim.kernel import Program, run

_INF = float("inf")
_U = 2.0 ** -53  # the unit roundoff of a double


def tolerance(size: int, step: float) -> float:
    """The rounding allowance of a step time ``step`` over a program of ``size`` steps (see
    the module docstring); 0 when nothing takes time.

    >>> tolerance(1000, 100.0) < 1e-9
    True
    """
    return 16 * (size + 1) * _U * step


class Tails:
    """The tails of a program without Overlap pairs (each step's output waited for by one
    step at most): the kernel's loop over the reversed program (module docstring), kept up
    to date as the program changes. :meth:`place` follows a changed stretch into the
    reversed program and remembers the reversed steps whose inputs changed (seeds);
    :meth:`update` re-evaluates backwards from them, only where a tail changes;
    :meth:`mark` marks what may have changed (every step the stretch's steps wait for,
    directly or not: they end no later than the stretch's last step, so on each rank a
    first run of steps ending by then); :meth:`refresh` runs the loop again over the
    marked steps only (what they wait for in the reversed program, the tails of what
    follows them, did not change): the update's fallback when the change reaches far.

    >>> from pipebubble.schedules import get_schedule
    >>> from pipebubble.costs import CostModel
    >>> from pipebubble.ir.check import flat_actions
    >>> from pipebubble.sim.kernel import compile_program
    >>> s = get_schedule("1f1b", ranks=2, microbatches=2)
    >>> prog = compile_program(s, flat_actions(s), CostModel().resolve(2, 1))
    >>> t = Tails(prog.producer, prog.lag, prog.duration, prog.initial_end, prog.first,
    ...           prog.last)
    >>> [t.tail(q) for q in range(prog.first[0], prog.last[0] + 1)]  # rank 0: F F B B
    [8.0, 5.0, 2.0, 0.0]

    Rank 0's steps end at 1, 2, 6 and 9: end + tail is 9 (the step time) for all but the
    second forward, which has 2 of slack.
    """

    FAR = 0.03  # the share of steps after which an update hands over to the marked re-run
    FLOOR = 64  # (plus this many)

    def __init__(self, producer: Sequence[int], lag: Sequence[float],
                 duration: Sequence[float], initial: Sequence[float], first: list[int],
                 last: list[int]):
        import numpy as np

        size = len(producer)
        prod = np.asarray(producer, dtype=np.int64)
        lags = np.asarray(lag, dtype=np.float64)
        lengths = np.array(last) - np.array(first) + 1
        q = np.concatenate([np.arange(f, f + n) for f, n in zip(first, lengths, strict=True)])
        mirror = np.arange(size)  # rank r's position f + i <-> last[r] - i
        mirror[q] = np.repeat(np.array(first) + np.array(last), lengths) - q
        movable = np.zeros(size, dtype=bool)
        movable[q] = True
        waits = q[movable[prod[q]]]  # the steps that wait for another step
        rprod = np.full(size, size - 1, dtype=np.int64)  # (size - 1: never)
        rprod[q] = 0  # step 0 doubles as "no dependency" (it ends at 0)
        rlag = np.zeros(size)
        rprod[mirror[prod[waits]]] = mirror[waits]
        rlag[mirror[prod[waits]]] = lags[waits]
        rdur = np.zeros(size)
        rdur[mirror[q]] = np.asarray(duration, dtype=np.float64)[q]
        self.mirror = mirror.tolist()
        self.first, self.last = first, last
        self.rprod, self.rlag, self.rdur = _ints(rprod), _doubles(rlag), _doubles(rdur)
        self.rend = run(Program(self.rprod, self.rlag, self.rdur, initial, first, last,
                                None, 0))
        self.stale = [0] * len(first)  # per rank: how many of its first steps are marked
        self.producer = producer  # the forward program's (kept up to date by its owner)
        rank = np.full(size, -1, dtype=np.int64)
        rank[q] = np.repeat(np.arange(len(first)), lengths)
        self.rank = rank.tolist()  # position (forward or mirrored) -> its rank (-1: none)
        self.seeds: set[int] = set()  # reversed steps whose inputs changed since the update
        self.keys: dict[int, float] = {}  # (their heap keys, where not their reach)
        self._queued = bytearray(size)
        self.evaluated = 0  # reversed steps evaluated by updates (a measure of their work)
        self.changed = 0  # and how many of them changed their tail (updates that sufficed)

    def tail(self, q: int) -> float:
        """The tail of position q (the reversed step's start: the kernel's max)."""
        m = self.mirror[q]
        rend = self.rend
        t = rend[m - 1]
        x = rend[self.rprod[m]] + self.rlag[m]
        return x if x > t else t

    def tails(self, positions):
        """The tails of these positions (a numpy array of them), vectorised: the same
        max as :meth:`tail`."""
        import numpy as np

        m = np.asarray(self.mirror, dtype=np.int64)[positions]
        rend = np.frombuffer(self.rend, dtype=np.float64)
        rprod = np.frombuffer(self.rprod, dtype=np.int64)
        rlag = np.frombuffer(self.rlag, dtype=np.float64)
        return np.maximum(rend[m - 1], rend[rprod[m]] + rlag[m])

    def reach(self, q: int) -> float:
        """Position q's duration + tail (the reversed step's end)."""
        return self.rend[self.mirror[q]]

    def place(self, p0: int, p1: int, node_at: list[int], pos_of: list[int],
              need: list[int], lag: list[float], duration: list[float],
              consumers: list[list[int]], rank_at: list[int],
              was: dict[int, int] | None = None) -> None:
        """Positions p0..p1 hold other nodes now (``node_at``; node x waits for ``need[x]``,
        which is a step where ``rank_at`` is >= 0): follow them in the reversed program.
        ``was``: where each of them stood before (their old reaches travel with them, the
        values :meth:`update` starts from); the reversed steps whose inputs changed are
        remembered as seeds of the next update."""
        mirror, rprod, rlag, rdur = self.mirror, self.rprod, self.rlag, self.rdur
        seeds = self.seeds
        rend = self.rend
        if was is not None:
            moved = [rend[mirror[was[node_at[q]]]] for q in range(p0, p1 + 1)]
            for q, v in zip(range(p0, p1 + 1), moved, strict=True):
                rend[mirror[q]] = v
        # The stretch's update key: the least of its old reaches (they travelled with its
        # steps, so they are no order of the new program), the stretch then in its order.
        k0 = min(rend[mirror[q]] for q in range(p0, p1 + 1))
        keys = self.keys
        for q in range(p0, p1 + 1):
            m = mirror[q]
            if k0 < keys.get(m, _INF):
                keys[m] = k0
        if p0 > self.first[rank_at[p0]]:
            seeds.add(mirror[p0 - 1])  # the step before the stretch: another one after it
        for q in range(p0, p1 + 1):
            seeds.add(mirror[q])
            x = node_at[q]
            m = mirror[q]
            rdur[m] = duration[x]
            c = consumers[x]
            if c:
                rprod[m], rlag[m] = mirror[pos_of[c[0]]], lag[c[0]]
            else:
                rprod[m], rlag[m] = 0, 0.0
            j = need[x]
            if rank_at[j] >= 0:
                rprod[mirror[pos_of[j]]], rlag[mirror[pos_of[j]]] = m, lag[x]
                seeds.add(mirror[pos_of[j]])

    def mark(self, end: list[float], top: float) -> None:
        """Mark, on every rank, the steps that end by ``top`` (``end``: the program's
        ends, which never decrease along a rank)."""
        from bisect import bisect_right

        stale = self.stale
        for r, (lo, hi) in enumerate(zip(self.first, self.last, strict=True)):
            n = bisect_right(end, top, lo, hi + 1) - lo
            if n > stale[r]:
                stale[r] = n

    @property
    def marked(self) -> int:
        """How many steps are marked."""
        return sum(self.stale)

    @property
    def dirty(self) -> bool:
        """Whether a change placed since the last update may have changed some tails."""
        return bool(self.seeds) or any(self.stale)

    def update(self) -> bool:
        """Bring the tails up to date after the changes placed since the last update:
        *backwards only where they change*. The seeds (the reversed steps whose inputs
        changed) are evaluated again with the kernel's arithmetic, and a reversed step whose
        end (a reach) moves passes the change on to the reversed steps that read it (the
        step before it on its rank; the step its forward twin waits for); where a reach
        stays the same, the change stops. A heap keyed by the old reaches (a topological
        order of the old reversed program) keeps re-evaluations few. The result is the
        loop's fixpoint, the doubles a full backward run gives. Past :attr:`FAR` of the
        steps it is undone and the marked steps run again instead (:meth:`refresh`);
        returns whether the update alone sufficed."""
        import heapq

        seeds = self.seeds
        if not seeds:
            self.refresh()
            return True
        rend, rprod, rlag, rdur = self.rend, self.rprod, self.rlag, self.rdur
        mirror, producer, rank, last = self.mirror, self.producer, self.rank, self.last
        queued = self._queued
        keys = self.keys
        heap = [(keys.get(m, rend[m]), m) for m in seeds]
        self.keys = {}
        for m in seeds:
            queued[m] = 1
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        budget = start = int(len(rend) * self.FAR) + self.FLOOR
        undo = []
        while heap:
            _, m = pop(heap)
            queued[m] = 0
            budget -= 1
            if not budget:
                for _, m in heap:
                    queued[m] = 0
                for m, e in reversed(undo):
                    rend[m] = e
                self.evaluated += start
                self.seeds = set()
                self.refresh()
                return False
            t = rend[m - 1]
            x = rend[rprod[m]] + rlag[m]
            if x > t:
                t = x
            t += rdur[m]
            if t != rend[m]:
                undo.append((m, rend[m]))
                rend[m] = t
                r = rank[m]
                if m < last[r] and not queued[m + 1]:
                    queued[m + 1] = 1
                    push(heap, (rend[m + 1], m + 1))
                j = producer[mirror[m]]
                if rank[j] >= 0:
                    mj = mirror[j]
                    if not queued[mj]:
                        queued[mj] = 1
                        push(heap, (rend[mj], mj))
        self.evaluated += start - budget
        self.changed += len(undo)
        self.seeds = set()
        self.stale = [0] * len(self.stale)
        return True

    def refresh(self) -> None:
        """Run the reversed program's loop again over the marked steps."""
        self.seeds, self.keys = set(), {}
        if not any(self.stale):
            return
        rend = self.rend
        frontier = []
        for r, n in enumerate(self.stale):
            hi = self.last[r] + 1
            frontier.append(hi - n)
            rend[hi - n:hi] = array("d", [_INF]) * n
        self.rend = run(Program(self.rprod, self.rlag, self.rdur, rend, frontier, self.last,
                                None, 0))
        self.stale = [0] * len(self.stale)


class Window:
    """The step time of a window rewrite from heads and tails (the module docstring), over
    a program's static shape: node ``x`` waits for node ``need[x]`` (lag ``lag[x]``),
    lasts ``duration[x]``; ``consumers[x]`` wait for it; ``rank_at[q]`` is position q's
    rank (-1: not a step), ``last[r]`` rank r's last position."""

    BUDGET = 512  # steps the deadlock search may visit before it gives up

    def __init__(self, need: list[int], lag: list[float], duration: list[float],
                 consumers: list[list[int]], rank_at: list[int], last: list[int]):
        self.need, self.lag, self.duration = need, lag, duration
        self.consumers, self.rank_at, self.last = consumers, rank_at, last

    def step_time(self, t: Tails, end: list[float], pos_of: list[int], node_at: list[int],
                  r: int, p0: int, nodes: list[int], step: float, tol: float) -> float | None:
        """The step time once rank r's positions ``p0 ..`` hold ``nodes`` (node ids, a
        permutation of what they hold now), given the current ends, positions, tails and
        step time ``step``: ``inf`` for a deadlock, None where only a re-time can tell."""
        need, lag, duration, consumers = self.need, self.lag, self.duration, self.consumers
        at = {x: i for i, x in enumerate(nodes)}
        p1 = p0 + len(nodes) - 1
        targets = []
        for i, x in enumerate(nodes):
            k = at.get(need[x])
            if k is not None:
                if k >= i:  # waits for a window step now after it on its own rank
                    return _INF
            elif self.rank_at[need[x]] >= 0:  # (node ids are the first positions)
                targets.append(pos_of[need[x]])
        if targets:
            hit = self._reaches(end, pos_of, node_at, p0, p1, targets)
            if hit is None:
                return None
            if hit:
                return _INF if len(nodes) == 2 else None
        # Heads: the new ends, in the new order, from what the window waits for.
        t0 = end[p0 - 1]
        ends = []
        for x in nodes:
            k = at.get(need[x])
            v = (ends[k] if k is not None else end[pos_of[need[x]]]) + lag[x]
            if v > t0:
                t0 = v
            t0 += duration[x]
            ends.append(t0)
        # Tails: backwards from the old reaches of what follows the window.
        reach = t.reach
        after = reach(p1 + 1) if p1 < self.last[r] else 0.0
        reaches = [0.0] * len(nodes)
        best = -_INF
        for i in range(len(nodes) - 1, -1, -1):
            x = nodes[i]
            top = after
            for c in consumers[x]:
                k = at.get(c)
                v = (reaches[k] if k is not None else reach(pos_of[c])) + lag[c]
                if v > top:
                    top = v
            if ends[i] + top > best:
                best = ends[i] + top
            after = reaches[i] = top + duration[x]
        if best > step + tol:
            return best
        if best >= step - tol:
            return step
        for q in range(p0, p1 + 1):
            if end[q] + t.tail(q) >= step - tol:
                return None  # a critical step moved and the path through it got shorter
        return step

    def _reaches(self, end: list[float], pos_of: list[int], node_at: list[int], p0: int,
                 p1: int, targets: list[int]) -> bool | None:
        """Whether a path of the current program leads from positions p0..p1 to one of
        ``targets`` (None: the search ran past :attr:`BUDGET`)."""
        goal = set(targets)
        bound = max(end[q] for q in targets)
        rank_at, last, consumers = self.rank_at, self.last, self.consumers
        seen = set(range(p0, p1 + 1))
        stack = list(seen)
        budget = self.BUDGET
        while stack:
            v = stack.pop()
            nxt = [pos_of[c] for c in consumers[node_at[v]]]
            if v < last[rank_at[v]]:
                nxt.append(v + 1)
            for w in nxt:
                if w in goal:
                    return True
                if w not in seen and end[w] <= bound:
                    budget -= 1
                    if not budget:
                        return None
                    seen.add(w)
                    stack.append(w)
        return False


def _doubles(values) -> array:
    out = array("d")
    out.frombytes(memoryview(values.astype("float64")).cast("B"))
    return out


def _ints(values) -> array:
    out = array("q")
    out.frombytes(memoryview(values.astype("int64")).cast("B"))
    return out
