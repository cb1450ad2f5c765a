"""``pipebubble plan``: choose pp, dp, microbatch size, schedule, chunks and recomputation.

Reads one or more profiles (measured, or ``pipebubble profile --analytic``), searches every
configuration of the GPUs (:mod:`pipebubble.plan.planner`), prints the fastest plans that fit
the memory budget with paste-ready torchtitan and Megatron-LM settings, and with
``--validate K`` runs the top K that fit this machine for real (:mod:`pipebubble.plan.validate`).
"""

from __future__ import annotations

import argparse
import os
import re

from .. import limits as L
from ..errors import UserError
from ..files import json_text, write_text
from ..interop.timeline_json import clean_floats
from .common import check_outputs, float_flag, int_flag, positive_int, print_json, wrote

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


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
    p.add_argument("--gpu-memory", type=size_value("--gpu-memory"), default=80 * 2**30,
                   metavar="BYTES", help="memory per GPU: 80GiB, 24e9 (80GiB)")
    p.add_argument("--global-batch", required=True,
                   type=positive_int("--global-batch", L.MAX_GLOBAL_BATCH),
                   metavar="B", help="samples per optimizer step, over all replicas")
    p.add_argument("--microbatch-size", type=int_list("--microbatch-size"), default=[1, 2, 4],
                   metavar="LIST", help="microbatch sizes to try (1,2,4)")
    from ..schedules import schedule_names

    p.add_argument("--schedules", default="all", metavar="all|LIST",
                   help="schedule families to try: all (default: every registered one, and "
                   f"auto when available) or a comma list of {', '.join(schedule_names())}")
    p.add_argument("--max-chunks", default=4, metavar="V",
                   type=positive_int("--max-chunks", L.MAX_CHUNKS),
                   help="most stages per rank for interleaved families (4)")
    p.add_argument("--recompute", default=None, metavar="LIST",
                   help="recomputation modes: none, selective, full (none,full when the "
                   "profile allows it, else none)")
    p.add_argument("--bytes-per-param", type=size_value("--bytes-per-param"), default=16.0,
                   metavar="N", help="weights + gradients + optimizer bytes per parameter "
                   "(16: bf16 weights and gradients, fp32 master weights and Adam moments)")
    p.add_argument("--grad-bytes", type=size_value("--grad-bytes"), default=4.0, metavar="N",
                   help="bytes per gradient in the data-parallel all-reduce (4: fp32)")
    p.add_argument("--p2p-bandwidth", type=size_value("--p2p-bandwidth"), default=50e9,
                   metavar="BYTES/s", help="between pipeline ranks (50e9)")
    p.add_argument("--allreduce-bandwidth", type=size_value("--allreduce-bandwidth"),
                   default=50e9, metavar="BYTES/s", help="per link in the ring (50e9)")
    p.add_argument("--latency", type=float, default=1e-5, metavar="S",
                   help="per message (1e-5)")
    p.add_argument("--top", type=positive_int("--top"), default=5, metavar="K",
                   help="plans to show (5)")
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
    p.add_argument("--out", metavar="FILE", help="also write the JSON here; schedules torch "
                   "has no class for are written next to it as CSV")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    p.set_defaults(func=run)


def size_value(flag: str):
    """A positive number with an optional unit: 80GiB, 24e9, 50GB."""

    def parse(text: str) -> float:
        m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*(?:/s)?\s*", text)
        unit = m.group(2).lower() if m else None
        try:
            value = float(m.group(1)) * _UNITS[unit] if m and unit in _UNITS else None
        except ValueError:
            value = None
        if value is None or not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(
                f"{flag} must be a number > 0 with an optional unit (80GiB, 512MiB, 24e9, "
                f"50GB), got {text!r}")
        return value

    return parse


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


def build_request(args: argparse.Namespace, profiles):
    from ..plan.planner import Request

    if args.schedules.strip().lower() == "all":
        names = None
    else:
        names = tuple(L.split_list(args.schedules, "--schedules"))
        if not names:
            raise UserError("--schedules must be all or a comma list of schedule names")
    if args.recompute is None:
        modes = ("none", "full") if "full" in profiles.recompute_modes() else ("none",)
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
    return Request(gpus=args.gpus, gpu_memory=args.gpu_memory, global_batch=args.global_batch,
                   microbatch_sizes=tuple(args.microbatch_size), schedules=names,
                   max_chunks=args.max_chunks, recompute=modes,
                   bytes_per_param=args.bytes_per_param, grad_bytes=args.grad_bytes,
                   p2p_bandwidth=args.p2p_bandwidth,
                   allreduce_bandwidth=args.allreduce_bandwidth, latency=args.latency,
                   top=max(args.top, 3 * args.validate), exhaustive_cuts=args.exhaustive_cuts)


