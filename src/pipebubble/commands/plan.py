"""``pipebubble plan``: choose pp, dp, microbatch size, schedule, chunks and recomputation.

Reads one or more profiles (measured, or ``pipebubble profile --analytic``), searches every
configuration of the GPUs (:mod:`pipebubble.plan.planner`), prints the fastest plans that fit
the memory budget with paste-ready torchtitan and Megatron-LM settings, and with
``--validate K`` runs the top K that fit this machine for real (:mod:`pipebubble.plan.validate`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import limits as L
from ..errors import UserError
from ..files import json_text, write_text
from ..interop.timeline_json import clean_floats
from ..params import parse_size
from ..plan.config import parse_config, restrict
from ._flags import arg_type as as_arg_type
from ._flags import render
from .common import (
    check_outputs,
    float_flag,
    int_flag,
    positive_int,
    print_json,
    real_flag,
    wrote,
)


def _moe_recipe(text: str):
    """``--moe-recipe NAME`` (:func:`pipebubble.plan.expert.recipe_named`)."""
    from ..plan.expert import recipe_named

    return recipe_named(text)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="choose pp, dp, microbatches, schedule, chunks, recompute for N GPUs",
        description="Search pipeline depth (pp), data parallelism (dp = GPUs / pp), "
        "microbatch size, schedule, chunks and recomputation for a profiled model; cut the "
        "layers for each, simulate it with P2P and all-reduce times, keep what fits the GPU "
        "memory, print the fastest plans and their torchtitan / Megatron-LM settings.")
    p.add_argument("--profile", action="append", required=True, metavar="FILE",
                   help="profile JSON (pipebubble profile [--analytic]); repeat it with "
                   "profiles at different --batch to interpolate between them")
    p.add_argument("--gpus", type=positive_int("--gpus", L.MAX_GPUS), required=True, metavar="N",
                   help="GPUs to plan for (pipeline x data parallel)")
    p.add_argument("--gpu-memory", type=size_value("--gpu-memory"), default=None,
                   metavar="BYTES", help="memory per GPU: 80GiB, 24e9 (the --gpu preset's, "
                   "else 80GiB)")
    p.add_argument("--global-batch", required=True,
                   type=positive_int("--global-batch", L.MAX_GLOBAL_BATCH),
                   metavar="B", help="samples per optimizer step, over all replicas")
    p.add_argument("--microbatch-size", "--mbs", type=int_list("--microbatch-size"),
                   default=[1, 2, 4], metavar="LIST", help="microbatch sizes to try (1,2,4)")
    from ..schedules import schedule_names

    p.add_argument("--schedules", default="all", metavar="all|LIST",
                   help="schedule families to try: all (default: every registered one, and "
                   f"auto when available) or a comma list of {', '.join(schedule_names())}")
    p.add_argument("--max-chunks", default=4, metavar="V",
                   type=positive_int("--max-chunks", L.MAX_CHUNKS),
                   help="most stages per rank for interleaved families (4)")
    p.add_argument("--recompute", default=None, metavar="LIST",
                   help="recomputation modes: none, selective, full, op (torchtitan's "
                   "op-level selective checkpointing), or all (none,full when the profile "
                   "allows it, else none)")
    p.add_argument("--param-bytes", type=size_value("--param-bytes"), default=None,
                   metavar="N", help="bytes of each weight the forward reads (2: bf16)")
    p.add_argument("--grad-bytes", type=size_value("--grad-bytes"), default=None, metavar="N",
                   help="bytes of each gradient held (2: bf16; 4: fp32 main gradients) and, "
                   "unless --grad-wire-bytes, reduced")
    p.add_argument("--optimizer-bytes", type=size_value("--optimizer-bytes"), default=None,
                   metavar="N", help="optimizer bytes per parameter: master copy + Adam m + v "
                   "(12: all fp32; 8: bf16 moments; 6: bf16 master and moments)")
    p.add_argument("--grad-wire-bytes", type=size_value("--grad-wire-bytes"), default=None,
                   metavar="N", help="bytes per gradient in the data-parallel reduction (4: "
                   "fp32; the --grad-bytes given, if any)")
    p.add_argument("--bytes-per-param", type=size_value("--bytes-per-param"), default=None,
                   metavar="N", help="older form: weights + gradients + optimizer bytes per "
                   "parameter, split 1/8 : 1/8 : 3/4 (16)")
    p.add_argument("--precision", default="bf16", metavar="bf16|fp8",
                   help="bf16 (default), or fp8: the blocks' GEMMs at the --gpu preset's FP8 "
                   "peak (attention, element-wise work and the head in bf16) and an FP8 copy "
                   "of every weight in memory")
    p.add_argument("--p2p-bandwidth", type=size_value("--p2p-bandwidth"), default=50e9,
                   metavar="BYTES/s", help="between pipeline ranks (50e9)")
    p.add_argument("--allreduce-bandwidth", type=size_value("--allreduce-bandwidth"),
                   default=50e9, metavar="BYTES/s", help="per link in the ring (50e9)")
    p.add_argument("--latency", type=real_flag("--latency"), default=1e-5, metavar="S",
                   help="per message (1e-5)")
    p.add_argument("--top", type=positive_int("--top"), default=5, metavar="K",
                   help="plans to show (5)")
    p.add_argument("--jobs", type=positive_int("--jobs", L.MAX_JOBS), default=None, metavar="N",
                   help="worker processes of the search (the CPUs this process may use): the "
                   "same plans at any N; 1 searches in one process; a small search runs in "
                   "one process whatever N is")
    p.add_argument("--exhaustive-cuts", default=64, metavar="N",
                   type=int_flag("--exhaustive-cuts", 0, L.MAX_EXHAUSTIVE_CUTS),
                   help="score every cut when there are at most N of them (64)")
    p.add_argument("--validate", default=0, metavar="K",
                   type=int_flag("--validate", 0, L.MAX_VALIDATE),
                   help="run the top K plans that fit this machine for real (sleeping the "
                   "profiled times, one process per rank) and compare")
    p.add_argument("--model", default=None, metavar="SPEC",
                   help="--validate on this model (a --model SPEC with the profile's layers: "
                   "file.py:NAME, package.module:NAME, hf:PATH or a built-in) instead of "
                   "sleeping the profiled times")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="--model: an argument of its function (hf: a config field)")
    p.add_argument("--seq", type=positive_int("--seq"), default=None, metavar="T",
                   help="--model: tokens per sample of a language model")
    p.add_argument("--max-processes", type=positive_int("--max-processes"), default=8,
                   metavar="N", help="--validate: most processes (pp x dp) a run may use (8)")
    p.add_argument("--target-step", default=1.0, metavar="S",
                   type=float_flag("--target-step", 0, L.MAX_TARGET_STEP, lo_open=True),
                   help="--validate: scale the profile so the first plan's step sleeps about "
                   "S seconds (1.0)")
    p.add_argument("--validate-tol", default=0.15, metavar="X",
                   type=float_flag("--validate-tol", 0, 10, lo_open=True),
                   help="--validate: a plan passes when its measured median step is within "
                   "this fraction of its prediction, and the ranking holds when no two plans "
                   "swap by more (0.15); exit 1 when one fails")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here; schedules torch "
                   "has no class for are written next to it as CSV")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    add_axes_flags(p)
    p.set_defaults(func=run)


def add_axes_flags(p: argparse.ArgumentParser) -> None:
    """The hardware, the compute model and the axes around the pipeline."""
    from ..plan.hardware import PRESETS

    g = p.add_argument_group(
        "hardware and parallelism (with --gpu, an analytic or --hf-config profile is priced "
        "per op; ranks are ordered TP innermost, then CP, DP, PP outermost)")
    g.add_argument("--gpu", default=None, metavar="NAME",
                   help=f"GPU preset: {', '.join(PRESETS)}")
    g.add_argument("--efficiency", type=real_flag("--efficiency"), default=None, metavar="X",
                   help="fraction of peak large GEMMs reach (the preset's default)")
    g.add_argument("--mfu", type=real_flag("--mfu"), default=None, metavar="X",
                   help="instead of the compute model: every FLOP at X of peak")
    g.add_argument("--peak-tflops", type=real_flag("--peak-tflops"), default=None,
                   metavar="T", help="override the preset's dense bf16 TFLOP/s")
    g.add_argument("--fp8-peak-tflops", type=real_flag("--fp8-peak-tflops"), default=None,
                   metavar="T", help="override the preset's dense FP8 TFLOP/s (--precision fp8)")
    for flag, unit, what in (("hbm-bandwidth", "BYTES/s", "HBM bandwidth"),
                             ("nvlink-bandwidth", "BYTES/s", "in-node link per GPU"),
                             ("inter-node-bandwidth", "BYTES/s", "rate of one scale-out NIC")):
        g.add_argument(f"--{flag}", type=size_value(f"--{flag}"), default=None, metavar=unit,
                       help=f"override the preset's {what}")
    g.add_argument("--nvlink-latency", type=real_flag("--nvlink-latency"), default=None,
                   metavar="S", help="override the preset's in-node latency per message")
    g.add_argument("--inter-node-latency", type=real_flag("--inter-node-latency"), default=None,
                   metavar="S",
                   help="override the preset's scale-out latency per message")
    g.add_argument("--bus-fraction", type=real_flag("--bus-fraction"), default=None,
                   metavar="X", help="override the share of a link's rate ring collectives "
                   "reach (nccl-tests' bus bandwidth over the link rate; preset 0.8)")
    g.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node"), default=None,
                   metavar="N", help="override the preset's GPUs per node (8)")
    g.add_argument("--nics-per-node", type=positive_int("--nics-per-node"), default=None,
                   metavar="N", help="override the preset's scale-out NICs per node (8: one "
                   "per GPU); a group crossing nodes drives as many as it has members there")
    for axis, what in (("tp", "tensor-parallel degrees (divisors of the heads up to a node)"),
                       ("cp", "context-parallel degrees (1,2,4,8 dividing the sequence)"),
                       ("pp", "pipeline depths (every divisor)"),
                       ("dp", "data-parallel degrees (every divisor)")):
        g.add_argument(f"--{axis}", type=int_list(f"--{axis}"), default=None, metavar="LIST",
                       help=what)
    g.add_argument("--ep", type=int_list("--ep"), default=None, metavar="LIST",
                   help="expert-parallel degrees (MoE profiles: inside dp_shard x cp, dividing "
                   "the experts; default every power of two that does)")
    g.add_argument("--etp", type=int_list("--etp"), default=None, metavar="LIST",
                   help="expert-tensor-parallel degrees (MoE profiles: ranks splitting each "
                   "expert, dividing tp, below tp with sp only; default 1 and tp, what "
                   "Megatron-Core and torchtitan run)")
    g.add_argument("--moe-imbalance", type=real_flag("--moe-imbalance"), default=None,
                   metavar="X", help="MoE: the busiest expert rank's tokens over the mean, "
                   ">= 1 (default the router's capacity factor, else 1.0: even routing)")
    g.add_argument("--moe-recipe", type=as_arg_type(_moe_recipe), default=None,
                   metavar="NAME", help="MoE: a framework's recipe beyond the axes, "
                   "deepseek-v3 (DeepSeek-V3's FP8 dispatch, block-scaled casts, 20 of 132 SMs "
                   "to communication, one MTP module, RMSNorm and MLA up-projections "
                   "recomputed, FP8 activation caching, the gate weights in the SwiGLU, "
                   "DeepEP's measured all-to-all rates on H800; FP8 GEMMs at the bf16 "
                   "efficiency) or none (default)")
    g.add_argument("--sp", default=None, metavar="0,1",
                   help="sequence parallelism off (0), on (1) or both (with tp > 1)")
    g.add_argument("--sharding", default=None, metavar="LIST",
                   help="ddp, zero1, zero2, fsdp, hsdp (all; hsdp needs --gpu)")
    g.add_argument("--fsdp-reshard", default="auto", metavar="POLICY",
                   help="fsdp/hsdp under gradient accumulation: always (gather the weights "
                   "every microbatch, forward and backward), never (keep them gathered, and the "
                   "gradients unsharded, across microbatches) or auto (torchtitan's default: "
                   "never with pp > 1, always without; with --framework, that framework's "
                   "default)")
    g.add_argument("--framework", default="none", metavar="NAME",
                   help="price and rank the plans as this framework runs them: megatron, "
                   "torchtitan, deepspeed, nemo, or none (the planner's own defaults; "
                   "plan/frameworks.py): its overlaps, reshard policy, schedules, model-state "
                   "bytes, shardings and published efficiency fit, each overridable")
    g.add_argument("--dp-overlap", default=None, metavar="on|off",
                   help="data-parallel traffic behind the last backward and the next forward "
                   "(the --framework's default: off for deepspeed's pipeline engine)")
    g.add_argument("--tp-overlap", default=None, metavar="off|backward|on",
                   help="TP collectives: off (all exposed), backward (the backward's behind "
                   "the weight gradients: Megatron-LM's default) or on (also pipelined with "
                   "their GEMMs, with sp: --tp-comm-overlap / AsyncTP); the --framework's "
                   "default")
    g.add_argument("--reserve", default="5%", metavar="BYTES|P%",
                   help="memory kept free on every GPU (5%%)")
    g.add_argument("--config", default=None, metavar="K=V,...",
                   help="evaluate this configuration (keys tp, sp, cp, pp, dp, ep, sharding, mbs, "
                   "schedule, v, recompute; the rest searched) and rank it by the lower bounds "
                   "of every other configuration, without a full search")
    g.add_argument("--exact-rank", action="store_true",
                   help="with --config: run the full search too and rank it among its plans")
    g.add_argument("--measured-step", type=real_flag("--measured-step"), default=None,
                   metavar="S",
                   help="with --config and --gpu: fit --efficiency to this measured step")


def size_value(flag: str):
    """A number with an optional unit (80GiB, 24e9, 50GB) in the range the flag has in
    :data:`pipebubble.params.REALS` (:func:`pipebubble.params.parse_size`)."""
    return as_arg_type(lambda text: parse_size(text, flag))


def int_list(flag: str):
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in L.split_list(text, flag)]  # 1,,2 is an error
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(
                f"{flag} must be a comma list of integers >= 1, like 1,2,4; got {text!r}")
        return sorted(set(values))

    return parse


def parse_reserve(text: str, memory: float) -> float:
    """``5%`` of the memory, or a size (``4GiB``)."""
    s = text.strip()
    if s.endswith("%"):
        try:
            pct = float(s[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise UserError(f"--reserve {text!r} must be a size (4GiB) or a percentage in "
                             "[0, 100)")
        return memory * pct / 100
    try:
        value = size_value("--reserve")(s) if s not in ("0", "0.0") else 0.0
    except argparse.ArgumentTypeError as exc:
        raise UserError(str(exc)) from None
    if value >= memory:
        raise UserError(f"--reserve {text} leaves nothing of --gpu-memory "
                         f"{memory / 2**30:.2f}GiB")
    return value


def build_request(args: argparse.Namespace, profiles, memory: float | None = None,
                  hardware: bool = False):
    from ..plan.expert import check_imbalance
    from ..plan.planner import Request

    if args.schedules.strip().lower() == "all":
        names = None
    else:
        names = tuple(L.split_list(args.schedules, "--schedules"))
        if not names:
            raise UserError("--schedules must be all or a comma list of schedule names")
    if args.recompute is None:
        # With FlashAttention selective recomputation keeps what none keeps and re-runs the
        # attention: never better, so it is tried only when asked for (--recompute).
        flash = profiles.metadata().get("attention", "flash") == "flash"
        # torchtitan's op-level SAC (op) only when asked for, as it is one framework's policy
        modes = tuple(m for m in profiles.recompute_modes() if m != "op") if (
            hardware and not flash) else (
            ("none", "full") if "full" in profiles.recompute_modes() else ("none",))
    else:
        modes = tuple(dict.fromkeys(m.lower() for m in L.split_list(args.recompute,
                                                                    "--recompute")))
        if modes == ("all",):
            modes = profiles.recompute_modes()
    if args.exhaustive_cuts < 0:
        raise UserError(f"--exhaustive-cuts must be >= 0, got {args.exhaustive_cuts}")
    if args.validate < 0:
        raise UserError(f"--validate must be >= 0, got {args.validate}")
    if not args.target_step > 0:
        raise UserError(f"--target-step must be > 0 seconds, got {args.target_step}")
    L.check_validation(args.validate, args.target_step)
    if args.validate:  # sleeping ranks may share cores, but each process takes memory
        L.check_processes(args.max_processes, True, "--max-processes")
    sp = None
    if args.sp is not None:
        try:
            sp = tuple(dict.fromkeys(bool(int(x)) for x in L.split_list(args.sp, "--sp")))
        except ValueError:
            sp = ()
        if not sp or any(x.strip() not in ("0", "1") for x in args.sp.split(",")):
            raise UserError(f"--sp must be 0, 1 or 0,1; got {args.sp!r}")
    from ..plan.sharding import check_reshard

    shardings = None
    if args.sharding is not None:
        from ..plan.memory import SHARDINGS

        shardings = tuple(dict.fromkeys(s.lower() for s in L.split_list(args.sharding,
                                                                        "--sharding")))
        bad = [s for s in shardings if s not in SHARDINGS]
        if bad or not shardings:
            raise UserError(f"unknown --sharding {','.join(bad) or args.sharding!r}; valid "
                             f"are {', '.join(SHARDINGS)}")
    return Request(gpus=args.gpus, gpu_memory=memory if memory is not None else args.gpu_memory,
                   global_batch=args.global_batch,
                   tp=tuple(args.tp) if args.tp else None, cp=tuple(args.cp) if args.cp else None,
                   pp=tuple(args.pp) if args.pp else None, dp=tuple(args.dp) if args.dp else None,
                   ep=tuple(args.ep) if args.ep else None,
                   etp=tuple(args.etp) if args.etp else None,
                   moe_imbalance=check_imbalance(args.moe_imbalance),
                   moe_recipe=args.moe_recipe,
                   sp=sp, shardings=shardings, fsdp_reshard=check_reshard(args.fsdp_reshard),
                   microbatch_sizes=tuple(args.microbatch_size), schedules=names,
                   max_chunks=args.max_chunks, recompute=modes,
                   **state_fields(args),
                   p2p_bandwidth=args.p2p_bandwidth,
                   allreduce_bandwidth=args.allreduce_bandwidth, latency=args.latency,
                   top=max(args.top, 3 * args.validate), exhaustive_cuts=args.exhaustive_cuts,
                   jobs=args.jobs if args.jobs is not None else L.available_cores())


def state_fields(args: argparse.Namespace) -> dict:
    """The Request's model-state and precision fields from the flags (memory.py):
    ``--param-bytes``, ``--grad-bytes`` and ``--optimizer-bytes`` (2, 2, 12 where not given),
    or the older ``--bytes-per-param`` (split 1/8 : 1/8 : 3/4), never both; the wire bytes of
    the gradient reduction ``--grad-wire-bytes``, else the ``--grad-bytes`` given (its
    meaning before it also counted the held gradients), else 4."""
    from ..plan.compute import check_precision

    given = {"--param-bytes": args.param_bytes, "--grad-bytes": args.grad_bytes,
             "--optimizer-bytes": args.optimizer_bytes}
    named = [k for k, v in given.items() if v is not None]
    if args.bytes_per_param is not None and named:
        raise UserError(f"--bytes-per-param (one total, split 1/8 : 1/8 : 3/4) and "
                         f"{', '.join(named)} both set the model states: give --param-bytes, "
                         "--grad-bytes and --optimizer-bytes alone (--grad-wire-bytes for the "
                         "reduction)")
    wire = args.grad_wire_bytes if args.grad_wire_bytes is not None else (
        args.grad_bytes if args.grad_bytes is not None else 4.0)
    states = None
    if named:
        states = tuple(v if v is not None else d for v, d in zip(given.values(), (2.0, 2.0, 12.0),
                                                                  strict=True))
    return {"bytes_per_param": args.bytes_per_param if args.bytes_per_param is not None
            else 16.0, "state_bytes": states, "grad_bytes": wire,
            "precision": check_precision(args.precision.strip().lower())}


def hardware_of(args: argparse.Namespace):
    """The --gpu preset with its overrides, or None (and no override without it)."""
    from ..plan.hardware import get_hardware

    over = {"peak_flops": args.peak_tflops * 1e12 if args.peak_tflops else None,
            "fp8_peak_flops": args.fp8_peak_tflops * 1e12 if args.fp8_peak_tflops else None,
            "hbm_bandwidth": args.hbm_bandwidth, "nvlink_bandwidth": args.nvlink_bandwidth,
            "nvlink_latency": args.nvlink_latency,
            "inter_node_bandwidth": args.inter_node_bandwidth,
            "inter_node_latency": args.inter_node_latency, "gpus_per_node": args.gpus_per_node,
            "nics_per_node": args.nics_per_node, "efficiency": args.efficiency,
            "bus_fraction": args.bus_fraction}
    if args.gpu is None:
        given = [f"--{k.replace('_', '-')}" for k, v in over.items() if v is not None]
        if given:
            raise UserError(f"{', '.join(given)} need --gpu NAME (the hardware they override)")
        return None
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {args.mfu}")
    return get_hardware(args.gpu, **over)


def run(args: argparse.Namespace) -> int:
    from ..plan.layercosts import ProfileSet
    from ..plan.planner import NoPlanFits, fmt_gib, model_of, search
    from ..plan.profile import Profile

    check_outputs(args, "out")  # a bad --out path fails before the search, not after
    if args.model is not None and not args.validate:
        raise UserError("--model is the model --validate runs; give --validate K too")
    hw = hardware_of(args)
    profiles = ProfileSet([Profile.load(p) for p in args.profile])
    if hw is None and profiles.metadata().get("hardware_free"):
        raise UserError("this analytic profile is hardware free (no --tflops): give --gpu "
                        "NAME to price its layers (a100-40gb, a100-80gb, h100-sxm, h200, h800, "
                        "b200, mi300x)")
    shape, seq, _ = model_of(profiles)
    if shape is None:  # an MoE profile: priced per op by plan/expert.py
        from ..plan.expert import moe_shape_of

        moe = moe_shape_of(profiles)
        if moe is not None:
            shape, seq = moe, int(profiles.metadata()["seq"])
    memory = args.gpu_memory or (hw.memory if hw is not None else 80 * 2**30)
    budget = memory - parse_reserve(args.reserve, memory)
    req = build_request(args, profiles, budget, hardware=hw is not None and shape is not None)
    fws, req, hw, cal_source = framework_of(args, req, hw)
    config = parse_config(args.config, args.gpus) if args.config is not None else None
    efficiency = args.efficiency
    if args.measured_step is not None:
        if config is None or hw is None or shape is None:
            raise UserError("--measured-step fits the efficiency to one run: it needs --config "
                             "(what ran), --gpu and an analytic or --hf-config profile")
        if args.efficiency is not None or args.mfu is not None:
            raise UserError("--measured-step fits --efficiency; it contradicts a given "
                             f"--{'efficiency' if args.efficiency is not None else 'mfu'}: "
                             "drop one")
        from ..plan.fit import fit_efficiency

        one = restrict(req, config)
        from dataclasses import replace

        one = replace(one, top=1)
        efficiency = fit_efficiency(
            lambda e: search(profiles, one, replace(hw, efficiency=e), e).plans[0].step_time,
            args.measured_step)
        hw = replace(hw, efficiency=efficiency)
        cal_source = "measured"
    if args.exact_rank and config is None:
        raise UserError("--exact-rank ranks a --config among the full search's plans; give "
                        "--config K=V,... too")
    # --config alone: priced on its own and ranked by bounds (plan/bound_rank.py); the full
    # search only for --exact-rank or --validate (which runs the search's plans)
    alone = config is not None and not args.exact_rank and not args.validate
    result = None
    if not alone:
        from ..plan.settings import megatron_side

        try:  # Megatron-LM's fastest plan on the way, for its paste (runnable_finder)
            result = search(profiles, req, hw, efficiency, args.mfu, sides=(megatron_side(),))
        except NoPlanFits as exc:
            if budget < memory:  # name the --gpu-memory that leaves that much after --reserve
                need = exc.smallest + (memory - budget) if not args.reserve.strip().endswith(
                    "%") else exc.smallest * memory / budget
                raise NoPlanFits(f"{render(exc)} (the budget is --gpu-memory minus --reserve "
                                 f"{args.reserve}: --gpu-memory {fmt_gib(need, up=True)} with "
                                 "it, or --reserve 0)", exc.smallest, exc.plan) from None
            raise
        if fws.framework.name != "none":
            result = framework_ranking(fws, result, profiles, req, hw, efficiency, args.mfu)
    mine, mine_fits, priced = None, True, None
    t_priced = time.perf_counter()
    if config is not None:
        from dataclasses import replace

        try:
            priced = price_config(fws, profiles, restrict(req, config), hw, efficiency,
                                  args.mfu)
            mine = priced.plans[0]
            mine_fits = True
        except NoPlanFits as exc:  # report it anyway: what it would need
            if exc.plan is None:
                raise
            mine, mine_fits = exc.plan, False
    bounds = None
    if alone and mine_fits:
        from ..plan.bound_rank import rank_by_bounds
        from ..plan.frameworks import blocker, may_run_config

        fw = fws.framework
        if fw.name == "none":
            bounds = rank_by_bounds(profiles, req, config, mine.step_time, hw, efficiency,
                                    args.mfu)
        else:  # ranked among what the framework runs
            bounds = rank_by_bounds(profiles, req, config, mine.step_time, hw, efficiency,
                                    args.mfu, lambda c: may_run_config(fw, c),
                                    ranks=lambda p: blocker(fw, p) is None)
    validations = []
    if args.validate:
        from ..plan.validate import fits_here, validate

        runnable = [p for p in result.plans if fits_here(p, args.max_processes)][:args.validate]
        if not runnable:
            raise UserError(f"--validate: no plan found runs in --max-processes "
                             f"{args.max_processes} (pp x dp processes, tp = cp = 1); plan "
                             "for fewer --gpus or raise --max-processes")
        if args.model is not None:  # the real model, at the plan's cut
            _check_model_layers(args, len(profiles.profile))
            from ..plan.validate import validate_on_model

            validations = validate_on_model(runnable, args.model, args.model_arg, args.seq)
        else:
            validations = validate(runnable, target=args.target_step)
    ctx = {"hw": hw, "shape": shape, "seq": seq, "memory": memory,
           "imbalance": req.moe_imbalance,
           "efficiency": hw.efficiency if hw is not None and args.mfu is None else None,
           "framework": fws}
    if alone:
        out = config_json(mine, priced, bounds, req, profiles, args.out, ctx,
                          time.perf_counter() - t_priced - (bounds.seconds if bounds else 0.0))
    else:
        out = result_json(result, profiles, validations, args.out, ctx, mine,
                          runnable_finder(result, profiles, req, hw, efficiency, args.mfu))
    from ..plan.frameworks import calibration_note

    measured = f"{args.measured_step:g} s at --config {args.config}" if (
        args.measured_step is not None) else ""
    out["framework"] = fws.as_json()
    note = calibration_note(hw.name if hw is not None else None, fws.framework,
                            ctx["efficiency"], cal_source, measured)
    out["calibration"] = {"source": cal_source, "efficiency": ctx["efficiency"], "note": note}
    judged = judge_validations(result, validations, args.validate_tol, out)
    if mine is not None and not mine_fits:
        out["config"].update(fits=False, rank=None,
                             rank_note=f"does not fit the {fmt_gib(budget)} budget")
    if args.out:  # the same numbers as --json prints
        write_text(args.out, json_text(clean_floats(out), "--out", indent=1) + "\n", "--out")
        wrote(args.out)
    failed = judged is not None and not judged["passed"]
    if args.json:
        print_json(out)
        return 1 if failed else 0
    from rich.console import Console

    if alone:
        print_config(Console(), mine, req, out)
    else:
        print_plans(Console(), result, out, validations)
    if failed:
        sys.stderr.write(f"pipebubble: --validate failed: {judged['summary']}\n")
    return 1 if failed else 0


def framework_of(args: argparse.Namespace, req, hw):
    """(the framework settings, the request and hardware priced under them, where the
    efficiency comes from: ``published``, ``given``, ``mfu`` or ``preset``;
    plan/frameworks.py). ``--framework none`` with no overlap flag changes nothing."""
    from ..plan import frameworks as F

    states = (args.param_bytes, args.grad_bytes, args.optimizer_bytes)
    fws = F.settings(args.framework, args.dp_overlap, args.tp_overlap, args.fsdp_reshard,
                     states, total_given=args.bytes_per_param is not None,
                     wire_given=args.grad_wire_bytes is not None or args.grad_bytes is not None)
    req, hw = F.apply(fws, req, hw)
    source = "given" if args.efficiency is not None else "mfu" if args.mfu is not None \
        else "preset"
    if hw is not None and source == "preset" and args.measured_step is None:
        cal = F.calibration(hw.name, fws.framework) if fws.framework.name != "none" else None
        if cal is not None:
            from dataclasses import replace

            hw, source = replace(hw, efficiency=cal.efficiency), "published"
    return fws, req, hw, source


def price_config(fws, profiles, one, hw, efficiency, mfu):
    """The search of the configurations ``--config`` matches (``one``: the request it
    restricts), its best plan first: what ``--config`` leaves open (the schedule, chunks,
    microbatch size, recomputation, sharding) searched. Under a framework the best of them
    it runs, when there is one (a search narrowed to its schedules, shardings and modes);
    else the best of that narrowed search or, when nothing is left of it, of them all, which
    the output marks "not runnable in FRAMEWORK" with the reason."""
    from dataclasses import replace

    from ..plan.frameworks import blocker, narrowed
    from ..plan.planner import NoPlanFits, search

    fw = fws.framework
    narrow = narrowed(fw, one, hw is not None) if fw.name != "none" else None
    if narrow is not None:
        try:
            got = search(profiles, replace(narrow, top=20), hw, efficiency, mfu)
        except (NoPlanFits, UserError):
            got = None
        if got is not None:  # none it runs: the narrowed best, marked with what blocks it
            runs = [p for p in got.plans if blocker(fw, p) is None] or got.plans
            return replace(got, plans=runs[:1], request=replace(got.request, top=1))
    return search(profiles, replace(one, top=1), hw, efficiency, mfu)


def framework_ranking(fws, result, profiles, req, hw, efficiency, mfu):
    """The result with the plans the framework runs first (plan/frameworks.py ``rank``): the
    top ``--top`` of them (a search narrowed to its schedules adds more when the plans found
    hold fewer), then those of the plans found it cannot run."""
    from dataclasses import replace

    from ..plan.frameworks import blocker, narrowed, rank
    from ..plan.planner import NoPlanFits, search

    fw = fws.framework
    more = []
    if sum(blocker(fw, p) is None for p in result.plans) < req.top:
        narrow = narrowed(fw, req, hw is not None)
        if narrow is not None:
            try:
                more = search(profiles, replace(narrow, top=max(3 * req.top, 20)),
                              hw, efficiency, mfu).plans
            except (NoPlanFits, UserError):
                more = []
    ranked = rank(fw, result.plans[:req.top], more)
    ok = [p for p, why in ranked if why is None][:req.top]
    rest = [p for p, why in ranked if why is not None]
    if not ok:  # nothing it runs fits: the plans found, as found, each marked
        return result
    plans = ok + rest
    return replace(result, plans=plans, request=replace(result.request, top=len(plans)))


def judge_validations(result, validations, tolerance: float, out: dict) -> dict | None:
    """Each validated plan's PASS/FAIL and the ranking (plan/validate.py), into ``out``: the
    plan items get ``validation.verdict``, ``out["validation"]`` the ranking and the whole
    verdict (``passed``: every plan passed and the ranking held). None without --validate."""
    if not validations:
        return None
    from ..plan.validate import ranking, verdict

    numbers = [result.plans.index(v.plan) + 1 for v in validations]
    verdicts = [verdict(v, tolerance) for v in validations]
    for n, item in enumerate(out["plans"], 1):
        if n in numbers and "validation" in item:
            item["validation"].update(verdicts[numbers.index(n)].as_json())
    order = ranking(validations, numbers, tolerance)
    failed = [n for n, x in zip(numbers, verdicts, strict=True) if not x.passed]
    why = []
    if failed:
        why.append(f"plan{'s' if len(failed) > 1 else ''} "
                   f"{', '.join(f'#{n}' for n in failed)} outside the {tolerance:.0%} "
                   "tolerance")
    if order is not None and not order.held:
        why.append("the ranking did not hold (" + ", ".join(
            f"#{a} predicted faster than #{b} measured over {tolerance:.0%} slower"
            for a, b in order.swapped) + ")")
    judged = {"passed": not why, "tolerance": tolerance, "plans": numbers,
              "ranking": order.as_json() if order is not None else None,
              "summary": "; ".join(why) or f"every plan within {tolerance:.0%}, ranking held"}
    out["validation"] = judged
    return judged


def runnable_finder(result, profiles, req, hw, efficiency, mfu):
    """``find(framework)``: the fastest plan that framework runs: among the plans found, else
    the search's side answer for it (:class:`~pipebubble.plan.visits.Side`: Megatron-LM's),
    else from a search narrowed to its shardings and schedules; None when none fits."""
    from dataclasses import replace

    from ..plan import settings
    from ..plan.families import schedule_list
    from ..plan.memory import SHARDINGS
    from ..plan.planner import NoPlanFits, search
    from ..plan.search import runnable_nowhere

    def find(framework: str):
        blocker = (settings.torchtitan_blocker if framework == "torchtitan"
                   else settings.megatron_blocker)
        for p in result.plans:
            if blocker(p) is None:
                return p
        if framework in result.sides:  # the search found it on the way (plan/visits.py Side)
            return result.sides[framework]
        ok = settings.TORCHTITAN_SHARDINGS if framework == "torchtitan" else \
            settings.MEGATRON_SHARDINGS
        every = SHARDINGS if hw is not None else SHARDINGS[:4]  # hsdp needs --gpu
        shardings = tuple(s for s in (req.shardings or every) if s in ok)
        names = [n for n in schedule_list(req.schedules) if not runnable_nowhere(n) and (
            framework == "torchtitan" or n in settings.megatron_families())]
        if not shardings or not names:
            return None
        narrowed = replace(req, shardings=shardings, schedules=tuple(names), top=1)
        try:  # the fastest plan it runs: the search keeps those only
            found = search(profiles, narrowed, hw, efficiency, mfu,
                           keep=lambda p: blocker(p) is None).plans
        except (NoPlanFits, UserError):
            return None
        return found[0] if found else None

    return find


def throughput(plan, ctx: dict) -> dict:
    """tokens/s per GPU and MFU (model FLOPs, Narayanan et al. eq. 3's attention count)."""
    from ..plan.expert import moe_model_flops_per_sequence
    from ..plan.parallel_costs import model_flops_per_sequence

    seq, shape, hw = ctx.get("seq"), ctx.get("shape"), ctx.get("hw")
    gpus = plan.gpus
    out = {"tokens_per_second_per_gpu": None, "mfu": None}
    if seq and plan.step_time > 0:
        out["tokens_per_second_per_gpu"] = plan.global_batch * seq / plan.step_time / gpus
        if shape is not None and hw is not None:
            from ..plan.moe import MoEShape

            flops = (model_flops_per_sequence(shape, seq) if not isinstance(shape, MoEShape)
                     else moe_model_flops_per_sequence(shape, seq)) * plan.global_batch
            out["mfu"] = flops / (plan.step_time * gpus * hw.peak_flops)
    return out


def plan_item(plan, profiles, ctx: dict, csv: str | None = None) -> dict:
    from ..plan import settings
    from ..plan.search import runnable_nowhere

    item = plan.as_json()
    item.update(throughput(plan, ctx))
    from ..plan.expert import all_to_all_summary

    a2a = all_to_all_summary(plan, profiles, ctx.get("hw"), ctx.get("imbalance"))
    if a2a is not None:
        item["all_to_all"] = a2a
    item["runnable_in"] = [] if runnable_nowhere(plan.schedule) else (
        (["torchtitan"] if settings.torchtitan_blocker(plan) is None else [])
        + (["megatron"] if settings.megatron_blocker(plan) is None else []))
    item["torchtitan"] = settings.torchtitan(plan, profiles, csv, ctx.get("seq"))
    item["megatron"] = settings.megatron(plan, profiles, ctx.get("seq"))
    fws = ctx.get("framework")
    if fws is not None and fws.framework.name != "none":
        from ..plan.frameworks import blocker, megatron_flags

        item["megatron"] = megatron_flags(fws, plan, item["megatron"])
        tt = item["torchtitan"]
        if fws.tp_overlap == "on" and plan.tp > 1 and "parallelism" in tt:  # runnable
            tt["note"] = "; ".join(x for x in (tt.get("note"), (
                "priced with AsyncTP (--tp-overlap on): set "
                "parallelism.enable_async_tensor_parallel = true, which torchtitan applies "
                "only with torch.compile")) if x)
        item["framework"] = fws.framework.name
        item["not_runnable"] = blocker(fws.framework, plan)
    item["megatron_version"] = settings.MEGATRON
    item["megatron_env"] = settings.megatron_env(plan) if item["megatron"] else ""
    if item["megatron"] is None:
        item["megatron_reason"] = settings.megatron_blocker(plan)
    item["fits"] = True
    return item


def csv_name(stem: str, what: str, plan) -> str | None:
    """Where a paste's CSV order goes (``STEM.WHAT.SCHEDULE.csv``), or None when the plan's
    torchtitan paste names no CSV (a class runs it, or torchtitan cannot)."""
    from ..plan import settings

    if plan.pp == 1 or settings.torch_class(plan.schedule) is not None or \
            settings.torchtitan_blocker(plan) is not None:
        return None
    return f"{stem}.{what}.{plan.schedule}.csv"


def result_json(result, profiles, validations, out_path: str | None, ctx: dict | None = None,
                mine=None, runnable=None) -> dict:
    """The JSON of ``plan``. CSV orders go next to ``out_path`` (``plan.*.csv`` in the
    current directory without it: then for the pasted plan only, the one printed). The
    pastes printed are those of the --config plan (``mine``) when given, else the best's;
    ``runnable(framework)`` finds the best plan a framework runs for a plan it cannot."""
    ctx = ctx or {}
    plans = []
    measured = {id(v.plan): v for v in validations}
    shown = result.plans[:result.request.top]
    stem = os.path.splitext(out_path)[0] if out_path else "plan"
    for k, plan in enumerate(shown):
        csv = csv_name(stem, f"plan{k + 1}", plan) if out_path or (k == 0 and mine is None) \
            else None
        item = plan_item(plan, profiles, ctx, csv)
        item["rank"] = k + 1
        item["why"] = why_beats(plan, shown[k + 1]) if k + 1 < len(shown) else None
        v = measured.get(id(plan))
        if v is not None:
            item["measured_step_time"] = v.measured_step_time  # the median of the steps
            item["measured_step_time_min"] = v.measured_step_time_min
            item["validation"] = v.as_json()
        plans.append(item)
        if csv:
            wrote(csv)
    hw = ctx.get("hw")
    out = {"searched": result.searched, "simulated": result.simulated,
           "seconds": result.seconds,
           "configurations_per_second": result.searched / result.seconds
           if result.seconds > 0 else None,
           "gpus": result.request.gpus, "gpu_memory": ctx.get("memory",
                                                              result.request.gpu_memory),
           "memory_budget": result.request.gpu_memory,
           "global_batch": result.request.global_batch,
           "gpu": hw.name if hw is not None else None, "efficiency": ctx.get("efficiency"),
           "axis_order": "tp (innermost, NVLink), cp, dp, pp (outermost)",
           "precision": result.request.precision,
           "model_states": dict(zip(("weights", "gradients", "optimizer"),
                                    result.request.model_states(), strict=True),
                                gradient_wire=result.request.grad_bytes),
           "plans": plans}
    if mine is not None:
        csv = csv_name(stem, "config", mine)
        item = plan_item(mine, profiles, ctx, csv)
        if csv:
            wrote(csv)
        pool = result.plans
        fws = ctx.get("framework")
        if fws is not None and fws.framework.name != "none":  # ranked among those it runs
            from ..plan.frameworks import blocker

            pool = [p for p in pool if blocker(fws.framework, p) is None] or pool
        faster = sum(1 for p in pool if p.step_time < mine.step_time * (1 - 1e-12))
        item["rank"] = faster + 1 if faster < len(pool) else None
        item["rank_note"] = (None if item["rank"] else
                             f"slower than all {len(pool)} plans shown")
        best = result.plans[0].step_time
        item["vs_best"] = mine.step_time / best - 1 if best > 0 else None
        out["config"] = item
    target, item = (mine, out["config"]) if mine is not None else (shown[0], plans[0])
    out["pastes"] = pastes(target, item, profiles, ctx, stem, runnable)
    return out


NOT_SEARCHED = ("not looked for: plan --config ranks by bounds, without a full search; run "
                "plan without --config, or add --exact-rank, for the best plan {} runs")


def config_json(mine, priced, bounds, req, profiles, out_path: str | None, ctx: dict,
                seconds: float = 0.0) -> dict:
    """The JSON of ``plan --config`` without a full search: the configuration priced on its
    own (``priced``: the search restricted to it) under ``config``, its pastes, and its rank
    from the bounds (``bounds``, :class:`~pipebubble.plan.bound_rank.BoundRank`; None when it
    does not fit) under ``config.rank_bounds``; ``plans`` is empty (none was searched);
    ``seconds``: the pricing's."""
    stem = os.path.splitext(out_path)[0] if out_path else "plan"
    hw = ctx.get("hw")
    csv = csv_name(stem, "config", mine)
    item = plan_item(mine, profiles, ctx, csv)
    if csv:
        wrote(csv)
    out = {"searched": priced.searched if priced is not None else 0,
           "simulated": priced.simulated if priced is not None else 0,
           "seconds": seconds,
           "configurations_per_second": None,
           "gpus": req.gpus, "gpu_memory": ctx.get("memory", req.gpu_memory),
           "memory_budget": req.gpu_memory, "global_batch": req.global_batch,
           "gpu": hw.name if hw is not None else None, "efficiency": ctx.get("efficiency"),
           "axis_order": "tp (innermost, NVLink), cp, dp, pp (outermost)",
           "precision": req.precision,
           "model_states": dict(zip(("weights", "gradients", "optimizer"),
                                    req.model_states(), strict=True),
                                gradient_wire=req.grad_bytes),
           "plans": []}
    item["vs_best"] = None  # no best was searched for: rank_bounds.best_bound_vs_step
    if bounds is not None:
        fws = ctx.get("framework")
        fw = fws.framework.name if fws is not None else "none"
        item["rank"] = bounds.low if bounds.exact else None
        item["rank_note"] = rank_statement(bounds, fw)
        item["rank_bounds"] = {**bounds.as_json(), "framework": fw,
                               "best": _label(bounds.best) if bounds.best is not None
                               else None,
                               "fastest": _label(bounds.fastest) if bounds.fastest is not None
                               else None}
    out["config"] = item
    out["pastes"] = pastes(mine, item, profiles, ctx, stem, None, NOT_SEARCHED)
    for fw in ("torchtitan", "megatron"):
        note = out["pastes"][fw].get("instead_note")
        if note:
            out["pastes"][fw]["instead_note"] = note.format(
                "torchtitan" if fw == "torchtitan" else "Megatron-LM")
    return out


def rank_statement(b, framework: str = "none") -> str:
    """The rank the bounds give (:class:`~pipebubble.plan.bound_rank.BoundRank`), in words."""
    among = "" if framework == "none" else f" {framework} may run"
    priced = ""
    if b.fastest is not None:
        priced = (f"{b.faster:,} of the {b.priced} with the lowest bounds, priced, are faster "
                  f"(the fastest, {_label(b.fastest)}: {_t(b.fastest.step_time)}, a step "
                  f"{1 - b.fastest.step_time / b.step:.1%} shorter)")
    elif b.priced:
        priced = f"the {b.priced} with the lowest bounds, priced, are not faster"
    if b.exact:
        head = (f"rank: #{b.low} (no other configuration{among}'s lower bound beats it"
                if b.faster == 0 and not b.priced else f"rank: #{b.low} (exact")
        return f"{head}: {', '.join(x for x in (priced, _not_faster(b)) if x)})"
    pct = 1 - b.best_bound / b.step if b.step > 0 else 0.0
    could = (f"{b.could_be_faster:,} more configurations{among} could be faster (their lower "
             f"bounds are below its step; the best, {_label(b.best)}, is {_t(b.best_bound)}: "
             f"a step at most {pct:.1%} shorter)")
    return (f"rank between #{b.low} and #{b.high:,}: "
            + "; ".join(x for x in (priced, could, _not_faster(b)) if x)
            + "; run plan without --config, or add --exact-rank, for the exact rank")


def _not_faster(b) -> str:
    """The configurations certainly not faster, in words."""
    parts = [f"{b.slower:,} slower" if b.slower else "",
             f"{b.cannot_fit:,} cannot fit" if b.cannot_fit else "",
             f"{b.not_run:,} not run by the framework" if b.not_run else ""]
    parts = [x for x in parts if x]
    return f"{b.slower + b.cannot_fit + b.not_run:,} are certainly not ({', '.join(parts)})" \
        if parts else ""


def print_config(console, mine, req, out: dict) -> None:
    """``plan --config`` without a full search: the configuration's row, its summary, its
    rank from the bounds and its pastes."""
    from ..render.table import fit

    cfg = out["config"]
    rb = cfg.get("rank_bounds")
    gpu = f" ({out['gpu']}, efficiency {out['efficiency']:g})" if out.get("gpu") and out.get(
        "efficiency") else ""
    ranked = (f"; ranked by the lower bounds of the {rb['considered']:,} configurations a "
              f"full search considers, in {rb['seconds']:.2f} s" if rb else "")
    what = (f"{out['searched']} configuration{'s' if out['searched'] != 1 else ''}, "
            f"{out['simulated']} simulation{'s' if out['simulated'] != 1 else ''}"
            if cfg.get("fits", True) else "it does not fit: the least memory it needs")
    console.print(f"[bold]--config priced on its own[/bold] ({what}) in "
                  f"{out['seconds']:.2f} s{ranked}; {req.gpus} GPUs{gpu} x "
                  f"{_gib(out['gpu_memory'])} ({_gib(req.gpu_memory)} after --reserve), global "
                  f"batch {req.global_batch}; ranks ordered tp (innermost), cp, dp, pp "
                  "(outermost)", highlight=False)
    console.print(_states_line(req), highlight=False)
    name = ("cfg" if not rb else f"cfg (#{rb['low']})" if rb["low"] == rb["high"]
            else f"cfg (#{rb['low']}-#{rb['high']})")
    console.print(fit(plan_table("--config (predicted by simulation; tp 's': sequence "
                                 "parallel)", [name], [cfg]), console.width))
    for line in framework_lines(out, [(None, cfg)]):
        console.print(line, highlight=False, markup=False)
    console.print(f"--config: {plan_summary(mine, req.gpu_memory)}", highlight=False)
    if not cfg.get("fits", True):
        console.print(f"--config {cfg['rank_note']}: it needs "
                      f"{_gib(max(cfg['peak_memory']))} at its peak; not ranked",
                      highlight=False)
    elif cfg.get("rank_note"):
        console.print(cfg["rank_note"], highlight=False)
    print_pastes(console, out["pastes"], "--config",
                 (out.get("framework") or {}).get("framework", "none"))


def pastes(plan, item: dict, profiles, ctx: dict, stem: str, runnable=None,
           not_searched: str | None = None) -> dict:
    """The pastes printed for ``plan`` (its JSON ``item``): each framework's own when it
    runs the plan, else the reason and, under ``instead``, the paste of the best plan it
    runs (``runnable(framework)``, None when no plan it runs fits). ``not_searched``: no
    such plan was looked for (``plan --config`` without a full search), why, as
    ``instead_note``."""
    from ..plan import settings

    out = {"plan": _label(plan), "torchtitan": item["torchtitan"],
           "megatron": {"version": settings.MEGATRON, "flags": item["megatron"],
                        "env": item["megatron_env"]}}
    if item["megatron"] is None:
        out["megatron"]["reason"] = item.get("megatron_reason")
    for fw in ("torchtitan", "megatron"):
        blocked = (settings.torchtitan_blocker if fw == "torchtitan"
                   else settings.megatron_blocker)(plan)
        if blocked is None:
            continue
        alt = runnable(fw) if runnable is not None else None
        if alt is None:
            out[fw]["instead"] = None
            if not_searched:
                out[fw]["instead_note"] = not_searched
            continue
        alt_item = plan_item(alt, profiles, ctx, csv_name(stem, fw, alt))
        if csv_name(stem, fw, alt):
            wrote(csv_name(stem, fw, alt))
        paste = alt_item["torchtitan"] if fw == "torchtitan" else {
            "version": settings.MEGATRON, "flags": alt_item["megatron"],
            "env": alt_item["megatron_env"]}
        out[fw]["instead"] = {"plan": _label(alt), "config": {k: alt_item[k] for k in (
                                  "tp", "sp", "cp", "pp", "dp", "ep", "etp", "sharding", "schedule",
                                  "chunks", "placement", "microbatch_size", "microbatches",
                                  "recompute", "stages")},
                              "predicted_step_time": alt.step_time,
                              "vs_plan": alt.step_time / plan.step_time - 1
                              if plan.step_time > 0 else None,
                              "peak_memory": max(alt.peak_memory), **paste}
    return out


# ---- output ----------------------------------------------------------------------------------

def _t(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1e3:.4g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.4g} µs"


def _gib(n: float) -> str:
    """Bytes in GiB (MiB or KiB when smaller)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale or unit == "KiB":
            return f"{n / scale:.1f} {unit}"
    return ""


def why_beats(a, b) -> str:
    """Why plan ``a`` is ahead of ``b``: the margin and the parts of the step that differ."""
    gain, reasons = _margin(a, b)
    return f"{gain:.1%} faster than the next: {reasons}"


def _margin(a, b) -> tuple[float, str]:
    """(how much faster ``a`` is than ``b``, the parts of the step that make it so)."""
    gain = b.step_time / a.step_time - 1 if a.step_time > 0 else 0.0
    reasons = []
    if a.bubble_fraction < b.bubble_fraction - 1e-9:
        reasons.append(f"less bubble ({a.bubble_fraction:.1%} vs {b.bubble_fraction:.1%})")
    if a.dp_exposed < b.dp_exposed - 1e-12:
        reasons.append(f"less exposed data-parallel traffic ({_t(a.dp_exposed)} vs "
                       f"{_t(b.dp_exposed)})")
    if a.pipeline_time < b.pipeline_time and not reasons:
        reasons.append(f"a shorter pipeline ({_t(a.pipeline_time)} vs {_t(b.pipeline_time)}: "
                       "faster layers at its tp/cp/microbatch size)")
    if not reasons and max(a.peak_memory) < max(b.peak_memory):
        reasons.append(f"the same step in less memory ({_gib(max(a.peak_memory))} vs "
                       f"{_gib(max(b.peak_memory))})")
    return gain, ", ".join(reasons) or "a different balance of the same costs"


def _label(p) -> str:
    """A plan's (or a configuration's) degrees, sharding, schedule and microbatching."""
    c = getattr(p, "config", p)
    return (f"tp={c.tp}{' sp' if c.sp else ''} cp={c.cp} pp={c.pp} dp={c.dp}"
            f"{f' ep={c.dims.ep}' if c.dims.ep > 1 else ''}"
            f"{f' etp={c.dims.etp}' if c.dims.etp != c.tp else ''} {c.sharding} "
            f"{c.schedule} v={c.chunks} mbs={c.microbatch_size} m={c.microbatches} "
            f"recompute {c.recompute}")


def print_plans(console, result, out: dict, validations) -> None:
    """The top plans as a table, why the best wins, its settings, and the validation."""
    from ..render.table import fit

    req = result.request
    gpu = f" ({out['gpu']}, efficiency {out['efficiency']:g})" if out.get("gpu") and out.get(
        "efficiency") else ""
    console.print(f"[bold]searched {result.searched} configurations[/bold] ({result.simulated} "
                  f"simulations) in {result.seconds:.2f} s: "
                  f"{result.searched / max(result.seconds, 1e-9):.0f} configurations/s; "
                  f"{req.gpus} GPUs{gpu} x {_gib(out['gpu_memory'])} ({_gib(req.gpu_memory)} "
                  f"after --reserve), global batch {req.global_batch}; ranks ordered tp "
                  "(innermost), cp, dp, pp (outermost)", highlight=False)
    console.print(_states_line(req), highlight=False)
    rows = list(zip(result.plans[:req.top], out["plans"], strict=False))
    if out.get("config") is not None:
        rows.append((None, out["config"]))
    names = [str(k + 1) if p is not None else f"cfg (#{item['rank'] or '>' + str(k)})"
             for k, (p, item) in enumerate(rows)]
    console.print(fit(plan_table("fastest plans that fit (predicted by simulation; tp 's': "
                                 "sequence parallel)", names, [item for _, item in rows]),
                      console.width))  # headers give way at 80 columns, values never
    for line in framework_lines(out, rows):  # wrapped at the console's width, as why_best's
        console.print(line, highlight=False, markup=False)
    for line in why_best(result, out):
        console.print(line, highlight=False)
    print_pastes(console, out["pastes"], "--config" if out.get("config") else "the best plan",
                 (out.get("framework") or {}).get("framework", "none"))
    if validations:
        print_validations(console, result, validations, out.get("validation"))


def _states_line(req) -> str:
    w, g, o = req.model_states()
    return (f"{req.precision}; model states {w:g} + {g:g} + {o:g} bytes a parameter "
            f"(weights + gradients + optimizer), gradients reduced in {req.grad_bytes:g}")


def plan_table(title: str, names: list[str], items: list[dict]):
    """The plans' table: one row per plan's JSON item, named ``names``."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("#", "tp.cp.pp.dp", "sharding", "schedule", "mbs x m", "recomp.", "step",
                "tok/s/GPU", "MFU", "bubble", "memory"):
        t.add_column(col, justify="left" if col in ("schedule", "recomp.", "sharding")
                     else "right")
    for name, item in zip(names, items, strict=True):
        tok, mfu = item.get("tokens_per_second_per_gpu"), item.get("mfu")
        sched = item["schedule"] + (f" v={item['chunks']}" if item["chunks"] > 1 else "") + (
            f" (not in {item['framework']})" if item.get("not_runnable") else
            "" if item["runnable_in"] or item.get("framework") else " (no framework)")
        shard = item["sharding"] + (f" ({item['fsdp_reshard']})" if item.get("fsdp_reshard")
                                    else "")  # fsdp (always) / fsdp (never)
        t.add_row(name, f"{item['tp']}{'s' if item['sp'] else ''}.{item['cp']}.{item['pp']}."
                  f"{item['dp']}" + (f" ep{item['ep']}" if item.get("ep", 1) > 1 else "")
                  + (f" etp{item['etp']}" if item.get("etp", item["tp"]) != item["tp"]
                     else ""),
                  shard, sched,
                  f"{item['microbatch_size']}x{item['microbatches']}", item["recompute"],
                  _t(item["predicted_step_time"]),
                  f"{tok:,.0f}" if tok else f"{item['samples_per_second']:.1f} sm/s",
                  f"{mfu:.1%}" if mfu else "—", f"{item['bubble_fraction']:.1%}",
                  _gib(max(item["peak_memory"])))
    return t


