"""The one checked profile reader (plan/profile_reader.py): every field's type, finiteness and
range, messages naming the file, the layer and the field; and what used to slip through
(wrong-type optional fields, "nan" strings, negatives, all-zero, denormal, 1e308)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.plan.profile import Profile, ProfileError
from pipebubble.plan.profile_reader import BOUNDS, FIELDS, OPTIONAL, check_document

GOOD = {"name": "blk", "forward": 1e-3, "backward": 2e-3, "params": 100,
        "activation_bytes": 1024, "flops": 1e6}


def doc(**extra) -> dict:
    return {"batch": 1, "layers": [{**GOOD, "name": "embed"}, {**GOOD, **extra}]}


def read_profile(path: str) -> Profile:
    return Profile.load(path)


def check_profile(data: object, where: str) -> Profile:
    return Profile.from_dict(data, where)


def test_the_required_fields_are_the_profile_format():
    from pipebubble.plan import profile

    assert profile.FIELDS is FIELDS and check_document(doc(), "x") == doc()


def write(tmp_path, data) -> str:
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(data))
    return str(path)


BAD_VALUES = [[1], {"a": 1}, "nan", "inf", "1.0", True, None, -1, -1e-3, 1e308, 5e-324]


@pytest.mark.parametrize("field", sorted(BOUNDS))
@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_every_numeric_field_of_the_wrong_type_or_range_names_file_layer_field(
        tmp_path, field, value):
    path = write(tmp_path, doc(**{field: value}))
    with pytest.raises(ProfileError) as info:
        read_profile(path)
    msg = str(info.value)
    assert msg.startswith(f"profile file {path!r}: layer 1 ('blk'): {field} must be ")
    assert "\n" not in msg and repr(value)[:20] in msg or "digit" in msg


def test_optional_fields_are_exactly_the_ones_the_planner_reads():
    from pipebubble.plan import layercosts

    assert set(OPTIONAL) == set(layercosts._SCALED) - {"forward", "backward",
                                                        "activation_bytes"}


@pytest.mark.parametrize("data, needle", [
    ({"layers": [{**GOOD, "forward": 0, "backward": 0}]},
     "every layer's forward and backward is 0 s"),
    ({"layers": [{**GOOD, "weight_backward": 3e-3}]}, "weight_backward 0.003 s is more than "
     "backward 0.002 s"),
    ({"layers": [{**GOOD, "modules": "a"}]}, "modules must be a list of non-empty strings"),
    ({"layers": [{**GOOD, "modules": ["a", ""]}]}, "modules must be a list"),
    ({"layers": [{**GOOD, "type": 3}]}, "type must be a string, got 3"),
    ({"layers": [{**GOOD, "params": 1.5}]}, "params must be a whole number, got 1.5"),
    ({"layers": [GOOD, GOOD]}, "name 'blk' appears twice"),
    ({"layers": [{**GOOD, "name": ""}]}, "name must be a non-empty string"),
    ({"layers": [{**GOOD, "params": 10**25}]}, "params must be 0 or between"),
    ({"layers": "x"}, "'layers' must be a list"),
    ([], "must be a JSON object"),
])
def test_whole_profile_checks(tmp_path, data, needle):
    path = write(tmp_path, data)
    with pytest.raises(ProfileError, match=".*") as info:
        read_profile(path)
    assert needle in str(info.value) and repr(path) in str(info.value)


def test_a_good_profile_reads_back_exactly(tmp_path):
    data = doc(output_bytes=4096, weight_backward=1e-3, activation_bytes_full=8,
               recompute_time_full=1e-3, modules=["blk.attn", "blk.mlp"])
    prof = read_profile(write(tmp_path, data))
    assert prof.as_dict() == data
    prof.save(tmp_path / "again.json")
    assert Profile.load(tmp_path / "again.json").as_dict() == data


_number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**20),
                    st.text(max_size=3), st.booleans(), st.none(), st.lists(st.integers(),
                                                                            max_size=2))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(BOUNDS)), _number, max_size=4))
def test_whatever_the_fields_hold_the_reader_raises_profile_error_or_gives_bounded_costs(
        fields):
    """No TypeError, no overflow: a profile either is refused with a ProfileError or its
    LayerCosts are finite at every microbatch size the planner tries."""
    import numpy as np

    from pipebubble.plan.layercosts import ProfileSet

    try:
        prof = check_profile(doc(**fields), "p.json")
    except ProfileError as exc:
        assert str(exc).startswith("p.json: ")
        return
    costs = ProfileSet([prof]).at(4096)
    for name in ("f", "i", "w", "act", "act_w", "out"):
        assert np.isfinite(getattr(costs, name)).all() and (getattr(costs, name) >= 0).all()


@pytest.mark.parametrize("field, value", [("output_bytes", "nan"), ("forward", 1e308),
                                          ("weight_backward", [1]), ("backward", 5e-324)])
def test_plan_and_partition_refuse_a_hostile_profile_in_one_line(tmp_path, run_cli, field,
                                                                  value):
    path = write(tmp_path, doc(**{field: value}))
    for args in (["plan", "--profile", path, "--gpus", "2", "--global-batch", "4", "--json"],
                 ["partition", "--profile", path, "-p", "2", "--json"]):
        rc, out, err = run_cli(*args)
        assert rc == 2 and out == "", (args, out)
        assert err.count("\n") == 1 and f"layer 1 ('blk'): {field}" in err and path in err


def test_json_output_never_holds_nan_or_infinity(tmp_path, run_cli):
    path = write(tmp_path, doc(output_bytes=2**60, forward=1e6, backward=1e6))
    rc, out, err = run_cli("plan", "--profile", path, "--gpus", "2", "--global-batch", "4",
                           "--json")
    assert rc == 0, err
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
