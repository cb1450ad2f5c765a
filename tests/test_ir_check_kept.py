"""``ir/check.flat_actions`` keeps the arrays of its last few schedules and remembers, for
many more, that they were checked: a schedule whose arrays were dropped is laid out again
(the same arrays) without being checked again, and an invalid schedule is never let by."""

from __future__ import annotations

import numpy as np
import pytest

from pipebubble.ir import check
from pipebubble.ir.schedule import Action, ScheduleError, make_schedule
from pipebubble.schedules import get_schedule


def test_a_dropped_schedule_is_laid_out_again_and_not_checked_again(monkeypatch):
    s = get_schedule("1f1b", 3, 5)
    first = check.flat_actions(s)
    others = [get_schedule("gpipe", 2, m) for m in range(1, check.KEEP_FLAT + 2)]
    for o in others:  # its arrays drop out of the kept ones
        check.flat_actions(o)
    assert check._kept.get(s) is None
    calls = []
    real = check._valid
    monkeypatch.setattr(check, "_valid", lambda *a: calls.append(1) or real(*a))
    again = check.flat_actions(s)
    assert calls == []  # known valid: not checked again
    assert again.offsets == first.offsets
    for name in ("stage", "kind", "microbatch", "pair", "rank"):
        assert np.array_equal(getattr(again, name), getattr(first, name))
    # 1F1B, 3 ranks x 5 microbatches: rank 0 runs 10 actions (5 F, 5 B)
    assert again.offsets[:2] == [0, 10]


def test_an_invalid_schedule_still_raises_every_time():
    # stage 0's B of microbatch 0 before its F: invalid
    bad = make_schedule("bad", [[Action(0, "B", 0), Action(0, "F", 0)]], 1, 1)
    for _ in range(2):
        with pytest.raises(ScheduleError):
            check.flat_actions(bad)


def test_live_kept_holds_the_newest_and_forgets_the_collected():
    import gc

    class Obj:
        pass

    kept = check.LiveKept(2)
    a, b, c = Obj(), Obj(), Obj()
    for o, v in ((a, 1), (b, 2), (c, 3)):
        assert kept.put(o, v)
    assert len(kept) == 2 and kept.get(a) is None  # the oldest dropped
    assert (kept.get(c), kept.get(b)) == (3, 2)  # b asked for last: c is now the oldest
    d = Obj()
    kept.put(d, 4)
    assert kept.get(c) is None and (kept.get(b), kept.get(d)) == (2, 4)
    c = d
    del b
    gc.collect()
    assert len(kept) == 1 and kept.get(c) == 4  # b collected: its value is gone
    assert kept.put(5, "x") is False and kept.get(5) is None  # an int has no weak reference
