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
