"""A plan as settings to paste into torchtitan and Megatron-LM, for named versions.

Each paste launches the plan it is printed for, or says it cannot: a plan that a framework
cannot run (a sharding or a schedule it lacks) has a **blocker**, one sentence why
(:func:`torchtitan_blocker`, :func:`megatron_blocker`); ``pipebubble plan`` then pastes the
best plan that framework does run, and says so. The versions the pastes are written for,
and checked against by the frameworks' own parsers (tests/test_paste_torchtitan.py,
tests/test_paste_megatron.py), are :data:`TORCHTITAN_TOML`, :data:`TORCHTITAN_CLI` and
:data:`MEGATRON`.

**torchtitan 0.2** (a TOML job file, ``--job.config_file``): three tables.

- ``[training]``: ``local_batch_size`` is the batch of one data-parallel rank per
  gradient-accumulation step, which torchtitan's pipeline cuts into
  ``local_batch_size / pipeline_parallel_microbatch_size`` microbatches, so with pp > 1 it
  is ``mbs x m`` (the plan's m microbatches, no accumulation) and with pp = 1 it is ``mbs``
  (torchtitan then accumulates ``global_batch_size / (mbs x dp)`` = m steps);
  ``global_batch_size`` is the plan's; ``seq_len`` the profile's sequence length. Left out,
  torchtitan runs its defaults (8 samples of 2,048 tokens).
- ``[parallelism]``: ``tensor_parallel_degree``, ``context_parallel_degree``,
  ``pipeline_parallel_degree``, ``data_parallel_shard_degree`` (FSDP) and
  ``data_parallel_replicate_degree`` (plain replicas; both > 1 is HSDP),
  ``pipeline_parallel_microbatch_size``, ``module_fqns_per_model_part`` (the modules of each
  stage, in stage order, every top-level module named: torchtitan drops a module no part
  names, without an error) and ``pipeline_parallel_schedule``: the class of
  torch.distributed.pipelining that runs the same family (``1F1B``, ``Interleaved1F1B``,
  ``GPipe``, ``LoopedBFS``, ``ZBVZeroBubble``, ``DualPipeV``). Families torch has no class
  for (ZB-H1, ZB-H2, V-Half, V-Min, auto) get ``pipeline_parallel_schedule_csv`` (the order
  as torch's CSV, :mod:`pipebubble.interop.torch_csv`) **and a class that places the stages
  as the order does**: torchtitan assigns stages to ranks from the class alone
  (``ZBVZeroBubble`` and ``DualPipeV`` V-wise, two per rank; every other class loop-wise),
  so a V-placed order is paired with ``ZBVZeroBubble``, a loop-placed one with ``1F1B`` (one
  stage per rank) or ``Interleaved1F1B``. (Pairing a V-placed CSV with a loop-placing class
  makes ranks wait for stages they do not hold: the run hangs.)
- ``[activation_checkpoint]``: ``mode``. The plan's ``full`` is torchtitan's ``full`` (each
  block re-run in backward). The plan's ``selective`` is Korthikanti et al.'s (the
  attention core, softmax(QK^T)V, recomputed, nothing else): torchtitan's attention is
  SDPA/FlashAttention, which keeps no score matrix and recomputes it in its own backward,
  so that plan runs there as ``none``, written out, never left to torchtitan's default.
  torchtitan's own ``selective`` with ``selective_ac_option = "op"`` (every second matmul,
  SDPA's output and the reduce-scatters kept, the rest re-run) is the plan's ``op``
  (:func:`~pipebubble.plan.memory.op_sac_matmuls`): ``mode = "selective"`` with that option
  (0.3: ``activation_checkpoint:selective``, its per-op policy).

**torchtitan 0.3** (the current release) reads no TOML: a ``config_registry`` function
(``--module llama3 --config llama3_8b``) and CLI overrides of its fields, the same values as
above (``--training.local_batch_size 32``, ``--parallelism.module_fqns_per_model_part
tok_embeddings,layers.0 layers.1,norm,lm_head``, ``activation_checkpoint:none``), plus
``--training.disable_cuda_graphs`` with pp > 1 (its validation refuses CUDA graphs with a
pipeline). Its decoder names the head ``lm_head`` (0.2: ``output``); module lists of a
torchtitan-named profile are renamed to match.

torchtitan cannot run ZeRO-1/2 (it has DDP, FSDP and HSDP only: ZeRO-1/2's degrees would run
as DDP, with every replica holding the whole optimizer state), DualPipe (two model copies;
DualPipeV is its one-copy form) or a stage placement no class produces.

**Megatron-LM** (``pretrain_gpt.py``'s flags, :data:`MEGATRON`): the model's shape when the
profile has one (``--num-layers`` counts transformer layers only), ``--seq-length``,
``--micro-batch-size``, ``--global-batch-size``, the parallel sizes, and the cut: an even
cut needs no flag; an uneven one with one chunk per rank is
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` when the
middle stages are equal, else ``--pipeline-model-parallel-layout``
(:func:`~pipebubble.plan.layouts.megatron_layout`), which also carries the virtual stages of
an interleaved plan (Megatron refuses ``--num-virtual-stages-per-pipeline-rank`` together
with a layout). Recomputation: ``full`` is ``--recompute-granularity full
--recompute-method uniform --recompute-num-layers 1``, ``selective`` is
``--recompute-granularity selective`` (its default module, ``core_attn``, is the plan's
meaning). Data parallelism: ZeRO-1 is ``--use-distributed-optimizer``; ZeRO-2 and FSDP
(ZeRO-3) exist in Megatron only as Megatron-FSDP (``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``), which does not
pipeline, so they are pasted for pp = 1 only; ``--use-torch-fsdp2`` is never written
(Megatron refuses it with pipelining and with tied embeddings). The planner prices the
gradient reduction overlapped with the last backward, and the weight all-gather with the
next forward: ``--overlap-grad-reduce`` whenever gradients are reduced, and
``--overlap-param-gather`` with the sharded optimizers. With tensor or context parallelism
Megatron also asks for ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in the environment
(:func:`megatron_env`). Megatron pipelines 1F1B and
interleaved 1F1B (whose microbatches go in groups of pp: m must be a multiple of pp).

>>> torch_class("interleaved-1f1b"), torch_class("zb-h1")
('Interleaved1F1B', None)
"""