def run(args: argparse.Namespace) -> int:
    from ..plan.layercosts import ProfileSet
    from ..plan.planner import search
    from ..plan.profile import Profile

    check_outputs(args, "out")  # a bad --out path fails before the search, not after
    if args.model is not None and not args.validate:
        raise UserError("--model is the model --validate runs; give --validate K too")
    profiles = ProfileSet([Profile.load(p) for p in args.profile])
    result = search(profiles, build_request(args, profiles))
    validations = []
    if args.validate:
        from ..plan.validate import fits_here, validate

        runnable = [p for p in result.plans if fits_here(p, args.max_processes)][:args.validate]
        if not runnable:
            raise UserError(f"--validate: no plan found runs in --max-processes "
                             f"{args.max_processes} (pp x dp processes); plan for fewer "
                             "--gpus or raise --max-processes")
        if args.model is not None:  # the real model, at the plan's cut
            _check_model_layers(args, len(profiles.profile))
            from ..plan.validate import validate_on_model

            validations = validate_on_model(runnable, args.model, args.model_arg, args.seq)
        else:
            validations = validate(runnable, target=args.target_step)
    out = result_json(result, profiles, validations, args.out)
    if args.out:  # the same numbers as --json prints
        write_text(args.out, json_text(clean_floats(out), "--out", indent=1) + "\n", "--out")
        wrote(args.out)
    if args.json:
        print_json(out)
        return 0
    from rich.console import Console

    print_plans(Console(), result, out, validations)
    return 0


def result_json(result, profiles, validations, out_path: str | None) -> dict:
    from ..plan import settings

    plans = []
    measured = {id(v.plan): v for v in validations}
    for k, plan in enumerate(result.plans[:result.request.top]):
        item = plan.as_json()
        csv = None
        if out_path and settings.torch_class(plan.schedule) is None:
            stem = os.path.splitext(out_path)[0]
            csv = f"{stem}.plan{k + 1}.{plan.schedule}.csv"
        item["torchtitan"] = settings.torchtitan(plan, profiles, csv)
        item["megatron"] = settings.megatron(plan, profiles)
        v = measured.get(id(plan))
        if v is not None:
            item["measured_step_time"] = v.measured_step_time  # the median of the steps
            item["measured_step_time_min"] = v.measured_step_time_min
            item["validation"] = v.as_json()
        plans.append(item)
    return {"searched": result.searched, "simulated": result.simulated,
            "seconds": result.seconds,
            "configurations_per_second": result.searched / result.seconds
            if result.seconds > 0 else None,
            "gpus": result.request.gpus, "gpu_memory": result.request.gpu_memory,
            "global_batch": result.request.global_batch, "plans": plans}


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


