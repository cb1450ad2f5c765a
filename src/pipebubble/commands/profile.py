"""``pipebubble profile``: measure each layer of a built-in model, save the profile as JSON."""

from __future__ import annotations

import argparse
import inspect
import sys
from typing import TYPE_CHECKING

from ..errors import UserError
from ..files import check_output_path
from ..limits import MAX_LAYERS, check_layers, check_model_size, check_threads
from ..plan.profile import noisy_layers
from ..usercode import (
    USER_FAILURES,
    UserCodeError,
    is_ours,
    layer_in,
    results_to_stdout,
    user_prints_to_stderr,
)
from ._model import MODEL_HELP, add_spec_flags, load_from_args, user_spec_flags_given
from .common import int_flag, parse_device, positive_int, print_json, real_flag, wrote

if TYPE_CHECKING:
    from rich.table import Table

MODEL_FLAGS = ("layers", "dim", "heads", "vocab", "seq", "width")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure each layer of a model (time, params, memory, FLOPs)",
        description="Profile a model layer by layer on a sample batch (one "
        "microbatch): median forward and backward time, parameters, activation bytes kept "
        "for the backward, FLOPs. Writes the JSON profile that `pipebubble partition` reads.")
    p.add_argument("--model", default=None, metavar="SPEC",
                   help=MODEL_HELP + " (required unless --analytic)")
    add_spec_flags(p)
    for name in MODEL_FLAGS:
        p.add_argument(f"--{name}", type=positive_int(f"--{name}"), default=None,
                       help=f"model {name} (the model's default when omitted)")
    p.add_argument("--seed", type=int_flag("--seed", 0, 2**32 - 1), default=0,
                   help="weights and batch seed, 0..2^32-1 (0)")
    p.add_argument("--batch", type=positive_int("--batch"), default=None,
                   help="samples in the profiled batch: one microbatch (8; --analytic: 1)")
    p.add_argument("--warmup", type=int_flag("--warmup", 0, 1000), default=2,
                   help="untimed passes first (2)")
    p.add_argument("--repeats", type=int_flag("--repeats", 1, 1000), default=5,
                   help="timed passes; the median is kept (5)")
    p.add_argument("--device", default="cpu", help="torch device to measure on (cpu)")
    p.add_argument("--threads", type=positive_int("--threads"), default=None,
                   help="torch CPU threads (default: torch's own)")
    p.add_argument("--ranks", "-p", type=positive_int("--ranks"), default=None, metavar="P",
                   help="also print the default cut into P x --chunks stages, balanced by "
                   "this profile's time, as the run --boundaries value that reproduces it")
    p.add_argument("--chunks", "-v", type=positive_int("--chunks"), default=None, metavar="V",
                   help="--ranks: stages per rank (1)")
    p.add_argument("--out", metavar="FILE", help="write the profile here (JSON)")
    p.add_argument("--json", action="store_true", help="print the profile JSON and nothing else")
    g = p.add_argument_group(
        "analytic (--analytic: no model is run; a decoder-only transformer's layers from its "
        "shape, see README 'Planning a configuration'; also uses --layers --heads --vocab "
        "--seq --batch)")
    g.add_argument("--analytic", action="store_true",
                   help="compute the profile from the shape instead of measuring a model")
    g.add_argument("--hidden", type=positive_int("--hidden"), default=None, metavar="H",
                   help="--analytic: the model's hidden size")
    g.add_argument("--ffn", type=positive_int("--ffn"), default=None, metavar="F",
                   help="MLP inner size")
    g.add_argument("--kv-heads", type=positive_int("--kv-heads"), default=None, metavar="K",
                   help="key/value heads (grouped-query attention; default --heads)")
    g.add_argument("--tflops", type=real_flag("--tflops"), default=None, metavar="T",
                   help="peak TFLOP/s of one GPU in --dtype (e.g. 989 for an H100 in bf16)")
    g.add_argument("--mfu", type=real_flag("--mfu"), default=None, metavar="U",
                   help="model FLOPs utilisation, in (0, 1] (e.g. 0.4)")
    g.add_argument("--dtype", default="bf16", help="bf16 (default), fp16 or fp32")
    g.add_argument("--tied-embeddings", action="store_true",
                   help="the head shares the embedding's weights")
    g.add_argument("--gelu", action="store_true",
                   help="a 2-matrix GELU MLP instead of LLaMA's 3-matrix SwiGLU")
    g.add_argument("--hf-config", metavar="PATH", default=None,
                   help="--analytic: take the shape from a HuggingFace config.json (llama, "
                   "mistral, qwen2, gpt2; MoE: mixtral, qwen2_moe, qwen3_moe, deepseek_v3); "
                   "needs --seq")
    g.add_argument("--attention", default="flash", choices=("flash", "unfused"),
                   help="--analytic: FlashAttention keeps no s^2 scores (default) or unfused")
    p.set_defaults(func=run)