from __future__ import annotations

import json
from pathlib import Path

from .layercosts import ProfileSet
from .layouts import megatron_flags, megatron_layout, megatron_symbols
from .planner import Plan
from .shardings import Sharding

TORCHTITAN_TOML = "torchtitan 0.2.x (0.2.0 to 0.2.2; the TOML job file, --job.config_file)"
TORCHTITAN_CLI = "torchtitan 0.3.0 (config_registry function + CLI overrides)"
MEGATRON = ("Megatron-LM core_v0.16.1 (pretrain_gpt.py; megatron/training/arguments.py with "
            "megatron-core 0.16.1)")

TORCHTITAN_SHARDINGS = (Sharding.DDP, Sharding.FSDP, Sharding.HSDP)
MEGATRON_SHARDINGS = (Sharding.DDP, Sharding.ZERO1, Sharding.ZERO2,  # zero2, fsdp: pp = 1 only
                      Sharding.FSDP)
TABLES = ("training", "parallelism", "activation_checkpoint")


def torch_class(schedule: str) -> str | None:
    """torchtitan's ``pipeline_parallel_schedule`` for a family, or None if torch has none
    (the spec's :attr:`~pipebubble.schedules.registry.ScheduleSpec.torchtitan`)."""
    from ..schedules import lookup

    return lookup(schedule).torchtitan


def megatron_families() -> list[str]:
    """The families Megatron-LM pipelines (a spec with a ``megatron`` name)."""
    from ..schedules import lookup, schedule_names

    return [n for n in schedule_names() if lookup(n).megatron is not None]


def data_parallel_degrees(plan: Plan) -> tuple[int, int]:
    """torchtitan's (shard, replicate) degrees for the plan's data parallelism: its dims'
    as priced for fsdp and hsdp; the rest torchtitan runs replicated."""
    c = plan.config
    if c.sharding.shards_params:
        return c.dims.dp_shard, c.dims.dp_replicate
    return 1, c.dp


def csv_class(plan: Plan) -> str | None:
    """The torchtitan class to name beside a CSV order: one that places the stages as the
    order does (module doc), or None when none does: the standard family's (1F1B) if it
    places them so, else the first registered family with a torch class that does."""
    from ..schedules import STANDARD, lookup, schedule_names
    from .plans import placement_name

    where = placement_name(plan.stage_to_rank, plan.pp)
    per_rank = len(plan.stage_to_rank) // plan.pp
    fits = [spec for spec in map(lookup, [STANDARD, *schedule_names()])
            if spec.torchtitan is not None and spec.chains == 1 and spec.placement == where
            and per_rank in spec.chunk_options(per_rank)]
    return fits[0].torchtitan if fits else None