def framework_lines(out: dict, rows) -> list[str]:
    """The framework the plans are priced for, each shown plan it cannot run with the reason,
    and the calibration the absolute numbers rest on."""
    lines = []
    fw = out.get("framework")
    if fw and fw["framework"] != "none":
        over = f"; set by flag: {', '.join(fw['overridden'])}" if fw["overridden"] else ""
        lines.append(f"priced as {fw['version']} runs it: data-parallel overlap "
                     f"{'on' if fw['dp_overlap'] else 'off'}, TP overlap {fw['tp_overlap']}, "
                     f"FSDP reshard {fw['fsdp_reshard']}{over}; plans it runs ranked first")
        for k, (p, item) in enumerate(rows):
            if item.get("not_runnable"):
                name = f"#{k + 1}" if p is not None else "--config"
                lines.append(f"{name}: not runnable in {fw['framework']}: "
                             f"{item['not_runnable']}")
    cal = out.get("calibration")
    if cal and cal.get("note"):
        lines.append(cal["note"])
    return lines


def _not_runnable(framework: str, reason: str | None, alt: dict | None,
                  note: str | None = None) -> str:
    """The line saying ``framework`` cannot run the plan, and the best plan it runs instead
    (``alt``, a paste's ``instead``), or that none was found, or (``note``) why none was
    looked for."""
    return f"{framework}: not runnable in {framework}: {reason}" + (
        f"; {note}" if alt is None and note else
        "; no plan it runs was found (among the --schedules and --sharding asked for)"
        if alt is None else
        f"; the best plan it runs instead: {alt['plan']} ({_t(alt['predicted_step_time'])}"
        f" per step, {alt['vs_plan']:+.1%}, peak {_gib(alt['peak_memory'])}):")