def build(args: argparse.Namespace):
    """The ModelSpec the flags describe; flags a model does not take are an error."""
    from ..models import MODELS

    if args.model not in MODELS:
        raise UserError(f"unknown model {args.model!r}; valid are {', '.join(MODELS)}")
    builder = MODELS[args.model]
    accepted = inspect.signature(builder).parameters
    kwargs = {"seed": args.seed}
    for name in MODEL_FLAGS:
        value = getattr(args, name)
        if value is None:
            continue
        if name not in accepted:
            valid = ", ".join(f"--{n}" for n in MODEL_FLAGS if n in accepted)
            raise UserError(f"--{name} does not apply to model {args.model}; it takes {valid}")
        kwargs[name] = value
    return builder(**kwargs), kwargs


def run_analytic(args: argparse.Namespace) -> int:
    from ..plan.analytic import analytic_profile

    if args.model is not None:
        raise UserError("--analytic computes the profile from the shape; drop --model "
                         f"{args.model}")
    if (args.tflops is None) != (args.mfu is None):
        raise UserError("--analytic takes --tflops and --mfu together (a fixed-rate profile) "
                         "or neither (hardware free: give plan --gpu NAME)")
    if args.hf_config is not None:
        return run_hf_config(args)
    needed = ("layers", "hidden", "ffn", "heads", "vocab", "seq")
    missing = [f"--{n}" for n in needed if getattr(args, n) is None]
    if missing:
        raise UserError(f"--analytic needs {', '.join(missing)} (and takes --kv-heads, "
                         "--batch, --dtype, --tied-embeddings, --tflops with --mfu), or "
                         "--hf-config PATH with --seq")
    if args.out is not None:  # an empty or bad --out fails before any work
        check_output_path(args.out, "--out")
    prof = analytic_profile(layers=args.layers, hidden=args.hidden, ffn=args.ffn,
                            heads=args.heads, vocab=args.vocab, seq=args.seq, batch=args.batch or 1,
                            tflops=args.tflops, mfu=args.mfu, kv_heads=args.kv_heads,
                            dtype=args.dtype, tied_embeddings=args.tied_embeddings,
                            swiglu=not args.gelu, attention=args.attention)
    return _output(args, prof)


def run_hf_config(args: argparse.Namespace) -> int:
    """``--analytic --hf-config PATH``: the shape from the config's keys. Every check comes
    first; the keys used are named on stderr after the result, so an error is one line."""
    from ..plan.analytic import shape_profile
    from ..plan.hfconfig import positions_of, read_hf_config

    shape_flags = [f"--{n.replace('_', '-')}" for n in ("layers", "hidden", "ffn", "heads",
                                                         "vocab", "kv_heads")
                   if getattr(args, n) is not None]
    if shape_flags or args.gelu or args.tied_embeddings:
        raise UserError(f"--hf-config gives the shape; drop {', '.join(shape_flags) or '--gelu'}")
    if args.seq is None:
        raise UserError("--hf-config needs --seq (tokens per sequence)")
    if args.out is not None:  # an empty or bad --out fails before any work
        check_output_path(args.out, "--out")
    from ..plan.moe import MoEShape, moe_profile

    shape, used = read_hf_config(args.hf_config)
    limit = positions_of(used)
    if limit is not None and args.seq > limit:
        key = "n_positions" if "n_positions" in used else "max_position_embeddings"
        raise UserError(f"--seq {args.seq} is longer than the model's {key} {limit:,} "
                         f"(--hf-config {args.hf_config}); use --seq 1..{limit:,}")
    build = moe_profile if isinstance(shape, MoEShape) else shape_profile
    prof = build(shape, args.seq, args.batch or 1, args.tflops, args.mfu, args.dtype,
                 args.attention, source={"path": args.hf_config, "keys": used})
    rc = _output(args, prof)
    if not args.json:
        sys.stderr.write("from " + args.hf_config + ": "
                         + ", ".join(f"{k}={v}" for k, v in used.items()) + "\n")
    return rc


def stages_of(args: argparse.Namespace) -> int | None:
    """``--ranks`` x ``--chunks``: the stages to print the default cut for (None: no cut)."""
    if args.ranks is None:
        if args.chunks is not None:
            raise UserError("--chunks applies with --ranks P (the cut to print); add --ranks "
                            "or drop --chunks")
        return None
    return args.ranks * (args.chunks or 1)


