import pytest

from pipebubble.ir.schedule import (
    Action,
    Overlap,
    ScheduleError,
    make_schedule,
    parse_step,
    validate,
)
from pipebubble.schedules import get_schedule


def test_action_text_round_trips():
    for text in ["0F0", "2F5", "13B7", "1I2", "1W2"]:
        assert str(Action.from_str(text)) == text
    assert Action.from_str("2F5") == Action(2, "F", 5)


@pytest.mark.parametrize("bad", ["", "F5", "2X5", "2F", "a2F5", "2 F 5"])
def test_action_parse_errors_name_the_text(bad):
    with pytest.raises(ScheduleError, match="cannot parse"):
        Action.from_str(bad)


def test_overlap_text():
    step = parse_step("(0F7;7B3)OVERLAP_F_B")
    assert step == Overlap(Action(0, "F", 7), Action(7, "B", 3))
    assert str(step) == "(0F7;7B3)"


def test_registered_schedules_validate_and_names_are_case_insensitive():
    assert get_schedule("GPipe", 3, 4) == get_schedule("gpipe", 3, 4)
    for name in ["gpipe", "1f1b"]:
        for p in range(1, 6):
            for m in range(1, 9):
                validate(get_schedule(name, p, m))


def test_1f1b_warmup_is_p_minus_r_minus_1():
    s = get_schedule("1f1b", 4, 8)
    for r, order in enumerate(s.orders):
        first_b = next(i for i, a in enumerate(order) if a.kind == "B")
        assert first_b == (4 - r - 1) + 1  # warm-up forwards, then one more F, then B


def _two_rank(orders, **kw):
    return make_schedule("t", [[Action.from_str(x) for x in o.split()] for o in orders], 2, 1,
                         **kw)


@pytest.mark.parametrize(
    "orders, message",
    [
        (["0F0", "1F0 1B0"], "missing backward 0B0"),
        (["0F0 0B0 0B0", "1F0 1B0"], "rank 0, action 0B0: duplicated"),
        (["0B0 0F0", "1F0 1B0"], "rank 0, action 0B0: backward before its forward"),
        (["0F0 0W0 0I0", "1F0 1B0"], "rank 0, action 0W0: W without its I"),
        (["0F0 0I0 0B0 0W0", "1F0 1B0"], "both I and B|both B and I"),
        (["0F0 0I0", "1F0 1B0"], "missing action 0W0"),
        (["0F0 1F0 0B0", "1B0"], "rank 0, action 1F0: stage 1 lives on rank 1"),
        (["0F0 0B0", "1F0 1B1"], "microbatch 1 out of range"),
    ],
)
def test_validate_names_rank_and_action(orders, message):
    with pytest.raises(ScheduleError, match=message):
        validate(_two_rank(orders))


def test_unknown_kind_rejected():
    with pytest.raises(ScheduleError, match="unknown kind"):
        validate(make_schedule("t", [[Action(0, "F", 0), Action(0, "X", 0)]], 1, 1))


def test_v_placement():
    s = make_schedule("t", [[], []], 4, 1, placement="v")
    assert s.stage_to_rank == (0, 1, 1, 0)
    with pytest.raises(ScheduleError, match="v placement needs 2 stages per rank"):
        make_schedule("t", [[], []], 3, 1, placement="v")


def test_compact_orders_behave_as_tuples_of_actions():
    """Generators store orders as RankOrder arrays; every consumer still sees Actions."""
    import pickle

    from pipebubble.ir.orders import RankOrder

    s = get_schedule("1f1b", 2, 3)
    order = s.orders[1]
    assert isinstance(order, RankOrder)
    plain = tuple(Action.from_str(x) for x in "1F0 1B0 1F1 1B1 1F2 1B2".split())
    assert order == plain and plain == order and list(order) == list(plain)
    assert hash(order) == hash(plain) and repr(order) == repr(plain)
    assert order[3] == Action(1, "B", 1) and order[-1] == Action(1, "B", 2)
    assert order[1:3] == plain[1:3] and order.index(Action(1, "F", 2)) == 4
    assert Action(1, "W", 0) not in order and len(order) == 6
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.to_text().splitlines()[1] == "1F0 1B0 1F1 1B1 1F2 1B2"
    assert s.num_actions() == 12 and not s.uses_split_backward()
    assert get_schedule("zb-h1", 2, 2).uses_split_backward()


@pytest.mark.parametrize("name, chunks", [("gpipe", None), ("1f1b", None), ("zb-h1", None),
                                          ("zb-h2", None), ("interleaved-1f1b", 2),
                                          ("interleaved-1f1b", 3), ("looped-bfs", 2),
                                          ("zbv", None)])
def test_compact_generators_equal_plain_tuples(name, chunks):
    """The same schedule written as plain tuples validates and simulates identically."""
    from pipebubble import simulate

    for p in (1, 2, 3, 5):
        for m in (1, 2, 4, 7):
            try:
                s = get_schedule(name, p, m, chunks)
            except ScheduleError:
                continue
            plain = make_schedule(s.name, [tuple(o) for o in s.orders], s.num_stages,
                                  s.num_microbatches, placement=s.stage_to_rank)
            assert plain.orders == s.orders
            assert list(simulate(plain).start) == list(simulate(s).start)


def test_compact_order_mistakes_get_validates_messages():
    """validate() names a bad action in a RankOrder exactly as in a tuple order."""
    import numpy as np

    from pipebubble.ir.orders import RankOrder

    s = get_schedule("1f1b", 2, 2)
    o = s.orders[0]
    cases = {
        "duplicated": RankOrder(o.stage, o.kind, np.array([0, 1, 0, 0])),
        "microbatch": RankOrder(o.stage, o.kind, np.array([0, 1, 0, 2])),
        "placement": RankOrder(np.array([0, 1, 0, 0]), o.kind, o.microbatch),
    }
    for what, bad in cases.items():
        compact = make_schedule("t", [bad, s.orders[1]], 2, 2)
        plain = make_schedule("t", [tuple(bad), s.orders[1]], 2, 2)
        with pytest.raises(ScheduleError) as a:
            validate(compact)
        with pytest.raises(ScheduleError) as b:
            validate(plain)
        assert str(a.value) == str(b.value), what


def test_get_schedule_hands_out_one_object_per_request_and_stays_bounded(monkeypatch):
    from collections import OrderedDict

    from pipebubble.schedules import registry

    a = get_schedule("v-half", 4, 8)
    assert get_schedule("v-half", 4, 8) is a  # the same request: the same (immutable) order
    assert get_schedule("v-half", 4, 9) is not a
    assert get_schedule("interleaved-1f1b", 4, 8, chunks=2) is not get_schedule(
        "interleaved-1f1b", 4, 8, chunks=3)
    monkeypatch.setattr(registry, "CACHE_ACTIONS", 100)  # 1F1B p=4 m=8: 64 steps
    monkeypatch.setattr(registry, "_cache", OrderedDict())  # a fresh one, put back after
    monkeypatch.setattr(registry, "_cached_actions", 0)
    first = get_schedule("1f1b", 4, 8)
    get_schedule("gpipe", 4, 8)  # 64 more: the least recently used (1F1B) is dropped
    assert registry._cached_actions <= 100
    again = get_schedule("1f1b", 4, 8)
    assert again is not first and again == first
