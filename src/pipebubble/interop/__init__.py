"""Interoperation with other pipeline tools' schedule formats.

- :mod:`.torch_csv`: torch.distributed.pipelining's compute-only CSV (read and write).
- :mod:`.timeline_json`: the JSON object ``simulate --json`` and ``run --json`` print (and
  the explorer serves), written and read back.
"""

from .torch_csv import parse_torch_csv, read_torch_csv, to_torch_csv, write_torch_csv

__all__ = ["parse_torch_csv", "read_torch_csv", "to_torch_csv", "write_torch_csv"]