def print_plans(console, result, out: dict, validations) -> None:
    """The top plans as a table, why the best wins, its settings, and the validation."""
    from rich.table import Table

    from ..render.table import fit

    req = result.request
    console.print(f"[bold]searched {result.searched} configurations[/bold] ({result.simulated} "
                  f"simulations) in {result.seconds:.2f} s: "
                  f"{result.searched / max(result.seconds, 1e-9):.0f} configurations/s; "
                  f"{req.gpus} GPUs x {_gib(req.gpu_memory)}, global batch {req.global_batch}")
    t = Table(title="fastest plans that fit (predicted by simulation)")
    for col in ("#", "pp", "dp", "schedule", "v", "mb size", "m", "recompute", "step",
                "samples/s", "bubble", "all-reduce", "peak memory"):
        t.add_column(col, justify="left" if col in ("schedule", "recompute") else "right")
    for k, p in enumerate(result.plans[:req.top]):
        t.add_row(str(k + 1), str(p.pp), str(p.dp), p.schedule, str(p.chunks),
                  str(p.microbatch_size), str(p.microbatches), p.recompute, _t(p.step_time),
                  f"{p.samples_per_second:.1f}", f"{p.bubble_fraction:.1%}",
                  f"{p.allreduce_time / p.step_time:.1%}" if p.step_time else "—",
                  _gib(max(p.peak_memory)))
    console.print(fit(t, console.width))  # headers give way at 80 columns, values never
    for line in why_best(result):
        console.print(line, highlight=False)
    best = out["plans"][0]
    from ..plan.settings import toml_text

    console.print("\n[bold]torchtitan[/bold] (job TOML):", highlight=False)
    console.print(toml_text(best["torchtitan"]), highlight=False, markup=False, soft_wrap=True)
    console.print("[bold]Megatron-LM[/bold]: " + (best["megatron"] or "runs 1F1B and interleaved "
                  "1F1B only; no flags for this schedule"), highlight=False, soft_wrap=True)
    if validations:
        real = validations[0].model
        what = f"model {real}" if real else "sleeping the scaled profile"
        v = Table(title=f"validation: run for real ({what}, one process per rank, gloo)")
        for col in ("#", "plan", "processes", "predicted", "measured (median)", "error",
                    "vs best measured", "fastest step"):
            v.add_column(col, justify="right")
        done = [x.measured for x in validations if x.measured is not None]
        best_m = min(done) if done else None
        for x in validations:
            k = result.plans.index(x.plan) + 1
            p = x.plan
            name = f"pp={p.pp} dp={p.dp} {p.schedule} v={p.chunks} m={p.microbatches}"
            if x.measured is None:
                v.add_row(str(k), name, str(p.pp * p.dp), _t(x.predicted), "failed",
                          x.error or "", "")
                continue
            v.add_row(str(k), name, str(p.pp * p.dp), _t(x.predicted), _t(x.measured),
                      f"{x.measured / x.predicted - 1:+.1%}",
                      f"{x.measured / best_m - 1:+.1%}", _t(x.measured_min))
        console.print(fit(v, console.width))
        m = validations[0].machine
        if real:
            console.print(f"(each plan ran --model {real} at its cut; predicted = the simulated "
                          "pipeline step of the profile's own times, with no cost for the "
                          "processes' messages or the all-reduce, so it compares with a "
                          "profile taken on this machine; measured = the median of "
                          f"{len(validations[0].steps) or 'the'} steps after a warm-up)",
                          highlight=False)
            return
        console.print(f"(profile times scaled by {validations[0].scale:.3g} so the first plan "
                      f"sleeps about --target-step; predictions add this machine's "
                      f"{m.overhead * 1e3:.2f} ms per action and {m.hop * 1e3:.2f} ms per "
                      "message, fitted to a run of plan 1 at 1/50 of its times, instead of the "
                      "GPUs' P2P "
                      f"and all-reduce times; measured = the median of "
                      f"{len(validations[0].steps) or 'the'} steps after a warm-up; auto "
                      "orders run from their CSV)", highlight=False)


def why_best(result) -> list[str]:
    """A few sentences: what the best plan trades, against the runner-up."""
    plans = result.plans
    req = result.request
    b = plans[0]
    head = req.gpu_memory - max(b.peak_memory)
    out = [f"best: pp={b.pp} x dp={b.dp}, {b.schedule} (v={b.chunks}), microbatch size "
           f"{b.microbatch_size} (m={b.microbatches}), recompute {b.recompute}: "
           f"{_t(b.step_time)} per step, {b.samples_per_second:.1f} samples/s; bubble "
           f"{b.bubble_fraction:.1%}, all-reduce {b.allreduce_time / b.step_time:.1%} of the "
           f"step, P2P {b.comm * 1e3:.3g} ms per hop, memory {_gib(max(b.peak_memory))} of "
           f"{_gib(req.gpu_memory)} ({_gib(head)} headroom)"]
    if len(plans) > 1:
        r = plans[1]
        gain = r.step_time / b.step_time - 1
        reasons = []
        if b.bubble_fraction < r.bubble_fraction:
            reasons.append(f"less bubble ({b.bubble_fraction:.1%} vs {r.bubble_fraction:.1%})")
        if b.allreduce_time < r.allreduce_time:
            reasons.append(f"a shorter all-reduce ({_t(b.allreduce_time)} vs "
                           f"{_t(r.allreduce_time)})")
        if b.pipeline_time < r.pipeline_time and not reasons:
            reasons.append(f"a shorter pipeline ({_t(b.pipeline_time)} vs "
                           f"{_t(r.pipeline_time)})")
        out.append(f"it beats #2 (pp={r.pp} x dp={r.dp}, {r.schedule}, v={r.chunks}, "
                   f"recompute {r.recompute}) by {gain:.1%}: "
                   + (", ".join(reasons) or "a different balance of the same costs"))
    return out


def _check_model_layers(args: argparse.Namespace, layers: int) -> None:
    """The --model must have the profile's layers (the plans cut those)."""
    from ..models.loader import load_model, parse_model_args

    spec = load_model(args.model, parse_model_args(args.model_arg), seq=args.seq)
    if len(spec.layers) != layers:
        raise UserError(f"--model {args.model} has {len(spec.layers)} layers but the profile "
                        f"has {layers}; profile that model (pipebubble profile --model "
                        f"{args.model} --out FILE) and plan from its profile")
