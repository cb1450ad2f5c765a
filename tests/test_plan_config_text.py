"""``plan --config`` text: each item KEY=VALUE once, degrees in plain ASCII digits.

Found by the generated fuzz (tests/fuzz_cases.py, the config surface): ``tp=٢`` was read as
tp=2 by Python's ``int`` (which takes any Unicode digit, ``1_0`` and ``+2`` too) while every
flag refuses such text, and ``tp=2,tp=4`` silently kept the last value.
"""

from __future__ import annotations

import re

import pytest

from pipebubble.errors import UserError
from pipebubble.plan.config import parse_config


@pytest.mark.parametrize("text", ["tp=٢", "tp=1_0", "tp=+2", "pp=２", "dp=1e3", "sp=١"])
def test_degrees_are_ascii_digits(text):
    key, _, value = text.partition("=")
    with pytest.raises(UserError, match=re.escape(f"config {key}={value!r} must be")):
        parse_config(text, gpus=64)


def test_a_key_given_twice_is_refused():
    with pytest.raises(UserError, match="^config gives tp twice; give each key once"):
        parse_config("tp=2,pp=2,tp=4", gpus=64)
    with pytest.raises(UserError, match="gives sharding twice"):
        parse_config("sharding=fsdp,SHARDING=ddp", gpus=64)


def test_a_huge_degree_is_one_line_not_a_conversion_error():
    with pytest.raises(UserError, match="a 5000-digit number is too large"):
        parse_config("tp=" + "9" * 5000, gpus=64)


def test_valid_text_still_parses():
    assert parse_config(" TP = 08 , pp=2, sp=0, sharding=FSDP", gpus=64) == {
        "tp": 8, "pp": 2, "sp": 0, "sharding": "fsdp"}


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_an_empty_config_is_refused_not_ignored(text):
    """``plan --config ''`` ran the plain search as if no --config were given."""
    with pytest.raises(UserError, match=re.escape(f"config {text!r} is empty; give "
                                                  "KEY=VALUE items")):
        parse_config(text, gpus=8)
