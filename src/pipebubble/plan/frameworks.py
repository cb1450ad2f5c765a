"""Framework profiles: what Megatron-LM, torchtitan, DeepSpeed and NeMo do by default, and
which plans each of them can run (``plan --framework NAME``).

A plan is priced the way its framework runs it. A profile (:class:`Framework`) states, for
the version it is written for:

- ``dp_overlap``: whether the data-parallel traffic that runs once a step hides behind the
  last backward and the next forward (:mod:`~pipebubble.plan.sharding`, ``plan
  --dp-overlap on|off``). Megatron-LM with ``--overlap-grad-reduce`` (its paste writes it)
  and FSDP2 do; DeepSpeed's pipeline engine does not (``engine.py``:
  ``self.enable_backward_allreduce = False``, "We schedule the all-reduces": the reduction
  runs after the flush, and ZeRO's gather of the updated weights inside the optimizer step),
  nor do its ZeRO-1/2 by default (``overlap_comm`` defaults to false);
- ``tp_overlap`` (``plan --tp-overlap off|backward|on``, :mod:`~pipebubble.plan.tensor`):
  ``off``, every TP collective exposed; ``backward``, the backward's input-gradient
  collectives behind the weight-gradient GEMMs (Megatron-LM's default since 2021); ``on``,
  also the forward's collectives (and the backward's gradient all-gathers) pipelined with
  their GEMMs, which needs sequence parallelism: Megatron-LM's ``--tp-comm-overlap``
  (TransformerEngine userbuffers), torchtitan's AsyncTP (``enable_async_tensor_parallel``,
  with torch.compile). torchtitan's eager DTensor TP overlaps nothing (each collective
  waits before the op that reads it); the Megatron-DeepSpeed fork of the published DeepSpeed
  runs (bigscience-workshop/Megatron-DeepSpeed, ``megatron/mpu/layers.py``) all-reduces the
  column-parallel input gradient synchronously (``copy_to_tensor_model_parallel_region``);
- ``reshard``: what ``--fsdp-reshard auto`` means (:mod:`~pipebubble.plan.sharding`):
  torchtitan keeps the gathered weights under PP and reshards without it (the rule written
  as ``auto`` there); DeepSpeed ZeRO-3 and Megatron-FSDP gather every microbatch
  (``always``);
- the schedules it pipelines: the registry's spec says it (``ScheduleSpec.megatron``,
  ``.torchtitan``, ``.deepspeed``), never a family's name;
- the model states it keeps (``plan --param-bytes / --grad-bytes / --optimizer-bytes``
  where not given, bytes a parameter: weights, gradients, optimizer) and the gradient bytes
  it reduces (``--grad-wire-bytes``): Megatron-LM keeps fp32 main gradients
  (``accumulate_allreduce_grads_in_fp32`` is forced on with bf16; its distributed-optimizer
  guide counts "bf16 param, fp32 grads" as 18 bytes, 6 + 12/d sharded): (2, 4, 12);
  DeepSpeed's BF16 optimizer keeps the bf16 gradient and an fp32 accumulator of it
  (``runtime/bf16_optimizer.py``) and adds every microbatch's gradient into the fp32 copy
  (18 bytes of HBM traffic a parameter and microbatch, ``Hardware.grad_accumulation_bytes``):
  (2, 6, 12); torchtitan's FSDP2 keeps fp32 sharded parameters and gradients and fp32 Adam
  moments, 4 + 4 + 8 = 16 bytes sharded, which the planner's (2, 2, 12) counts the same,
  reducing in fp32 (``mixed_precision_reduce = "float32"``);
- ``recompute``: the recomputation modes it runs. torchtitan's op-level selective
  checkpointing (``recompute op``, ``selective_ac_option = "op"``) is torchtitan's alone;
  Megatron-LM's ``selective`` (the attention core, ``--recompute-granularity selective``)
  came with its sequence parallelism (Korthikanti et al. 2022), and the DeepSpeed forks have
  only whole-layer checkpointing (``--checkpoint-activations``; no selective in
  bigscience-workshop/Megatron-DeepSpeed's arguments, nor in gpt-neox's at the 20B release,
  c560814b, nor in the 2021 Megatron-DeepSpeed): ``none`` and ``full``. ``sequence_parallel``:
  whether it
  runs Megatron-style sequence parallelism beside TP. The DeepSpeed profile is written for
  the Megatron-DeepSpeed forks its published runs used, which have none: the MT-NLG fork of
  2021 predates Megatron-LM's (2022), bigscience-workshop/Megatron-DeepSpeed (BLOOM) has no
  ``sequence_parallel`` anywhere in its code up to its last commit (8387ae1, 2023-12), and
  gpt-neox added it in #1257 (2024-08); DeepSpeed's own sequence parallelism is Ulysses
  (below). :func:`blocker` refuses either where the profile says no;
- ``loss_bytes``: what the loss holds at its peak beyond the fp32 probabilities it keeps
  for the backward (which every head counts, ``4 T V / t``: :func:`~pipebubble.plan.memory.
  head_activation_bytes`), in bytes a local logit (``Hardware.loss_bytes``, priced as the
  head's transient). torchtitan's eager loss (``torch.nn.functional.cross_entropy(pred.
  flatten(0, 1).float(), ...)``, train.py at 9dec370; torch.compile left off for it) keeps
  log-softmax's fp32 output, and its backward creates two more fp32 ``[T, V]`` tensors while
  that output is alive, the gradient ``nll_loss`` returns and the one log-softmax's backward
  returns: 8. Megatron-LM's vocabulary-parallel cross-entropy (``megatron/core/
  tensor_parallel/cross_entropy.py``; ``mpu/cross_entropy.py`` in the 2021 Megatron-DeepSpeed
  fork) works in place on the fp32 copy of the logits (``-=`` the max, ``exp`` into it, the
  softmax saved and turned into the gradient in place): beside it only the 16-bit logits
  while the copy is made, and the 16-bit cast of the gradient: 2 (Megatron-LM, NeMo and the
  DeepSpeed forks, which call it on ``output.float()``);
- ``megatron_dispatch``: whether an MoE plan at ``etp = tp`` is laid out as Megatron-Core's
  all-to-all token dispatcher runs it (Megatron-LM and NeMo), each rank dispatching its own
  sequence shard, or as torchtitan does, the TP group's tokens replicated
  (:attr:`~pipebubble.plan.expert.MoERecipe.megatron_dispatch`);
- ``ep_from``: which data-parallel ranks expert parallelism may take (:class:`~pipebubble.
  plan.dims.ParallelDims`): Megatron-LM and NeMo any, replicated (DDP) or sharded (the
  distributed optimizer), as Megatron-Core's "MoE parallel folding" builds its expert mesh
  over the whole world (``parallel_state.initialize_model_parallel``); DeepSpeed any too
  (``deepspeed/utils/groups.py``: ep divides ``world / (tp x pp)``, EP groups inside each
  TP rank's data-parallel group); torchtitan only the sharded ones (its sparse mesh ``pp x
  dp_replicate x efsdp x ep``); ``none`` Megatron-Core's, the least restrictive;
- the shardings it runs with and without pipelining (:func:`blocker`): Megatron-LM's
  distributed optimizer is ZeRO-1 at any pp, ZeRO-2 / FSDP only as Megatron-FSDP without
  PP (torch FSDP2 is refused with PP); DeepSpeed ZeRO 1/2/3, but its pipeline engine refuses
  ZeRO-2 and ZeRO-3 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
  torchtitan FSDP2, HSDP and DDP, not ZeRO-1/2.

NeMo (2.x) runs Megatron-Core, so it runs what Megatron-LM runs; its recipes turn on what
Megatron leaves off (``overlap_grad_reduce``, ``overlap_param_gather``, the distributed
optimizer, and for the large models ``tp_comm_overlap`` through its
``MegatronCommOverlapCallback``), so its ``tp_overlap`` is ``on``.

``none`` (the default) is the planner as it was: no framework's restrictions, DualPipe
ranked by its step like any other plan, every default the planner's own.

**Ranking** (:func:`rank`): under a framework the plans it can run come first, the others
after them, each with its reason ("not runnable in FRAMEWORK: ..."); a plan no framework
runs (DualPipe's two model copies) is never first unless ``--framework none``.

**Calibration** (:data:`CALIBRATIONS`): the compute model's efficiency is fitted per (GPU,
framework) on published runs (``bench/bench_frameworks.py`` fits them and prints the
spread), because one efficiency does not carry across frameworks: what a framework's
kernels, fusions and overheads reach differs on the same chip. :func:`calibration_note`
says which calibration an absolute number rests on and how far it may be off: the spread of
that framework's other published runs after the fit.

>>> get_framework("Megatron").tp_overlap, get_framework("deepspeed").dp_overlap
('backward', False)
>>> try:
...     get_framework("jax")
... except UserError as exc:
...     print(exc)
unknown framework 'jax'; valid are megatron, torchtitan, deepspeed, nemo, none
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UserError, param
from ..schedules import lookup

FRAMEWORKS = ("megatron", "torchtitan", "deepspeed", "nemo", "none")
TP_OVERLAPS = ("off", "backward", "on")  # plan --tp-overlap
DP_OVERLAPS = ("on", "off")  # plan --dp-overlap


@dataclass(frozen=True)
class Framework:
    """What one framework does by default (module doc)."""

    name: str
    label: str
    version: str  # what the defaults are written for
    dp_overlap: bool = True
    tp_overlap: str = "backward"  # off, backward, on (TP_OVERLAPS)
    reshard: str = "auto"  # fsdp reshard policy meant by auto: auto (torchtitan's rule) or always
    states: tuple[float, float, float] | None = None  # (weights, grads, optimizer) bytes
    grad_wire: float | None = None  # bytes a gradient on the wire (None: the planner's 4)
    grad_accumulation_bytes: float = 0.0  # HBM bytes a parameter and microbatch (hardware.py)
    schedule_field: str | None = None  # the ScheduleSpec field naming its class; None: any
    recompute: tuple[str, ...] = ("none", "selective", "full")  # the modes it runs (op:
    # torchtitan's op-level SAC)
    sequence_parallel: bool = True  # runs Megatron-style sequence parallelism (sp with TP)
    loss_bytes: float = 0.0  # bytes a local logit its loss holds beyond the kept fp32
    # probabilities at the loss's peak (Hardware.loss_bytes; module doc)
    megatron_dispatch: bool = False  # MoE at etp = tp laid out as Megatron-Core's token
    # dispatcher runs it (plan/expert.py MoERecipe.megatron_dispatch); else torchtitan's
    ep_from: str = "dp"  # the data-parallel ranks EP may take (plan/dims.py ParallelDims):
    # dp, replicated or sharded (Megatron-Core's folding, DeepSpeed's expert groups), or
    # dp_shard (torchtitan's mesh)

    def runs_schedule(self, name: str) -> bool:
        """Whether the framework pipelines the family (its spec names a class for it)."""
        return self.schedule_field is None or getattr(lookup(name),
                                                      self.schedule_field) is not None


PROFILES = {f.name: f for f in (
    Framework("megatron", "Megatron-LM", "Megatron-LM core_v0.16.1", tp_overlap="backward",
              reshard="always", states=(2.0, 4.0, 12.0), grad_wire=4.0,
              schedule_field="megatron", loss_bytes=2.0, megatron_dispatch=True),
    Framework("torchtitan", "torchtitan", "torchtitan 0.2 / 0.3 (FSDP2, eager)",
              tp_overlap="off", reshard="auto", states=(2.0, 2.0, 12.0), grad_wire=4.0,
              schedule_field="torchtitan", recompute=("none", "selective", "full", "op"),
              loss_bytes=8.0, ep_from="dp_shard"),
    Framework("deepspeed", "DeepSpeed", "DeepSpeed's PipelineEngine with its BF16 optimizer "
              "and the Megatron-DeepSpeed forks of 2021-22", dp_overlap=False,
              tp_overlap="off", reshard="always", states=(2.0, 6.0, 12.0), grad_wire=4.0,
              grad_accumulation_bytes=18.0, schedule_field="deepspeed",
              sequence_parallel=False, recompute=("none", "full"), loss_bytes=2.0),
    Framework("nemo", "NeMo", "NeMo 2.x recipes on Megatron-Core", tp_overlap="on",
              reshard="always", states=(2.0, 4.0, 12.0), grad_wire=4.0,
              schedule_field="megatron", loss_bytes=2.0, megatron_dispatch=True),
    Framework("none", "no framework", "the planner's own defaults",
              recompute=("none", "selective", "full", "op")),
)}


def get_framework(name: str | Framework) -> Framework:
    """The profile named ``name`` (any case), or one line listing the valid ones."""
    if isinstance(name, Framework):
        return name
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in PROFILES:
        raise UserError(f"unknown {param('framework')} {name!r}; valid are {', '.join(FRAMEWORKS)}")
    return PROFILES[key]


def check_choice(value: str, flag: str, valid: tuple[str, ...]) -> str:
    """``value`` lower-cased if it is one of ``valid``, else one line listing them."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in valid:
        raise UserError(f"unknown {flag} {value!r}; valid are {', '.join(valid)}")
    return key


