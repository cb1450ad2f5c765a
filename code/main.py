"""The lesson's program: a 4-stage pipeline over 8 microbatches (run: python3 code/main.py).

Prints the per-microbatch trace, a stage x time Gantt chart, and the bubble next to the
closed form (N-1)/(M+N-1) on two clocks: the cost-model clock (simulated: every stage takes
F=1, B=2, so the bubble is the closed form exactly) and the measured clock (each pass's real
duration on this machine). The pieces it uses are `pipebubble.PipelineStage`,
`pipebubble.Pipeline` and `pipebubble.bubble_fraction`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipebubble.demo import run_demo  # noqa: E402

if __name__ == "__main__":
    run_demo()
