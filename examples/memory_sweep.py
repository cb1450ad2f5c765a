"""Regenerate the README's memory figure: step time against the activation-memory limit.

    python examples/memory_sweep.py [OUT_DIR]     # default docs/img

The same as::

    pipebubble sweep -p 8 -m 32 --memory-limit 1..16:0.5 --f 1 --b 2 --w 1 --comm 0.05 \\
        --mem-b 1 --mem-w 0.5 --csv docs/img/memory_sweep.csv --png docs/img/memory_sweep.png

Costs of a GPT-like layer stack, per rank-share: F = 1, B = 2 (I = W = 1), a P2P hop of
0.05, M_B = 1 (the activation memory one microbatch's forward leaves on a rank), of which
M_W = 0.5 stays until W. p = 8 ranks, m = 32 microbatches.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipebubble.cli import main


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rc = main(["sweep", "-p", "8", "-m", "32", "--memory-limit", "1..16:0.5", "--f", "1",
               "--b", "2", "--w", "1", "--comm", "0.05", "--mem-b", "1", "--mem-w", "0.5",
               "--csv", str(out / "memory_sweep.csv"), "--png", str(out / "memory_sweep.png")])
    if rc:
        raise SystemExit(rc)


if __name__ == "__main__":
    run(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img"))
