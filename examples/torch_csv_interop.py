"""Round trip with torch.distributed.pipelining: export ours, load in torch, read torch's.

1. Export pipebubble's ZB-V schedule as torch's compute-only CSV and load it with torch's
   ``_PipelineScheduleRuntime._load_csv`` (mocked stages, as torch's own visualizer does):
   torch validates it, infers the V placement and adds the sends and receives.
2. Read torch's DualPipeV back (``get_schedule_ops``) and simulate it with overlapped
   forward/backward pairs costing 0.7 x (F + B).

    python examples/torch_csv_interop.py
"""

from __future__ import annotations

import csv
import io
import logging
import tempfile
from pathlib import Path
from unittest import mock

from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
from torch.distributed.pipelining.stage import PipelineStage

from pipebubble import CostModel, get_schedule, simulate
from pipebubble.interop import parse_torch_csv, write_torch_csv


def torch_runtime_from_csv(path: Path, ranks: int, stages: int, microbatches: int):
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, ranks, None
    stage.num_stages = stages
    runtime = _PipelineScheduleRuntime([stage] * (stages // ranks), microbatches)
    runtime._load_csv(str(path))
    return runtime


def main() -> None:
    logging.disable(logging.WARNING)
    ours = get_schedule("zbv", ranks=4, microbatches=8)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "zbv.csv"
        write_torch_csv(ours, path)
        runtime = torch_runtime_from_csv(path, 4, 8, 8)
    placement = [runtime.stage_index_to_group_rank[s] for s in range(8)]
    comms = sum(len(r) for r in runtime.pipeline_order_with_comms.values())
    print(f"torch loaded our zbv: placement {placement}, {comms} actions with comms")

    out = io.StringIO()
    for row in get_schedule_ops("DualPipeV", 4, 8, 2):
        csv.writer(out).writerow(["" if a is None else str(a) for a in row])
    theirs = parse_torch_csv(out.getvalue(), source="torch DualPipeV", name="DualPipeV")
    for overlap in (1.0, 0.7):
        t = simulate(theirs, CostModel(f=1, b=2, w=1, overlap=overlap))
        print(f"torch's DualPipeV, overlap {overlap}: step {t.step_time:.4g}, "
              f"bubble {t.bubble_fraction:.2%}, same orders as ours: "
              f"{theirs.orders == get_schedule('dualpipev', 4, 8).orders}")


if __name__ == "__main__":
    main()