def print_pastes(console, pastes: dict, which: str, framework: str = "none") -> None:
    """Each framework's paste for the plan (or the best plan it runs instead, said so); under
    ``--framework`` only that framework's (NeMo: Megatron-LM's flags, the fields its recipes
    set; DeepSpeed: none is written)."""
    from ..plan.settings import TORCHTITAN_CLI, toml_text

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False, soft_wrap=True)

    console.print(f"\n[bold]pastes for {which}[/bold] ({pastes['plan']}):", highlight=False)
    if framework == "deepspeed":
        say("DeepSpeed: no paste is written (its JSON config and Megatron-DeepSpeed flags are "
            "not generated yet): the plan above is what to set")
        return
    if framework == "nemo":
        say("NeMo runs Megatron-Core: the Megatron-LM flags below are the fields of its recipe "
            "(trainer.strategy's parallel sizes, model config, ddp config)")
    tt = pastes["torchtitan"] if framework in ("none", "torchtitan") else None
    if tt is None:
        pass
    elif tt.get("runnable") is False:
        alt = tt.get("instead")
        say(_not_runnable("torchtitan", tt["reason"], alt, tt.get("instead_note")))
        tt = alt
    if tt is not None:
        say(toml_text(tt))
        say(f"torchtitan, {TORCHTITAN_CLI}: --module MODEL --config CONFIG_FUNCTION "
            f"{tt['cli']}")
    if framework == "torchtitan":
        return
    mg = pastes["megatron"]
    if mg["flags"] is None:
        alt = mg.get("instead")
        say(_not_runnable("Megatron-LM", mg.get("reason"), alt, mg.get("instead_note")))
        mg = alt
    if mg is not None:
        env = f"{mg['env']} " if mg.get("env") else ""
        say(f"Megatron-LM, for {mg['version']}: {env}{mg['flags']}")


