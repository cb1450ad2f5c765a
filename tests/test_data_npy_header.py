"""``run --data FILE.npy``: the header is checked against the bytes before np.load allocates.

Found by the generated fuzz (tests/fuzz_cases.py, the data surface): a 100-byte .npy whose
header claims 10^12 uint16 tokens ended in numpy's "Unable to allocate 1.82 TiB" traceback.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from pipebubble.errors import UserError
from pipebubble.runtime.data import read_tokens


def _header(text: str) -> bytes:
    raw = text.encode()
    raw = raw.ljust(((len(raw) + 11) // 64 + 1) * 64 - 11) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw


class _Pwn:
    def __reduce__(self):
        return (print, ("pwned",))


def _object_array() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([_Pwn()] * 3, dtype=object), allow_pickle=True)
    return buf.getvalue()


@pytest.mark.parametrize(("data", "words"), [
    (_header("{'descr': '<u2', 'fortran_order': False, 'shape': (1000000000000,), }")
     + b"\0" * 4, "the header says shape (1000000000000,), 2,000,000,000,000 bytes, but only 4 "
     "follow it: truncated or damaged"),
    (_header("{'descr': '<i8', 'fortran_order': False, 'shape': (5, 2), }") + b"\0" * 79,
     "shape (5, 2), 80 bytes, but only 79 follow it"),
    (b"\x93NUMPY\x03\x00" + bytes(100), "version 3.0, not 1.0 or 2.0"),
    (_object_array(), "an object array (a pickle), not numbers"),
])
def test_a_header_that_does_not_match_the_file_is_one_line(tmp_path, capsys, data, words):
    path = tmp_path / "tok.npy"
    path.write_bytes(data)
    with pytest.raises(UserError) as err:
        read_tokens(path)
    assert str(err.value).startswith(f"data {str(path)!r}: not a .npy array ("), err.value
    assert words in str(err.value)
    assert "pwned" not in capsys.readouterr().out  # nothing unpickled


@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<i4", "u1"])
def test_a_whole_file_is_read(tmp_path, dtype):
    path = tmp_path / "tok.npy"
    np.save(path, np.arange(40, dtype=dtype).reshape(4, 10))
    assert read_tokens(path).tolist() == list(range(40))