def run(args: argparse.Namespace) -> int:
    stages_of(args)  # before any work
    if args.analytic:
        return run_analytic(args)
    with user_prints_to_stderr():  # the model's own print(): stderr, --json owns stdout
        return _run_measured(args)


def _run_measured(args: argparse.Namespace) -> int:
    if args.model is None:
        raise UserError("--model is required (mlp, transformer, file.py:NAME, "
                         "package.module:NAME or hf:PATH), or --analytic with the model's shape")
    if args.model == "sleep":  # its layers sleep: CPU time 0, nothing a planner could use
        raise UserError("--model sleep has no work to profile (its layers only sleep); valid "
                         "are mlp, transformer, file.py:NAME, package.module:NAME, hf:PATH, "
                         "or --analytic")
    unused = [f"--{n.replace('_', '-')}" for n in ("hidden", "ffn", "kv_heads", "tflops", "mfu")
              if getattr(args, n) is not None] + (["--tied-embeddings"]
                                                  if args.tied_embeddings else [])
    if unused:
        raise UserError(f"{', '.join(unused)} apply only with --analytic")
    import torch

    from ..plan.profile import profile_layers

    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.out is not None:
        check_output_path(args.out, "--out")
    device = parse_device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else None)  # CPU time, one thread
    if threads:
        torch.set_num_threads(check_threads(threads))
    from ..models.loader import is_builtin

    if is_builtin(args.model):  # before building it
        given = user_spec_flags_given(args)
        if given:
            raise UserError(f"{', '.join(given)} apply to a --model file.py:NAME, "
                             f"package.module:NAME or hf:PATH, not the built-in {args.model}")
        check_model_size(args.model, args.layers or 8, args.width or args.dim,
                         args.vocab or 4096, args.seq or 32, batch=args.batch or 8)
        if args.model in ("transformer", "moe") and (args.layers or 0) + 2 > MAX_LAYERS:
            raise UserError(f"--layers {args.layers} builds {args.layers + 2:,} layers "
                             f"(embedding and head included), over the {MAX_LAYERS:,} a "
                             "profile may hold")
        check_layers(args.layers or 1)  # what partition reads (limits.MAX_LAYERS)
        spec, kwargs = build(args)
    else:
        given = [f"--{n}" for n in MODEL_FLAGS if n != "seq" and getattr(args, n) is not None]
        if given:
            raise UserError(f"{', '.join(given)} apply to the built-in models; give your "
                             "model's own arguments with --model-arg KEY=VALUE")
        spec = load_from_args(args, seq=args.seq)
        from ..models.loader import parse_model_args

        kwargs = parse_model_args(args.model_arg)
    if len(spec.layers) > MAX_LAYERS:  # refuse before measuring what could not be written
        raise UserError(f"--model {args.model} builds {len(spec.layers):,} layers, over the "
                         f"{MAX_LAYERS:,} a profile may hold")
    stages = stages_of(args)
    if stages is not None:  # more stages than layers: one line, before measuring
        from ..cut_rule import check_stage_count

        check_stage_count(len(spec.layers), stages)
    gen = torch.Generator().manual_seed(args.seed)
    x, y = spec.make_batch(args.batch or 8, gen)
    layers = [m.to(device) for m in spec.layers]
    try:
        prof = profile_layers(layers, x.to(device), target=y.to(device), loss_fn=spec.loss_fn,
                              warmup=args.warmup, repeats=args.repeats,
                              names=spec.layer_names(), roles=spec.layer_roles(), threads=None,
                              warn=False, metadata={"model": spec.name, "model_args": kwargs})
    except UserError:
        raise
    except USER_FAILURES as exc:  # a layer's own code: one line naming it (usercode)
        if is_ours(exc):
            raise
        i = layer_in(exc, layers)
        what = (f"layer {i} ({spec.layer_names()[i]!r}, {type(layers[i]).__name__})"
                if i is not None else "the model's layers")
        raise UserCodeError(exc, what, during="profiling", model=spec.name) from exc
    with results_to_stdout():  # the profile owns standard output, not the model's print()
        return _output(args, prof)