def print_validations(console, result, validations, judged: dict | None = None) -> None:
    """The validation table (with each plan's verdict), what was measured, each plan's note
    (its miss against the spread and the machine's load) and whether the ranking held."""
    if validations:
        _print_table(console, result, validations, judged)
    if validations and judged is not None:
        for item in judged_items(judged, validations, result):
            console.print(item, highlight=False, markup=False, soft_wrap=True)


def judged_items(judged: dict, validations, result) -> list[str]:
    """The lines under the validation table: each plan's verdict note, the ranking, the
    overall verdict."""
    from ..plan.validate import verdict

    lines = []
    for v in validations:
        n = result.plans.index(v.plan) + 1
        x = verdict(v, judged["tolerance"])
        lines.append(f"#{n} {'PASS' if x.passed else 'FAIL'}: {x.note}")
    r = judged.get("ranking")
    if r is not None and len(r["predicted_order"]) > 1:
        tau = "—" if r["kendall_tau"] is None else f"{r['kendall_tau']:+.2f}"
        order = lambda xs: " < ".join(f"#{n}" for n in xs)  # noqa: E731
        lines.append(f"ranking {'held' if r['held'] else 'did NOT hold'}: predicted "
                     f"{order(r['predicted_order'])}, measured {order(r['measured_order'])} "
                     f"(Kendall tau {tau}; the predicted best "
                     f"{'measured fastest' if r['top_plan_fastest'] else 'did not measure fastest'}"
                     f"; a swap counts beyond {judged['tolerance']:.0%})")
    lines.append(f"validation {'PASS' if judged['passed'] else 'FAIL'}: {judged['summary']}"
                 + ("" if judged["passed"] else " (exit 1)"))
    return lines