def torchtitan_blocker(plan: Plan) -> str | None:
    """Why torchtitan cannot run this plan (one sentence), or None when it can."""
    c = plan.config
    if c.sharding not in TORCHTITAN_SHARDINGS:
        return (f"torchtitan has no {c.sharding.label} (DDP, FSDP and HSDP only: its "
                "degrees would run it as DDP, every replica holding the whole optimizer "
                "state)")
    d = c.dims
    if d.etp not in (1, d.tp):  # 0.2: 1 or tp (and at ep 1 the experts follow TP); 0.3: 1
        return (f"torchtitan's expert tensor parallelism is 1 or tp {d.tp} only, not etp "
                f"{d.etp}")
    if d.ep > 1 and not d.ep_fits(d.ep, d.dp_shard, d.etp):  # its sparse mesh: no dp_replicate
        return (f"torchtitan's EP borrows dp_shard x cp (x tp / etp) ranks only, never "
                f"dp_replicate ones (its sparse mesh pp x dp_replicate x efsdp x ep): ep "
                f"{d.ep} does not divide {d.ep_room(d.dp_shard)} here")
    if c.pp > 1 and plan.schedule_obj.chains > 1:
        return ("torch.distributed.pipelining runs one model copy; DualPipe's two copies "
                "have no torch form (dualpipev is its one-copy variant)")
    if c.pp > 1 and torch_class(c.schedule) is None and csv_class(plan) is None:
        return ("no torchtitan schedule class places the stages as this order does (stage "
                f"-> rank {list(plan.stage_to_rank)})")
    return None


def megatron_blocker(plan: Plan) -> str | None:
    """Why Megatron-LM cannot run this plan (one sentence), or None when it can."""
    return megatron_config_blocker(plan.config, getattr(plan, "moe", False))


def megatron_side():
    """The planner's side answer for Megatron-LM (:class:`~pipebubble.plan.visits.Side`):
    its fastest runnable plan, found by the search itself (``plan``'s Megatron paste). A
    configuration is admitted by what of it alone Megatron-LM runs (its routed experts
    aside: a plan's, checked when it is kept)."""
    from .visits import Side

    families = frozenset(megatron_families())
    return Side("megatron", lambda c: megatron_config_blocker(c, families=families) is None,
                lambda p: megatron_blocker(p) is None)


def megatron_config_blocker(c, moe: bool = False,
                            families: frozenset[str] | None = None) -> str | None:
    """Why Megatron-LM cannot run configuration ``c`` (one sentence; ``moe``: its plan
    prices routed experts), or None when it can. ``families``: :func:`megatron_families`,
    when the caller has it."""
    if c.pp > 1 and c.schedule not in (families or megatron_families()):
        from ..schedules import lookup

        names = " and ".join(lookup(n).megatron for n in megatron_families())
        return f"Megatron-LM pipelines {names} only, not {c.schedule}"
    if c.sharding.hybrid:
        return "these flags have no HSDP form for Megatron-LM"
    if c.recompute == "op":
        return "Megatron-LM has no op-level selective checkpointing (torchtitan's 'op' policy)"
    if moe and c.tp > 1 and not c.sp:  # MoELayer.forward raises
        return (f"Megatron-Core trains MoE layers with tp {c.tp} only under sequence "
                "parallelism (MoELayer.forward raises in training with TP and without "
                "--sequence-parallel): sp 1")
    if c.sharding.shards_grads and c.pp > 1:
        return (f"Megatron-LM shards gradients{' and weights' if c.sharding.shards_params else ''}"
                f" ({c.sharding.label}) only with Megatron-FSDP or torch FSDP2, neither of "
                "which pipelines (its --use-distributed-optimizer is ZeRO-1)")
    if c.pp > 1 and c.chunks > 1 and c.microbatches % c.pp:
        return (f"Megatron-LM's interleaved schedule runs microbatches in groups of pp = "
                f"{c.pp}; m = {c.microbatches} is not a multiple of it")
    return None