def _output(args: argparse.Namespace, prof) -> int:
    from ..plan.profile_reader import check_document

    check_document(prof.as_dict(), "the profile")  # --json or the table: what partition reads
    stages = stages_of(args)
    cut = None
    if stages is not None:  # before --out is written: too many stages is one line
        from ..cut_rule import profile_cut

        cut = profile_cut(prof, stages)
    if args.out is not None:
        prof.save(args.out)
        wrote(args.out)
    for line in noisy_layers(prof):
        sys.stderr.write(f"pipebubble: warning: {line}\n")
    if args.json:
        print_json(prof.as_dict())
        if cut is not None:  # stdout is the profile's; the cut is a note
            sys.stderr.write(f"pipebubble: {cut_note(cut, args)}\n")
        return 0
    from rich.console import Console

    console = Console()
    from ..render.table import fit

    console.print(fit(profile_table(prof), console.width, keys=2))  # values never cut
    if "moe" in prof.metadata:
        console.print(fit(moe_table(prof), console.width, keys=1))
    if cut is not None:
        console.print(cut_note(cut, args), highlight=False, soft_wrap=True, markup=False)
    if args.out:
        console.print(f"next: pipebubble partition --profile {args.out} --ranks P, or "
                      f"pipebubble plan --profile {args.out} --gpus N ...")
    return 0


def cut_note(cut, args: argparse.Namespace) -> str:
    """``the default cut into 3 stages (3 ranks x 1 chunk): cut --boundaries 2,5 (...)``."""
    chunks = args.chunks or 1

    def n(k: int, word: str) -> str:
        return f"{k} {word}{'s' if k != 1 else ''}"

    return (f"the default cut into {n(args.ranks * chunks, 'stage')} ({n(args.ranks, 'rank')} "
            f"x {n(chunks, 'chunk')}): {cut.describe()}")


def profile_table(prof) -> Table:
    from rich.table import Table

    from .partition import fmt_bytes, fmt_count, fmt_time

    meta = prof.metadata
    if meta.get("source") == "analytic":
        active = (f" ({meta['active_params'] / 1e9:.3g} B active)" if "active_params" in meta
                  else "")
        title = (f"analytic profile: {meta['params'] / 1e9:.3g} B parameters{active}, batch "
                 f"{meta['batch']} x seq {meta['seq']}, {meta['dtype']}, "
                 + (f"{meta['tflops']:g} TFLOP/s x MFU {meta['mfu']:g}" if meta.get("tflops")
                    else "hardware free (times: plan --gpu NAME)" if not active
                    else "hardware free (no times: give --tflops and --mfu to plan)"))
    else:
        how = (f"mean of {meta.get('passes', '?')} passes (every median was 0 s)"
               if meta.get("statistic") == "mean" else f"median of {meta.get('repeats', '?')}")
        title = (f"profile: {meta.get('model', '?')} on {meta.get('device', '?')}, batch "
                 f"{meta.get('batch_shape', '?')}, {how}")
    t = Table(title=title)
    for col in ("layer", "name", "type", "forward", "backward", "params", "activations",
                "FLOPs"):
        t.add_column(col, justify="left" if col in ("name", "type") else "right")
    for i, layer in enumerate(prof.layers):
        t.add_row(str(i), layer.name, layer.type or "", fmt_time(layer.forward),
                  fmt_time(layer.backward), fmt_count(layer.params),
                  fmt_bytes(layer.activation_bytes), fmt_count(layer.flops))
    t.add_row("", "total", "", fmt_time(sum(prof.column("forward"))),
              fmt_time(sum(prof.column("backward"))), fmt_count(sum(prof.column("params"))),
              fmt_bytes(sum(prof.column("activation_bytes"))),
              fmt_count(sum(prof.column("flops"))), style="bold")
    return t


def moe_table(prof) -> Table:
    """An MoE profile's blocks, runs of equal layers in one row: forward FLOPs by part, total
    and active parameters, activations, and what each all-to-all moves (plan/moe.py)."""
    from rich.table import Table

    from ..plan.moe import layer_groups
    from .partition import fmt_bytes, fmt_count

    t = Table(title="per block, one microbatch (forward FLOPs; 4 all-to-alls a microbatch "
              "with expert parallelism, each moving the dispatched tokens)")
    for col in ("blocks", "type", "attention", "router", "experts|MLP", "shared", "params",
                "active", "activations", "tokens x k", "all-to-all"):
        t.add_column(col, justify="left" if col in ("blocks", "type") else "right")
    for first, last, layer in layer_groups(prof):
        e = layer.extra
        t.add_row(f"{first}" if first == last else f"{first}-{last}", layer.type or "",
                  fmt_count(e["attention_flops"]), fmt_count(e["router_flops"]),
                  fmt_count(e["expert_flops"] + e["dense_mlp_flops"]),
                  fmt_count(e["shared_expert_flops"]),
                  fmt_count(layer.params), fmt_count(e["active_params"]),
                  fmt_bytes(layer.activation_bytes), fmt_count(e["dispatched_tokens"]),
                  fmt_bytes(e["all_to_all_bytes"]))
    return t