def _print_table(console, result, validations, judged: dict | None) -> None:
    from rich.table import Table

    from ..plan.validate import plan_cut
    from ..render.table import fit

    tol = judged["tolerance"] if judged is not None else None
    real = validations[0].model
    what = f"model {real}" if real else "sleeping the scaled profile"
    v = Table(title=f"validation: run for real ({what}, one process per rank, gloo)")
    for col in ("#", "plan", *(["--boundaries"] if real else []), "processes", "predicted",
                "measured (median)", "error", "verdict", "vs best measured", "fastest step",
                "spread"):
        v.add_column(col, justify="right")
    done = [x.measured for x in validations if x.measured is not None]
    best_m = min(done) if done else None
    for x in validations:
        k = result.plans.index(x.plan) + 1
        p = x.plan
        name = f"pp={p.pp} dp={p.dp} {p.schedule} v={p.chunks} m={p.microbatches}"
        cut = [plan_cut(p).flag or "(one stage)"] if real else []
        if x.measured is None:
            v.add_row(str(k), name, *cut, str(p.gpus), _t(x.predicted), "failed",
                      x.error or "", "FAIL", "", "", "")
            continue
        err = x.relative_error
        ok = err is not None and tol is not None and abs(err) <= tol
        v.add_row(str(k), name, *cut, str(p.gpus), _t(x.predicted), _t(x.measured),
                  "—" if err is None else f"{err:+.1%}",
                  "" if tol is None else ("PASS" if ok else "FAIL"),
                  f"{x.measured / best_m - 1:+.1%}", _t(x.measured_min),
                  "—" if x.spread is None else f"{x.spread:.1%}")
    console.print(fit(v, console.width))
    m = validations[0].machine
    steps = f"{len(validations[0].steps) or 'the'} steps after {validations[0].warmup} " \
        "unmeasured warm-up step(s); spread = (slowest - fastest) / fastest of those steps"
    if real:
        console.print(f"(each plan ran --model {real} at its cut, the planner's (pricing the "
                      "profile's times), given to run as --boundaries; predicted = the simulated "
                      "pipeline step of the profile's own times, with no cost for the "
                      "processes' messages or the all-reduce, so it compares with a "
                      f"profile taken on this machine; measured = the median of {steps})",
                      highlight=False)
        return
    console.print(f"(profile times scaled by {validations[0].scale:.3g} so the first plan "
                  f"sleeps about --target-step; predictions add this machine's "
                  f"{m.overhead * 1e3:.2f} ms per action and {m.hop * 1e3:.2f} ms per "
                  "message, fitted to a run of plan 1 at 1/50 of its times, instead of the "
                  f"GPUs' P2P and all-reduce times; measured = the median of {steps}; auto "
                  "orders run from their CSV)", highlight=False)