def module_parts(plan: Plan, profiles: ProfileSet, head: str = "output") -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part``: every stage's top-level modules, in
    stage order. Layers with roles (a model the profiler saw: embedding, layer, head) are
    named as torchtitan's decoders name them (``tok_embeddings``, ``layers.i``, ``norm``
    and ``head``); other profiles keep their modules (a layer of several, such as the
    analytic head ``norm+output``, lists each), with ``output`` renamed to ``head``."""
    names = torchtitan_modules(profiles, head)
    n = len(plan.ranges)
    stages = [plan.ranges[s % n] for s in range(len(plan.stage_to_rank))]
    return [[name for i in range(a, b + 1) for name in names[i]] for a, b in stages]


def torchtitan_modules(profiles: ProfileSet, head: str = "output") -> list[list[str]]:
    """The torchtitan modules of each profiled layer (see :func:`module_parts`)."""
    layers = profiles.profile.layers
    roles = [layer.extra.get("role") for layer in layers]
    if all(r in ("embedding", "layer", "head") for r in roles):
        out, k = [], 0
        for r in roles:
            if r == "embedding":
                out.append(["tok_embeddings"])
            elif r == "head":
                out.append(["norm", head])
            else:
                out.append([f"layers.{k}"])
                k += 1
        return out
    return [[head if m == "output" else m for m in mods] for mods in profiles.modules]


def torchtitan(plan: Plan, profiles: ProfileSet, csv_path: str | Path | None = None,
               seq: int | None = None) -> dict:
    """The plan's torchtitan paste: ``training``, ``parallelism`` and
    ``activation_checkpoint`` (the TOML tables of :data:`TORCHTITAN_TOML`), ``cli`` (the
    same as :data:`TORCHTITAN_CLI`'s overrides), ``version``/``cli_version`` and ``note``.
    Writes the CSV when the family needs one and ``csv_path`` is given (else the key says
    null). A plan torchtitan cannot run gets ``{"runnable": False, "reason": ...}``."""
    reason = torchtitan_blocker(plan)
    if reason is not None:
        return {"runnable": False, "reason": reason, "version": TORCHTITAN_TOML}
    c = plan.config
    shard, replicate = data_parallel_degrees(plan)
    seq = seq if seq is not None else profiles.metadata().get("seq")
    training: dict = {"local_batch_size": c.microbatch_size * (c.microbatches if c.pp > 1
                                                                  else 1),
                      "global_batch_size": plan.global_batch}
    notes = []
    if isinstance(seq, int) and seq > 0:
        training["seq_len"] = seq
    else:
        notes.append("the profile has no sequence length: set training.seq_len to the "
                     "profiled one")
    par: dict = {"tensor_parallel_degree": c.tp, "context_parallel_degree": c.cp,
                 "pipeline_parallel_degree": c.pp, "data_parallel_replicate_degree": replicate,
                 "data_parallel_shard_degree": shard}
    if profiles.metadata().get("moe"):  # MoE: plan/expert.py
        from .expert import torchtitan_moe

        more, note = torchtitan_moe(c.dims)
        par.update(more)
        if note:
            notes.append(note)
    if c.tp > 1 and not c.sp:
        notes.append("torchtitan's tensor parallelism always splits the norms' sequence "
                     "(sequence parallel): it runs this plan with sp")
    if c.pp > 1:
        par["pipeline_parallel_microbatch_size"] = c.microbatch_size
        par["module_fqns_per_model_part"] = module_parts(plan, profiles)
        cls = torch_class(c.schedule)
        par["pipeline_parallel_schedule"] = cls or csv_class(plan)
        if cls is None:
            par["pipeline_parallel_schedule_csv"] = None
            if csv_path is not None:
                from ..interop.torch_csv import write_torch_csv

                write_torch_csv(plan.schedule_obj, csv_path)
                par["pipeline_parallel_schedule_csv"] = str(csv_path)
    mode = {"full": "full", "op": "selective"}.get(c.recompute, "none")
    if c.recompute == "selective":
        notes.append("the plan's selective recomputation (the attention core) is what "
                     "torchtitan's SDPA/FlashAttention does itself: mode none; torchtitan's "
                     "own 'selective' is another policy")
    out = {"version": TORCHTITAN_TOML, "training": training, "parallelism": par,
           "activation_checkpoint": {"mode": mode, **(
               {"selective_ac_option": "op"} if c.recompute == "op" else {})}}
    out["cli_version"] = TORCHTITAN_CLI
    out["cli"] = torchtitan_cli(out, module_parts(plan, profiles, "lm_head")
                                if c.pp > 1 else None)
    if notes:
        out["note"] = "; ".join(notes)
    return out


TOML_ONLY = ("expert_tensor_parallel_degree",)  # torchtitan 0.2 has it, 0.3 does not


def torchtitan_cli(paste: dict, parts: list[list[str]] | None = None) -> str:
    """torchtitan 0.3's CLI overrides for a paste's tables (``parts``: its module lists
    with 0.3's names), to follow ``--module M --config F``."""
    flags = []
    for table in ("training", "parallelism"):
        for k, v in paste[table].items():
            if v is None or k in TOML_ONLY:
                continue
            if k == "module_fqns_per_model_part":
                v = " ".join(",".join(p) for p in (parts if parts is not None else v))
            flags.append(f"--{table}.{k} {v}")
    if paste["parallelism"]["pipeline_parallel_degree"] > 1:
        flags.append("--training.disable_cuda_graphs")
    flags.append(f"activation_checkpoint:{paste['activation_checkpoint']['mode']}")
    return " ".join(flags)


def megatron(plan: Plan, profiles: ProfileSet, seq: int | None = None) -> str | None:
    """Megatron-LM's command-line flags for the plan (:data:`MEGATRON`), or None when
    Megatron cannot run it (:func:`megatron_blocker` says why)."""
    if megatron_blocker(plan) is not None:
        return None
    from .planner import model_of

    c = plan.config
    shape, shape_seq, _ = model_of(profiles)
    seq = seq or shape_seq or profiles.metadata().get("seq")
    sym = megatron_symbols(profiles.profile)
    flags = [f"--num-layers {sym.count('t')}"]
    if shape is not None:
        flags += [f"--hidden-size {shape.hidden}", f"--ffn-hidden-size {shape.ffn}",
                  f"--num-attention-heads {shape.heads}"]
        if shape.kv_heads and shape.kv_heads != shape.heads:
            flags.append(f"--group-query-attention --num-query-groups {shape.kv_heads}")
        if shape.swiglu:
            flags.append("--swiglu")
        if not shape.tied_embeddings:
            flags.append("--untie-embeddings-and-output-weights")
    from .expert import megatron_moe_flags, moe_shape_of

    moe = moe_shape_of(profiles)
    if moe is not None:  # --num-experts, --moe-router-topk, --expert-model-parallel-size ...
        flags += megatron_moe_flags(moe, c.dims.ep, c.dims.etp)
    if isinstance(seq, int) and seq > 0:
        flags.append(f"--seq-length {seq} --max-position-embeddings {seq}")
    flags.append(f"--tensor-model-parallel-size {c.tp}")
    if c.sp:
        flags.append("--sequence-parallel")
    if c.cp > 1:
        flags.append(f"--context-parallel-size {c.cp}")
    flags += [f"--pipeline-model-parallel-size {c.pp}", f"--micro-batch-size {c.microbatch_size}",
              f"--global-batch-size {plan.global_batch}"]
    if c.pp > 1:
        n = len(plan.ranges)
        stages = [plan.ranges[s % n] for s in range(len(plan.stage_to_rank))]
        counts = [sym[a:b + 1].count("t") for a, b in stages]
        first_last = megatron_flags(profiles.profile, stages, c.chunks)
        if c.chunks == 1 and len(set(counts)) == 1 and sym[0] == "E" and sym[-1] == "L":
            pass  # an even cut is Megatron's default one
        elif first_last is not None:
            flags.append(first_last)
        else:
            flags.append(f'--pipeline-model-parallel-layout '
                         f'"{megatron_layout(profiles.profile, stages)}"')
    if c.recompute == "full":
        flags.append("--recompute-granularity full --recompute-method uniform "
                     "--recompute-num-layers 1")
    elif c.recompute == "selective":
        flags.append("--recompute-granularity selective")
    reduced = c.dims.data_context > 1
    strategy = c.sharding.megatron_fsdp_strategy  # shardings.Sharding
    if c.sharding.shards_optimizer and not c.sharding.shards_grads:  # ZeRO-1
        flags.append("--use-distributed-optimizer")
    elif strategy is not None:
        flags.append(f"--use-megatron-fsdp --data-parallel-sharding-strategy {strategy} "
                     "--use-distributed-optimizer --no-gradient-accumulation-fusion "
                     "--ckpt-format fsdp_dtensor")
    if reduced:
        flags.append("--overlap-grad-reduce")
        if c.sharding.gathers:
            flags.append("--overlap-param-gather")
    return " ".join(flags)


def megatron_env(plan: Plan) -> str:
    """The environment Megatron-LM's ``validate_args`` asks for with these flags:
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor or context parallelism (before Blackwell;
    Megatron-FSDP wants it unset, and only warns then), else nothing."""
    c = plan.config
    fsdp = c.sharding.megatron_fsdp_strategy is not None  # Megatron-FSDP
    return "CUDA_DEVICE_MAX_CONNECTIONS=1" if (c.tp > 1 or c.cp > 1) and not fsdp else ""


def toml_text(paste: dict) -> str:
    """A torchtitan paste as TOML lines: its tables, its version and note as comments
    (values are ints, strings and lists of lists of strings)."""
    out = []
    if paste.get("version"):
        out.append(f"# for {paste['version']}")
    if paste.get("note"):
        out.append(f"# {paste['note']}")
    for table in TABLES:
        if table not in paste:
            continue
        out.append(f"[{table}]")
        for k, v in paste[table].items():
            if v is not None:
                out.append(f"{k} = {json.dumps(v)}")
    return "\n".join(out)
