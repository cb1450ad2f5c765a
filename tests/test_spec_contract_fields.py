"""The ModelSpec contract covers its plain fields too: ``name``, ``description``, ``metadata``.

Found by the generated fuzz (tests/fuzz_cases.py, the spec surface): a builder returning
``ModelSpec(None, ...)`` passed the checks and ended ``run --local`` in a TypeError traceback
where the report adds to the model's description.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipebubble import ModelSpec
from pipebubble.errors import UserError
from pipebubble.models.spec import check_spec


def _spec(**kw) -> ModelSpec:
    fields = {"name": "toy", "layers": [nn.Linear(2, 2), nn.Linear(2, 2)],
              "make_batch": lambda n, g: (torch.zeros(n, 2), torch.zeros(n, 2)),
              "loss_fn": nn.functional.mse_loss, **kw}
    return ModelSpec(**fields)


@pytest.mark.parametrize("name, got", [(None, "a NoneType"), ("", "''"), ("  ", "'  '"),
                                       (3, "a int")])
def test_the_name_is_a_non_empty_string(name, got):
    with pytest.raises(UserError) as err:
        check_spec(_spec(name=name))
    assert str(err.value) == ("a ModelSpec's name must be a non-empty string (the model's "
                              f"name in reports), got {got}")


@pytest.mark.parametrize("field, value, kind", [("description", None, "str"),
                                                ("metadata", [], "dict")])
def test_description_and_metadata_have_their_types(field, value, kind):
    with pytest.raises(UserError, match=f"model 'toy': {field} must be a {kind}, got a "):
        check_spec(_spec(**{field: value}))


def test_a_valid_spec_passes():
    check_spec(_spec(description="two linears", metadata={"vocab": 2}))
