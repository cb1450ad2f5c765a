"""A plan as settings to paste into torchtitan and Megatron-LM.

- torchtitan (``[parallelism]`` and ``[activation_checkpoint]`` of its TOML job file):
  ``tensor_parallel_degree``, ``context_parallel_degree``, ``pipeline_parallel_degree``,
  ``data_parallel_shard_degree`` (FSDP) and ``data_parallel_replicate_degree`` (plain
  replicas; both > 1 is HSDP), ``pipeline_parallel_microbatch_size``,
  ``module_fqns_per_model_part`` (the layer names of each stage, in stage order) and
  ``pipeline_parallel_schedule``: the class of torch.distributed.pipelining that runs the
  same family (``1F1B``, ``Interleaved1F1B``, ``GPipe``, ``LoopedBFS``, ``ZBVZeroBubble``,
  ``DualPipeV``). Families torch has no class for (ZB-H1, ZB-H2, V-Half, V-Min, auto) get
  ``pipeline_parallel_schedule_csv`` (the order as torch's CSV,
  :mod:`pipebubble.interop.torch_csv`) **and a class that places the stages as the order
  does**: torchtitan assigns stages to ranks from the class alone (``ZBVZeroBubble`` and
  ``DualPipeV`` V-wise, two per rank; every other class loop-wise), so a V-placed order is
  paired with ``ZBVZeroBubble``, a loop-placed one with ``1F1B`` (one stage per rank) or
  ``Interleaved1F1B``. (Pairing a V-placed CSV with a loop-placing class makes ranks wait for
  stages they do not hold: the run hangs.) A placement no class produces is marked in
  ``note``. torchtitan has no ZeRO-1/2: such plans say to use ``fsdp`` there. DualPipe (two
  model copies) has no torch form; ``note`` says so.
- Megatron-LM flags: ``--tensor-model-parallel-size``, ``--sequence-parallel``,
  ``--context-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--num-virtual-stages-per-pipeline-rank`` (interleaved), ``--micro-batch-size``,
  ``--global-batch-size``, ``--use-distributed-optimizer`` (ZeRO-1/2) or
  ``--use-torch-fsdp2`` (FSDP), ``--pipeline-model-parallel-layout``
  (:func:`~pipebubble.plan.layouts.megatron_layout`) and the recomputation flags. Megatron
  pipelines 1F1B and interleaved 1F1B only; other families get None (a pp = 1 plan runs there
  whatever its family).

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


def data_parallel_degrees(plan: Plan, gpus_per_node: int = 8) -> tuple[int, int]:
    """torchtitan's (shard, replicate) degrees for the plan's data parallelism."""
    c = plan.config
    if c.sharding == "fsdp":
        return c.dp, 1
    if c.sharding == "hsdp":
        from .sharding import hsdp_shard

        s = hsdp_shard(c.dp, c.cp, c.tp, gpus_per_node) or c.dp
        return s, c.dp // s
    return 1, c.dp


def csv_class(plan: Plan) -> str | None:
    """The torchtitan class to name beside a CSV order: one that places the stages as the
    order does (module doc), or None when none does."""
    from .plans import placement_name

    where = placement_name(plan.stage_to_rank, plan.pp)
    per_rank = len(plan.stage_to_rank) // plan.pp
    if where == "v" and per_rank == 2:
        return "ZBVZeroBubble"
    if where == "loop":
        return "1F1B" if per_rank == 1 else "Interleaved1F1B"
    return None


def torchtitan(plan: Plan, profiles: ProfileSet, csv_path: str | Path | None = None,
               gpus_per_node: int = 8) -> dict:
    """``{"parallelism": {...}, "activation_checkpoint": {...}}``; writes the CSV when the
    family needs one and ``csv_path`` is given (else the key says null)."""
    c = plan.config
    modules = profiles.modules
    n = len(plan.ranges)
    stages = [plan.ranges[s % n] for s in range(len(plan.stage_to_rank))]
    parts = [[name for i in range(a, b + 1) for name in modules[i]] for a, b in stages]
    shard, replicate = data_parallel_degrees(plan, gpus_per_node)
    par: dict = {"tensor_parallel_degree": c.tp, "context_parallel_degree": c.cp,
                 "pipeline_parallel_degree": c.pp, "data_parallel_replicate_degree": replicate,
                 "data_parallel_shard_degree": shard,
                 "pipeline_parallel_microbatch_size": c.microbatch_size,
                 "module_fqns_per_model_part": parts}
    notes = []
    if c.sharding in ("zero1", "zero2"):
        notes.append(f"torchtitan has no {c.sharding.upper()}: these degrees run it as DDP "
                     "(every replica holds the optimizer state); plan with --sharding fsdp "
                     "for torchtitan's sharded form")
    if c.tp > 1 and not c.sp:
        notes.append("torchtitan's tensor parallelism always splits the norms' sequence "
                     "(sequence parallel): it runs this plan with sp")
    cls = torch_class(c.schedule)
    if c.pp == 1:  # not pipelined: no schedule, no split
        for k in ("pipeline_parallel_microbatch_size", "module_fqns_per_model_part"):
            del par[k]
    elif cls is not None:
        par["pipeline_parallel_schedule"] = cls
    else:
        par["pipeline_parallel_schedule"] = csv_class(plan)
        par["pipeline_parallel_schedule_csv"] = None
        if plan.schedule_obj.chains > 1:  # torch's CSV has no second model copy
            par["pipeline_parallel_schedule"] = None
            notes.append("torch.distributed.pipelining runs one model copy; DualPipe's two "
                         "copies have no torch form (dualpipev is its one-copy variant)")
        elif par["pipeline_parallel_schedule"] is None:
            notes.append("no torchtitan schedule class places stages as this order does "
                         f"(stage -> rank {list(plan.stage_to_rank)}); place them yourself "
                         "to match the CSV")
        if plan.schedule_obj.chains == 1 and csv_path is not None:
            from ..interop.torch_csv import write_torch_csv

            write_torch_csv(plan.schedule_obj, csv_path)
            par["pipeline_parallel_schedule_csv"] = str(csv_path)
    if notes:
        par["note"] = "; ".join(notes)
    return {"parallelism": par, "activation_checkpoint": {"mode": c.recompute}}


def megatron(plan: Plan, profiles: ProfileSet) -> str | None:
    """Megatron-LM command-line flags for the plan (None when Megatron has no such
    schedule)."""
    c = plan.config
    if c.schedule not in MEGATRON_FAMILIES and c.pp > 1:
        return None
    stages = [plan.ranges[s % len(plan.ranges)] for s in range(len(plan.stage_to_rank))]
    flags = [f"--tensor-model-parallel-size {c.tp}"]
    if c.sp:
        flags.append("--sequence-parallel")
    if c.cp > 1:
        flags.append(f"--context-parallel-size {c.cp}")
    flags += [f"--pipeline-model-parallel-size {c.pp}", f"--micro-batch-size {c.microbatch_size}",
              f"--global-batch-size {plan.global_batch}"]
    if c.sharding in ("zero1", "zero2"):
        flags.append("--use-distributed-optimizer")
    elif c.sharding in ("fsdp", "hsdp"):
        flags.append("--use-torch-fsdp2")
    if c.chunks > 1:
        flags.append(f"--num-virtual-stages-per-pipeline-rank {c.chunks}")
    if c.pp > 1:
        flags.append(f'--pipeline-model-parallel-layout '
                     f'"{megatron_layout(profiles.profile, stages)}"')
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
