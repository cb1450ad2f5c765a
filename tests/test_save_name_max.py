"""``run --save DIR`` with a name over the file system's limit: one line, not the OSError of
looking up ``DIR.old`` (found by the generated fuzz, tests/fuzz_cases.py, ckpt surface)."""

from __future__ import annotations

import pytest

from pipebubble.errors import UserError
from pipebubble.runtime.checkpoint import check_save_dir


def test_a_name_over_name_max_is_one_line(tmp_path):
    with pytest.raises(UserError, match="the name is 300 bytes; at most 247 fit this file "
                                        r"system \(with '.partial'\)"):
        check_save_dir(str(tmp_path / ("a" * 300)))


def test_a_name_that_fits_is_accepted(tmp_path):
    assert check_save_dir(str(tmp_path / ("a" * 247))).name == "a" * 247