def plan_summary(b, budget: float) -> str:
    """One plan in a sentence: its configuration, step, bubble, traffic and memory."""
    mem = b.memory[max(range(len(b.peak_memory)), key=lambda r: b.peak_memory[r])] \
        if b.memory else {}
    parts = ", ".join(f"{k.replace('_', ' ')} {_gib(v)}" for k, v in mem.items() if v > 0)
    inside = (" a step (FSDP's gathers and reduce-scatters of each microbatch are inside its "
              "F and B)" if b.fsdp_reshard == "always" else "")
    return (f"{_label(b)}: {_t(b.step_time)} per step, {b.samples_per_second:.1f} "
            f"samples/s; bubble {b.bubble_fraction:.1%}, data-parallel traffic "
            f"{_t(b.allreduce_time)}{inside}; gradient traffic exposed after the last "
            f"backward {_t(b.dp_exposed)}, optimizer step "
            f"{_t(b.optimizer_time)}, P2P "
            f"{b.comm * 1e3:.3g} ms per hop; memory {_gib(max(b.peak_memory))} of "
            f"{_gib(budget)} budget ({parts})")


def why_best(result, out: dict) -> list[str]:
    """A few sentences: what the best plan is, its memory, and why it beats the next."""
    plans = result.plans
    b = plans[0]
    lines = [f"best: {plan_summary(b, result.request.gpu_memory)}"]
    if b.pp == 1:
        lines.append("  (pp = 1: do not pipeline)")
    a2a = out["plans"][0].get("all_to_all") if out.get("plans") else None
    if a2a:  # MoE: plan/expert.py
        # Megatron-Core's dispatcher (etp != tp, or Megatron / NeMo at etp = tp with SP)
        # gathers the copies over ETP: that pair is in the figure (expert.etp_pair_time)
        fw = out.get("framework", {}).get("framework")
        gathers = b.dims.etp > 1 and (b.dims.etp != b.dims.tp or (
            fw in ("megatron", "nemo") and b.sp and b.tp > 1))
        lines.append(f"  expert parallel ep={b.dims.ep} over {a2a['nodes']} node(s), expert "
                     f"tensor parallel etp={b.dims.etp}, expert-"
                     f"data-parallel {b.dims.expert_data_parallel}"
                     + (f" (efsdp {b.dims.efsdp} x dp_replicate {b.dims.dp_replicate}, "
                        "HSDP)" if b.dims.hybrid else "") + ": all-to-all"
                     f"{' (with the ETP all-gather and reduce-scatter)' if gathers else ''} "
                     f"{_t(a2a['forward'])} in F and {_t(a2a['backward'])} in the backward "
                     f"of the slowest stage, a microbatch (imbalance {a2a['imbalance']:g})")
    if len(plans) > 1:
        gain, reasons = _margin(b, plans[1])
        lines.append(f"it beats #2 ({_label(plans[1])}) by {gain:.1%}: {reasons}")
    cfg = out.get("config")
    if cfg is not None:
        rank = f"#{cfg['rank']}" if cfg["rank"] else cfg["rank_note"]
        lines.append(f"--config: {_t(cfg['predicted_step_time'])} per step, "
                     f"{cfg['vs_best']:+.1%} vs the best ({rank}); peak "
                     f"{_gib(max(cfg['peak_memory']))}")
    return lines


def _check_model_layers(args: argparse.Namespace, layers: int) -> None:
    """The --model must have the profile's layers (the plans cut those)."""
    from ..models.loader import load_model, parse_model_args

    spec = load_model(args.model, parse_model_args(args.model_arg), seq=args.seq)
    if len(spec.layers) != layers:
        raise UserError(f"--model {args.model} has {len(spec.layers)} layers but the profile "
                        f"has {layers}; profile that model (pipebubble profile --model "
                        f"{args.model} --out FILE) and plan from its profile")
