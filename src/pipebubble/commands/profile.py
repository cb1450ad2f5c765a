"""``pipebubble profile``: measure each layer of a built-in model, save the profile as JSON."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import TYPE_CHECKING

from .common import positive_int

if TYPE_CHECKING:
    from rich.table import Table

MODEL_FLAGS = ("layers", "dim", "heads", "vocab", "seq", "width")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure each layer of a model (time, params, memory, FLOPs)",
        description="Profile a built-in model layer by layer on a sample batch (one "
        "microbatch): median forward and backward time, parameters, activation bytes kept "
        "for the backward, FLOPs. Writes the JSON profile that `pipebubble partition` reads.")
    p.add_argument("--model", required=True, metavar="NAME", help="mlp or transformer")
    for name in MODEL_FLAGS:
        p.add_argument(f"--{name}", type=positive_int(f"--{name}"), default=None,
                       help=f"model {name} (the model's default when omitted)")
    p.add_argument("--seed", type=int, default=0, help="weights and batch seed (0)")
    p.add_argument("--batch", type=positive_int("--batch"), default=8,
                   help="samples in the profiled batch: one microbatch (8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes first (2)")
    p.add_argument("--repeats", type=positive_int("--repeats"), default=5,
                   help="timed passes; the median is kept (5)")
    p.add_argument("--device", default="cpu", help="torch device to measure on (cpu)")
    p.add_argument("--threads", type=positive_int("--threads"), default=None,
                   help="torch CPU threads (default: torch's own)")
    p.add_argument("--out", metavar="FILE", help="write the profile here (JSON)")
    p.add_argument("--json", action="store_true", help="print the profile JSON and nothing else")
    p.set_defaults(func=run)


def build(args: argparse.Namespace):
    """The ModelSpec the flags describe; flags a model does not take are an error."""
    from ..models import MODELS

    if args.model not in MODELS:
        raise ValueError(f"unknown model {args.model!r}; valid are {', '.join(MODELS)}")
    builder = MODELS[args.model]
    accepted = inspect.signature(builder).parameters
    kwargs = {"seed": args.seed}
    for name in MODEL_FLAGS:
        value = getattr(args, name)
        if value is None:
            continue
        if name not in accepted:
            valid = ", ".join(f"--{n}" for n in MODEL_FLAGS if n in accepted)
            raise ValueError(f"--{name} does not apply to model {args.model}; it takes {valid}")
        kwargs[name] = value
    return builder(**kwargs), kwargs


def run(args: argparse.Namespace) -> int:
    import torch

    from ..plan.profile import profile_layers

    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"unknown --device {args.device!r}; try cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device} asked for, but CUDA is not available here")
    spec, kwargs = build(args)
    gen = torch.Generator().manual_seed(args.seed)
    x, y = spec.make_batch(args.batch, gen)
    layers = [m.to(device) for m in spec.layers]
    prof = profile_layers(layers, x.to(device), target=y.to(device), loss_fn=spec.loss_fn,
                          warmup=args.warmup, repeats=args.repeats,
                          metadata={"model": spec.name, "model_args": kwargs})
    if args.out:
        prof.save(args.out)
    if args.json:
        json.dump(prof.as_dict(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    console = Console()
    console.print(profile_table(prof))
    if args.out:
        console.print(f"wrote {args.out}  (pipebubble partition --profile {args.out} "
                      "--ranks P)")
    return 0


def profile_table(prof) -> Table:
    from rich.table import Table

    from .partition import fmt_bytes, fmt_count, fmt_time

    meta = prof.metadata
    title = (f"profile: {meta.get('model', '?')} on {meta.get('device', '?')}, batch "
             f"{meta.get('batch_shape', '?')}, median of {meta.get('repeats', '?')}")
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
