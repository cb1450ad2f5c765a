"""A plan as settings to paste into torchtitan and Megatron-LM.

- torchtitan (``[parallelism]`` and ``[activation_checkpoint]`` of its TOML job file):
  ``pipeline_parallel_degree``, ``data_parallel_replicate_degree`` (plain data parallelism:
  every replica holds the optimizer state, as ``bytes_per_param`` assumes),
  ``pipeline_parallel_microbatch_size``, ``module_fqns_per_model_part`` (the layer names of
  each stage, in stage order) and ``pipeline_parallel_schedule``: the class name of
  torch.distributed.pipelining that runs the same family (``1F1B``, ``Interleaved1F1B``,
  ``GPipe``, ``LoopedBFS``, ``ZBVZeroBubble``, ``DualPipeV``). Families torch has no class
  for (ZB-H1, ZB-H2, auto) get ``pipeline_parallel_schedule_csv``: the order written as
  torch's CSV (:mod:`pipebubble.interop.torch_csv`), next to the plan's JSON. DualPipe (two
  model copies) has no torch form; its settings say so in ``note``.
- Megatron-LM flags: ``--pipeline-model-parallel-size``, ``--micro-batch-size``,
  ``--global-batch-size``, ``--num-virtual-stages-per-pipeline-rank`` (interleaved),
  ``--pipeline-model-parallel-layout`` (:func:`~pipebubble.plan.layouts.megatron_layout`)
  and the recomputation flags. Megatron runs 1F1B and interleaved 1F1B only; other
  families get None.

>>> torch_class("interleaved-1f1b"), torch_class("zb-h1")
('Interleaved1F1B', None)
"""

from __future__ import annotations

from pathlib import Path

from .layercosts import ProfileSet
from .layouts import megatron_layout
from .planner import Plan

TORCH_CLASSES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                 "looped-bfs": "LoopedBFS", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
MEGATRON_FAMILIES = ("1f1b", "interleaved-1f1b")


def torch_class(schedule: str) -> str | None:
    """torchtitan's ``pipeline_parallel_schedule`` for a family, or None if torch has none."""
    return TORCH_CLASSES.get(schedule)


def torchtitan(plan: Plan, profiles: ProfileSet, csv_path: str | Path | None = None) -> dict:
    """``{"parallelism": {...}, "activation_checkpoint": {...}}``; writes the CSV when the
    family needs one and ``csv_path`` is given (else the key says null)."""
    c = plan.config
    modules = profiles.modules
    n = len(plan.ranges)
    stages = [plan.ranges[s % n] for s in range(len(plan.stage_to_rank))]
    parts = [[name for i in range(a, b + 1) for name in modules[i]] for a, b in stages]
    par: dict = {"pipeline_parallel_degree": c.pp, "data_parallel_replicate_degree": c.dp,
                 "data_parallel_shard_degree": 1,
                 "pipeline_parallel_microbatch_size": c.microbatch_size,
                 "module_fqns_per_model_part": parts}
    cls = torch_class(c.schedule)
    if cls is not None:
        par["pipeline_parallel_schedule"] = cls
    else:
        par["pipeline_parallel_schedule"] = "PipelineScheduleMulti"  # what loads a CSV
        par["pipeline_parallel_schedule_csv"] = None
        if plan.schedule_obj.chains > 1:  # torch's CSV has no second model copy
            par["note"] = ("torch.distributed.pipelining runs one model copy; DualPipe's two "
                           "copies have no torch form (dualpipev is its one-copy variant)")
        elif csv_path is not None:
            from ..interop.torch_csv import write_torch_csv

            write_torch_csv(plan.schedule_obj, csv_path)
            par["pipeline_parallel_schedule_csv"] = str(csv_path)
    return {"parallelism": par, "activation_checkpoint": {"mode": c.recompute}}


def megatron(plan: Plan, profiles: ProfileSet) -> str | None:
    """Megatron-LM command-line flags for the plan (None when Megatron has no such
    schedule)."""
    c = plan.config
    if c.schedule not in MEGATRON_FAMILIES:
        return None
    stages = [plan.ranges[s % len(plan.ranges)] for s in range(len(plan.stage_to_rank))]
    flags = [f"--pipeline-model-parallel-size {c.pp}", f"--micro-batch-size {c.microbatch_size}",
             f"--global-batch-size {plan.global_batch}"]
    if c.chunks > 1:
        flags.append(f"--num-virtual-stages-per-pipeline-rank {c.chunks}")
    flags.append(f'--pipeline-model-parallel-layout "{megatron_layout(profiles.profile, stages)}"')
    if c.recompute == "full":
        flags.append("--recompute-granularity full --recompute-method uniform "
                     "--recompute-num-layers 1")
    elif c.recompute == "selective":
        flags.append("--recompute-granularity selective")
    return " ".join(flags)


def toml_text(settings: dict) -> str:
    """The torchtitan tables as TOML lines (values are ints, strings and lists of strings)."""
    import json

    out = []
    for table, values in settings.items():
        out.append(f"[{table}]")
        for k, v in values.items():
            if k == "note":
                out.append(f"# {v}")
            elif v is not None:
                out.append(f"{k} = {json.dumps(v)}")
    return "\n".join(out)