# ---- the defaults, applied ---------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """What a plan is priced with under a framework, each value with where it came from
    (``framework`` default or the user's ``flag``)."""

    framework: Framework
    dp_overlap: bool
    tp_overlap: str
    fsdp_reshard: str  # as the Request takes it (always, never or torchtitan's auto rule)
    state_bytes: tuple[float, float, float] | None  # None: the request's own
    grad_wire: float | None
    grad_accumulation_bytes: float | None  # None: the hardware's own
    given: tuple[str, ...] = ()  # the flags the user set
    loss_bytes: float | None = None  # None: the hardware's own (Hardware.loss_bytes)

    def as_json(self) -> dict:
        return {"framework": self.framework.name, "version": self.framework.version,
                "dp_overlap": self.dp_overlap, "tp_overlap": self.tp_overlap,
                "fsdp_reshard": self.fsdp_reshard, "overridden": list(self.given)}


def settings(framework: str | Framework, dp_overlap: str | None = None,
             tp_overlap: str | None = None, fsdp_reshard: str = "auto",
             states: tuple = (None, None, None), total_given: bool = False,
             wire_given: bool = False) -> Settings:
    """The framework's defaults with the user's flags over them (None: not given):
    ``states`` the ``--param-bytes``, ``--grad-bytes``, ``--optimizer-bytes`` given (each
    missing one the framework's), ``total_given`` ``--bytes-per-param`` (then the request's
    own split), ``wire_given`` a ``--grad-wire-bytes`` or ``--grad-bytes``."""
    fw = get_framework(framework)
    given = [f for f, v in zip(("--param-bytes", "--grad-bytes", "--optimizer-bytes"), states,
                               strict=True) if v is not None]
    if dp_overlap is not None:
        dp = check_choice(dp_overlap, param("dp_overlap"), DP_OVERLAPS) == "on"
        given.append("--dp-overlap")
    else:
        dp = fw.dp_overlap
    if tp_overlap is not None:
        tp = check_choice(tp_overlap, param("tp_overlap"), TP_OVERLAPS)
        given.append("--tp-overlap")
    else:
        tp = fw.tp_overlap
    from .sharding import check_reshard

    policy = check_reshard(fsdp_reshard)
    if policy == "auto":  # the fsdp reshard policy auto: the framework's default
        policy = fw.reshard
    else:
        given.append("--fsdp-reshard")
    held = None
    if fw.states is not None and not total_given:
        held = tuple(float(v) if v is not None else d for v, d in zip(states, fw.states,
                                                                       strict=True))
    return Settings(fw, dp, tp, policy, held, None if wire_given else fw.grad_wire,
                    fw.grad_accumulation_bytes if fw.name != "none" else None, tuple(given),
                    fw.loss_bytes if fw.name != "none" else None)


def apply(s: Settings, req, hw=None):
    """``(request, hardware)`` priced as ``s`` says: the request's data-parallel overlap,
    reshard policy and model states, the hardware's TP overlap and gradient accumulation
    traffic (``hw`` None: a measured profile, no TP to overlap)."""
    ch: dict = {"dp_overlap": s.dp_overlap, "fsdp_reshard": s.fsdp_reshard}
    if s.state_bytes is not None:
        ch["state_bytes"] = s.state_bytes
    if s.grad_wire is not None:
        ch["grad_bytes"] = s.grad_wire
    if req.ep_from != s.framework.ep_from:  # EP over replicated ranks, or not (plan/dims.py)
        ch["ep_from"] = s.framework.ep_from
    if s.framework.megatron_dispatch:  # MoE at etp = tp: Megatron-Core's dispatcher's layout
        from .expert import NO_RECIPE  # (plan/expert.py MoERecipe.megatron_dispatch)

        ch["moe_recipe"] = replace(req.moe_recipe or NO_RECIPE, megatron_dispatch=True)
    req = replace(req, **ch)
    if hw is not None:
        over: dict = {"tp_overlap": s.tp_overlap != "off",
                      "tp_comm_overlap": s.tp_overlap == "on"}
        if s.grad_accumulation_bytes is not None and hw.grad_accumulation_bytes == 0:
            over["grad_accumulation_bytes"] = s.grad_accumulation_bytes
        if s.loss_bytes is not None:
            over["loss_bytes"] = s.loss_bytes
        hw = replace(hw, **over)
    return req, hw


# ---- what each framework runs --------------------------------------------------------------

def blocker(framework: str | Framework, plan) -> str | None:
    """Why ``framework`` cannot run ``plan`` (one sentence), or None when it can (``none``
    runs everything)."""
    fw = get_framework(framework)
    from . import settings as pastes

    if fw.name == "none":
        return None
    c = plan.config
    if c.recompute not in fw.recompute:
        what = ("op-level selective checkpointing (torchtitan's 'op' policy)"
                if c.recompute == "op" else f"{c.recompute} recomputation")
        return f"{fw.label} ({fw.version}) has no {what}: it runs {', '.join(fw.recompute)}"
    if c.sp and c.tp > 1 and not fw.sequence_parallel:
        return (f"{fw.label} ({fw.version}) has no Megatron-style sequence parallelism: run it "
                "with sp 0")
    if fw.name == "torchtitan":
        return pastes.torchtitan_blocker(plan)
    if fw.name in ("megatron", "nemo"):
        why = pastes.megatron_blocker(plan)
        return why if why is None or fw.name == "megatron" else \
            f"NeMo runs Megatron-Core: {why}"
    return deepspeed_blocker(plan)


def deepspeed_blocker(plan) -> str | None:
    """Why DeepSpeed cannot run ``plan``, or None. An MoE plan runs at ``etp = tp`` only:
    DeepSpeed's MoE has no expert tensor parallel degree (the Megatron-DeepSpeed forks split
    experts over the TP ranks with ``--enable-expert-tensor-parallelism``, or keep them
    whole on every TP rank; neither lends TP ranks to EP, the etp-below-tp layout priced
    here), its EP groups ``ep`` data-parallel ranks ``tp`` apart
    (``deepspeed/utils/groups.py`` ``_get_expert_parallel_ranks``)."""
    c = plan.config
    if c.dims.ep > 1 and c.dims.etp != c.tp:
        return (f"DeepSpeed's MoE has no expert tensor parallel degree of its own: its "
                f"experts follow TP (etp = tp {c.tp}), not etp {c.dims.etp}")
    if c.pp > 1 and not get_framework("deepspeed").runs_schedule(c.schedule):
        return (f"DeepSpeed's pipeline engine runs its TrainSchedule (1F1B, one stage a rank) "
                f"only, not {c.schedule}")
    if c.pp > 1 and c.sharding.shards_grads:
        return (f"DeepSpeed's pipeline engine refuses {c.sharding.label} (\"ZeRO-2 and ZeRO-3 "
                "are incompatible with pipeline parallelism\"): DDP or ZeRO-1 with pp > 1")
    if c.sharding.hybrid:
        return ("DeepSpeed has no HSDP as priced here (its ZeRO++ hierarchical partitioning "
                "is another scheme)")
    if c.cp > 1:
        return ("DeepSpeed's sequence parallelism is Ulysses (an all-to-all of the heads), "
                "not the ring context parallelism priced here")
    return None


def megatron_flags(s: Settings, plan, flags: str | None) -> str | None:
    """Megatron-LM's paste for ``plan`` as ``s`` prices it: ``--tp-comm-overlap`` with
    ``--tp-overlap on`` (it needs sequence parallelism and TransformerEngine), and without
    the overlap flags under ``--dp-overlap off``."""
    if flags is None:
        return None
    if s.tp_overlap == "on" and plan.config.sp and plan.config.tp > 1:
        flags += " --tp-comm-overlap"
    if not s.dp_overlap:
        flags = flags.replace(" --overlap-grad-reduce", "").replace(" --overlap-param-gather",
                                                                     "")
    return flags


def may_run(framework: str | Framework, sharding) -> bool:
    """Whether the framework runs ``sharding`` at some pipeline depth (:func:`blocker` says
    at which)."""
    fw = get_framework(framework)
    from . import settings as pastes
    from .shardings import Sharding

    sh = Sharding.of(sharding)
    if fw.name == "torchtitan":
        return sh in pastes.TORCHTITAN_SHARDINGS
    return fw.name == "none" or not sh.hybrid


def may_run_config(framework: str | Framework, c) -> bool:
    """False only when :func:`blocker` refuses every plan of configuration ``c`` (known from
    the configuration alone: a sharding the framework never runs, a pipelined family it has
    no schedule for, torchtitan's one model copy); True does not promise it runs. What
    ``plan --config`` ranks among under a framework (:mod:`~pipebubble.plan.bound_rank`)."""
    fw = get_framework(framework)
    if fw.name == "none":
        return True
    if not may_run(fw, c.sharding):
        return False
    if c.pp == 1:
        return True
    if fw.name == "torchtitan":  # it may run a family without a class from a CSV order
        return lookup(c.schedule).chains == 1
    return fw.runs_schedule(c.schedule)


def narrowed(framework: str | Framework, req, hardware: bool = True):
    """``req`` restricted to what the framework can run (its schedules, the shardings it runs
    at some depth, DeepSpeed's cp 1, sp 0 where its profile has no sequence parallelism, the
    recompute modes it runs), for a search that finds its plans when the plans of a
    full one are all plans it cannot run; None when nothing is left."""
    from .families import schedule_list
    from .shardings import SHARDINGS

    fw = get_framework(framework)
    names = tuple(n for n in schedule_list(req.schedules) if fw.runs_schedule(n))
    every = SHARDINGS if hardware else SHARDINGS[:4]  # hsdp needs --gpu
    shardings = tuple(x for x in (req.shardings or every) if may_run(fw, x))
    if not names or not shardings:
        return None
    ch: dict = {"schedules": names, "shardings": shardings}
    if fw.name == "deepspeed" and req.cp is None:
        ch["cp"] = (1,)
    if not fw.sequence_parallel:  # its plans have sp 0
        ch["sp"] = tuple(x for x in (req.sp or (False,)) if not x)
    if req.recompute is not None:  # None: the search's own modes, which have no op
        ch["recompute"] = tuple(m for m in req.recompute if m in recompute_modes(fw))
    if not ch.get("sp", True) or not ch.get("recompute", True):
        return None
    return replace(req, **ch)


def recompute_modes(framework: str | Framework) -> tuple[str, ...]:
    """The recomputation modes the framework runs (its profile's ``recompute``, in the
    planner's order)."""
    from .analytic import RECOMPUTE_MODES

    fw = get_framework(framework)
    return tuple(m for m in RECOMPUTE_MODES if m in fw.recompute)


def runnable_in(plan) -> list[str]:
    """The frameworks (but ``none``) that run ``plan``."""
    return [n for n in FRAMEWORKS if n != "none" and blocker(n, plan) is None]


def rank(framework: str | Framework, plans: list, more: list | None = None) -> list:
    """``plans`` (fastest first) reordered for ``framework``: the ones it runs first (with
    those of ``more``, a narrowed search's, merged in by step), then the rest in their
    order; ``none``: as given. Returns ``[(plan, reason or None)]``."""
    fw = get_framework(framework)
    if fw.name == "none":
        return [(p, None) for p in plans]
    ok, rest, seen = [], [], set()
    for p in [*plans, *(more or [])]:
        key = (p.config, repr(p.ranges), p.stage_to_rank)
        if key in seen:
            continue
        seen.add(key)
        why = blocker(fw, p)
        if why is None:
            ok.append(p)
        elif p in plans:
            rest.append((p, why))
    from .search import plan_order

    ok.sort(key=plan_order)
    return [(p, None) for p in ok] + rest


# ---- calibration ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """A fitted efficiency for (``gpu``, ``framework``): the published run it was fitted on,
    and how the framework's other published runs on that chip land after the fit
    (``spread``: the least and most of predicted / published step - 1; ``runs`` of them)."""

    gpu: str
    framework: str
    efficiency: float
    fitted_on: str
    spread: tuple[float, float] | None
    runs: int
    note: str = ""


# Fitted by ``python bench/bench_frameworks.py`` (the published runs of plan/published.py,
# each priced under its framework's profile, at the run's own precision); the figures are
# that script's output (spread: predicted / published step - 1 of the other runs).
CALIBRATIONS: dict[tuple[str, str], Calibration] = {(c.gpu, c.framework): c for c in (
    Calibration("a100-80gb", "megatron", 0.739, "SC'21 Table 1, 18.4B row", (-0.055, 0.038),
                13, "those are Table 1's other 9 rows and Korthikanti et al. 2022's 4"),
    Calibration("h100-sxm", "megatron", 0.569, "Llama 3 405B, 16,384 GPUs, 8K", (-0.003, 0.001),
                2, "no Megatron-LM run on H100 is in the bench: Llama 3 (Meta's own "
                "framework, Megatron's techniques) stands in"),
    Calibration("h100-sxm", "torchtitan", 0.391, "Llama 3.1 8B FSDP on 8 GPUs (its "
                "docs/performance.md)", (-0.029, -0.029), 1,
                "fitted with its op-level SAC priced as that policy (recompute op) and on "
                "500 W HBM2e H100s; priced as full recompute at 835 TFLOP/s the same run "
                "lands within 3 % at the Llama 3 fit, so plans without recompute may be "
                "predicted up to ~35 % too slow"),
    Calibration("a100-80gb", "deepspeed", 0.643, "GPT-NeoX-20B (96 A100 40 GB), the run "
                "whose fit predicts the other DeepSpeed runs best", (-0.069, 0.088), 4,
                "MT-NLG 530B x 3 -2.9 / -4.1 / -6.9 %, BLOOM-176B +8.8 % (its 2022 engine ran "
                "fastest: fitted on it, 0.714, the others land 8-15 % faster than they ran)"),
)}

SAME_CHIP = {"a100-40gb": "a100-80gb", "h200": "h100-sxm"}
"""Chips whose tensor cores are another preset's (the A100 40 GB is the 80 GB's; the H200 is
the H100's GH100 with more and faster HBM, which the preset carries)."""

STAND_IN = {"nemo": "megatron"}
"""A framework with no published fit of its own uses this one's (NeMo runs Megatron-Core)."""


def calibration(gpu: str, framework: str | Framework) -> Calibration | None:
    """The published fit for (``gpu``, ``framework``), through :data:`SAME_CHIP` and
    :data:`STAND_IN`; None when there is none."""
    fw = get_framework(framework).name
    chip = SAME_CHIP.get(gpu, gpu)
    for name in (fw, STAND_IN.get(fw)):
        got = CALIBRATIONS.get((chip, name)) if name else None
        if got is not None:
            return got
    return None


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def calibration_note(gpu: str | None, framework: str | Framework, efficiency: float | None,
                     source: str, measured: str = "") -> str:
    """One sentence: which calibration the absolute numbers rest on and how far they may be
    off. ``source``: ``published`` (:func:`calibration`), ``measured`` (``--measured-step``,
    ``measured`` says what ran), ``given`` (``--efficiency``), ``mfu`` (``--mfu``) or
    ``preset`` (the GPU preset's default)."""
    fw = get_framework(framework)
    if gpu is None:
        return ("absolute times: the profile's own (measured, or at its --tflops/--mfu); no "
                "GPU calibration applies")
    cal = calibration(gpu, fw) if fw.name != "none" else None
    spread = (f"at it the other published {get_framework(cal.framework).label} runs on "
              f"this chip were predicted within {_pct(cal.spread[0])} … "
              f"{_pct(cal.spread[1])} of their steps ({cal.runs} run{'s' * (cal.runs != 1)})"
              if cal is not None and cal.spread is not None else None)
    every = sorted({c.efficiency for c in CALIBRATIONS.values()
                    if c.gpu == SAME_CHIP.get(gpu, gpu)})
    rng = (f"published fits on this chip range {every[0]:.3f} … {every[-1]:.3f} by framework"
           if every else "no published run on this chip has been fitted")
    if source == "published" and cal is not None:
        tail = f"; {spread}" if spread else ""
        return (f"absolute times rest on efficiency {efficiency:.3f}, the published fit for "
                f"({cal.gpu}, {cal.framework}) on {cal.fitted_on}{tail}"
                + (f"; {cal.note}" if cal.note else ""))
    if source == "measured":
        tail = f"; {spread}: expect other configurations about that far off" if spread else (
            f"; {rng}")
        return (f"absolute times rest on efficiency {efficiency:.3f}, fitted to your "
                f"--measured-step ({measured}){tail}")
    if source == "given":
        return f"absolute times rest on --efficiency {efficiency:g} as given (not fitted); {rng}"
    if source == "mfu":
        return "absolute times rest on --mfu as given: every FLOP at that fraction of peak"
    hint = (" (give --framework for a published fit, or --config with --measured-step)"
            if fw.name == "none" else
            f" (no published {fw.label} run on this chip: --config with --measured-step fits "
            "one)")
    return (f"absolute times rest on efficiency {efficiency:g}, the {gpu} preset's default, "
            f"not fitted to any run{hint}; {rng}, so they may be off by tens of percent")
