"""Generated fuzz cases for every subcommand, and a runner that isolates each one.

The cases are not a list of yesterday's findings: they are drawn, with a fixed seed, from
the argparse parser that ``pipebubble.cli.build_parser`` builds, so a new command or flag
is fuzzed the day it is added:

- each case starts from the command's smallest valid command line (:data:`BASES`; a new
  command without one fails ``test_every_command_has_a_base``), then sets one or two of its
  flags (any flag argparse knows, required ones included) to a hostile value;
- a flag with ``choices`` draws from its choices and from wrong names; a flag that names a
  file (its metavar says FILE, OUT or LIST of files, or it is an output flag) draws from
  hostile paths and hostile files (binary junk, deeply nested JSON, a marker-only CSV, NaN
  in JSON, a FIFO, a directory, /dev/full, ...) as well as from the numbers; every other
  flag draws from hostile numbers and text (empty, negative, zero, 10**400, 1e308, nan,
  inf, non-ASCII digits, emoji, a 10,000-character word);
- a store-true flag is sometimes added on top.

:func:`run_case` runs a case through ``pipebubble.cli.main`` in a forked child of the test
process (modules already imported, so a case costs milliseconds, not an interpreter start)
under a memory cap and a time limit, and reports the exit code, stderr and whether it was
killed. A case may write files only in its own temporary directory.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from hf_config_cases import BASES as DENSE_HF_BASES

BIG_DIGITS = "1" + "0" * 400  # 10**400
HUGE_DIGITS = "9" * 4400  # over Python's int-conversion limit
NUMBERS = [
    "", " ", "0", "-0", "-1", "1", "2", "3", "-7", BIG_DIGITS, "-" + BIG_DIGITS, HUGE_DIGITS,
    "99999999999999999", "4294967296", "1e308", "-1e308", "1e-308", "5e-324", "nan", "-nan",
    "inf", "-inf", "Infinity", "0.5", "1.5", "-0.5", "1e3", "0x10", "1_000", "+3", "٣",
    "１２", "½", "💥", "1,2", "1,,2", ",", "1,2,3,4,5,6,7,8", "1..4", "4..1", "1..", "0..0",
    "1..1000000000", "a" * 10_000, "-", "--", "all", "auto", "none", "é", "\u202e1",
]
PATHS = [
    "", "/dev/full", "/dev/null", "/dev/zero", "{d}", "{d}/", "{d}/missing.json",
    "{d}/nodir/x.json", "{d}/newdir/", "{d}/" + "a" * 300 + ".json", "{d}/junk.bin",
    "{d}/deep.json", "{d}/markers.csv", "{d}/empty", "{d}/fifo", "{d}/nan.json",
    "{d}/bignum.json", "{d}/list.json", "{d}/latin1.csv", "{d}/prof.json", "{d}/tl.json",
    "{d}/ok.csv", "{d}/out.png", "{d}/out.svg", "{d}/out.json", "{d}/out.csv",
    "{d}/prof.json/x", "-",
]
NAMES = ["", "nope", "NOPE", "auto", "GPIPE", "1f1b,", ",", "💥", "a" * 10_000, "gpipe,,1f1b"]

# The smallest valid command line of each command: cheap (milliseconds to a second),
# nothing launched. {d} is the case's directory, holding the files of make_files().
BASES: dict[str, list[str]] = {
    "simulate": ["simulate", "--schedule", "1f1b", "-p", "2", "-m", "2"],
    "compare": ["compare", "-p", "2", "-m", "4"],
    "sweep": ["sweep", "-p", "2", "-m", "1..4"],
    "export": ["export", "--schedule", "1f1b", "-p", "2", "-m", "2", "--csv", "-"],
    "wire": ["wire", "--schedule", "1f1b", "-p", "2", "-m", "2"],
    "partition": ["partition", "--profile", "{d}/prof.json", "--ranks", "2"],
    "plan": ["plan", "--profile", "{d}/prof.json", "--gpus", "2", "--global-batch", "8"],
    "run": ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "4",
            "--width", "8", "--warmup", "0", "--repeat", "1"],
    "profile": ["profile", "--model", "mlp", "--layers", "2", "--width", "8", "--warmup",
                "0", "--repeats", "1"],
    "demo": ["demo", "--stages", "2", "-m", "2"],
    "explore": ["explore", "--port", "0", "--no-browser"],
    # no checkpoint in {d}: every case is refused (one line); tests/test_export_hf.py exports
    "export-hf": ["export-hf", "{d}/ckpt", "{d}/hf-out"],
}

# Flags whose valid values launch processes or runs: fuzzed only with values that cannot
# be valid (a case must stay in its own process and within its time).
LAUNCHING = {("plan", "--validate"), ("run", "--local")}


@dataclass(frozen=True)
class Case:
    """One command line and the files it reads (written into its directory ``{d}`` first).

    ``allowed``: the exit codes the rule allows for it: ``{0}`` for a valid request (it must
    not be refused), ``{2}`` for bad input (it must not be silently accepted), ``{0, 2}``
    where the generator cannot tell; 1 only where documented (a diverged run, a --check
    FAIL, a schedule over --memory-limit). ``files``: (path under ``{d}``, content) pairs, a
    content ``@NAME`` being an asset (:func:`asset`); ``ops``: damage done to the
    checkpoint folder ``{d}/ck`` after it is copied in (see :func:`apply_ops`)."""

    argv: tuple[str, ...]
    surface: str = "flags"
    allowed: frozenset[int] = frozenset({0, 2})
    files: tuple[tuple[str, str | bytes], ...] = ()
    ops: tuple[tuple, ...] = ()
    note: str = ""
    hit: str = ""  # when the spec's hostile part ran (it made .hit): "refuse", "ok", "diverge"

    @property
    def command(self) -> str:
        return self.argv[0]

    def show(self) -> str:
        """The exact command line and the generated files, for a person to reproduce it."""
        import shlex

        lines = [f"surface {self.surface}: {self.note}".rstrip(": "),
                 "mkdir D && cd D  # then write the files below; {d} is D",
                 "python -m pipebubble " + shlex.join(self.argv)]
        for name, content in self.files:
            if isinstance(content, str) and content.startswith("@"):
                lines.append(f"--- {{d}}/{name}: {ASSETS[content[1:]][0]}")
            elif isinstance(content, bytes):
                lines.append(f"--- {{d}}/{name} ({len(content)} bytes): {content[:200]!r}")
            else:
                text = content if len(content) <= 4000 else content[:4000] + "\n... (cut)"
                lines.append(f"--- {{d}}/{name}:\n{text}")
        if self.ops or any(c == "@ck" for _, c in self.files):
            lines.append(f"--- {{d}}/ck damaged by: {list(self.ops)}")
        return "\n".join(lines)

    def id(self) -> str:
        shown = [a if len(a) <= 24 else a[:10] + f"…({len(a)})" for a in self.argv]
        return " ".join(shown)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from pipebubble.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flag(action: argparse.Action) -> str:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return (longs or action.option_strings)[0]


def _is_path(action: argparse.Action) -> bool:
    from pipebubble.commands.common import OUTPUT_FLAGS

    metavar = str(action.metavar or "")
    return ("FILE" in metavar or metavar == "OUT" or action.dest in OUTPUT_FLAGS
            or action.dest in ("csv", "profile", "measured"))


def _values(action: argparse.Action, rng: random.Random) -> str:
    if action.choices is not None:
        pool = [*map(str, action.choices), *NAMES]
    elif _is_path(action):
        pool = PATHS + rng.sample(NUMBERS, 4)
    elif action.dest in ("schedule", "schedules", "method", "model", "recompute", "device",
                         "dtype", "host", "inject_fault", "current_cut", "boundaries"):
        pool = NAMES + NUMBERS
    else:
        pool = NUMBERS
    return rng.choice(pool)


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replacing the base's value), written
    ``--flag=value`` so that a value such as ``-inf`` is not read as a flag."""
    out, skip = [], False
    aliases = {flag}
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in aliases and i + 1 < len(argv):
            skip = True
            continue
        out.append(a)
    return [*out, f"{flag}={value}"]


def _flag_case(rng: random.Random, commands: dict, flags: dict, weighted: list) -> Case:
    """A command's smallest valid line with one or two of its flags set to hostile values."""
    name = rng.choice(weighted)
    aliases = {}
    argv = list(BASES.get(name, [name]))
    for action in rng.sample(flags[name], min(len(flags[name]), rng.choice((1, 1, 1, 2)))):
        flag = _flag(action)
        for alias in action.option_strings:  # the base may spell it -p
            aliases[alias] = flag
        argv = [aliases.get(a, a) for a in argv]
        if action.nargs == 0:  # store_true: add it
            if (name, flag) in LAUNCHING or flag in argv:
                continue
            argv.append(flag)
            continue
        value = _values(action, rng)
        if (name, flag) in LAUNCHING and value.strip().isdigit() and 0 < int(
                value if len(value) < 4000 else "0") < 10**6:
            continue
        argv = _set(argv, flag, value)
    # a schedule over --memory-limit exits 1 (README, memory limits)
    allowed = {0, 1, 2} if name == "simulate" else {0, 2}
    return Case(tuple(argv), "flags", frozenset(allowed))


SURFACES = {"flags": 0.34, "spec": 0.22, "hf": 0.15, "ckpt": 0.09, "data": 0.09, "config": 0.11}
"""The share of each surface in a draw (flags: every command's flags; spec: a user model
file; hf: a HuggingFace config; ckpt: a --resume or --save folder; data: a --data file;
config: a plan --config string)."""


def generate(n: int, seed: int) -> list[Case]:
    """``n`` distinct cases drawn with ``seed``: surfaces in the shares of :data:`SURFACES`,
    the commands of the flag surface in proportion to their flags. The same ``(n, seed)``
    gives the same cases, and the first ``k`` cases of a larger ``n`` are those of ``n=k``."""
    rng = random.Random(seed)
    commands = subcommands()
    flags: dict[str, list[argparse.Action]] = {}
    for name, parser in commands.items():
        flags[name] = [a for a in parser._actions if a.option_strings
                       and not isinstance(a, argparse._HelpAction)]
    weighted = [name for name in commands for _ in flags[name]]
    makers = {"flags": lambda r: _flag_case(r, commands, flags, weighted), "spec": spec_case,
              "hf": hf_case, "ckpt": ckpt_case, "data": data_case, "config": config_case}
    names, weights = list(SURFACES), list(SURFACES.values())
    cases: list[Case] = []
    seen: set = set()
    tries = 0
    while len(cases) < n and tries < 50 * n:
        tries += 1
        case = makers[rng.choices(names, weights)[0]](rng)
        key = repr((case.argv, case.files, case.ops))
        if key not in seen:
            seen.add(key)
            cases.append(case)
    return cases


# ---- model specs: a user's ModelSpec file, hostile in one place ------------------------------
SPEC_FILE = '''import sys
import time

import torch
from torch import nn
from pipebubble import ModelSpec
TOP = {top!r}
if TOP == "print":
    print("the model file says hello")
elif TOP == "raise":
    raise ImportError("the model file cannot import its helper")
elif TOP == "exit":
    sys.exit(4)


def _hit():  # the hostile part ran: the run must not end as if nothing happened
    open(".hit", "w").close()


class L(nn.Module):
    def __init__(self, behave, at):
        super().__init__()
        self.lin, self.behave, self.at, self.calls = nn.Linear(4, 4), behave, at, 0

    def forward(self, x):
        self.calls += 1
        if self.behave and self.calls == self.at:
            _hit()
            b = self.behave
            if b == "raise":
                raise RuntimeError()
            if b == "raise_msg":
                raise ValueError("bad\\nwidth")
            if b == "exit":
                sys.exit(self.at)
            if b == "exit_none":
                sys.exit()
            if b == "print":
                print("layer says hi")
            if b == "none":
                return None
            if b == "tuple":
                return (x, x)
            if b == "int":
                return 3
            if b == "nan":
                return self.lin(x) * float("nan")
            if b == "shape":
                return torch.cat([x, x], dim=1)
            if b == "hang":
                while True:
                    time.sleep(0.05)
        return self.lin(x)


def _batch(n, g):
    return torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)


BATCH = {batch!r}
LOSS = {loss!r}
BUILD = {build!r}


def make_batch(n, g):
    if BATCH == "good":
        return _batch(n, g)
    _hit()
    if BATCH == "list":
        return list(_batch(n, g))
    if BATCH == "triple":
        return (*_batch(n, g), None)
    if BATCH == "floats":
        return [0.0] * n, [0.0] * n
    if BATCH == "rows":
        return _batch(n + 1, g)
    if BATCH == "raise":
        raise KeyError("batch")
    if BATCH == "print":
        print("making a batch")
        return _batch(n, g)
    if BATCH == "hang":
        while True:
            time.sleep(0.05)
    return None


def loss_fn(out, target):
    if LOSS == "good":
        return nn.functional.mse_loss(out, target)
    _hit()
    if LOSS == "detached":
        return nn.functional.mse_loss(out, target).detach()
    if LOSS == "vector":
        return (out - target).pow(2)
    if LOSS == "float":
        return 0.5
    if LOSS == "raise":
        raise ZeroDivisionError("no loss today")
    if LOSS == "nan":
        return nn.functional.mse_loss(out, target) * float("nan")
    return None


def build(**kwargs):
    layers = [L(b, a) for b, a in {layers!r}]
    for i in {frozen!r}:
        layers[i].requires_grad_(False)
    if BUILD == "good":
        return ModelSpec("fz", layers, make_batch, loss_fn)
    _hit()
    if BUILD == "raise":
        raise RuntimeError()
    if BUILD == "exit":
        sys.exit()
    if BUILD == "exit3":
        sys.exit(3)
    if BUILD == "exit_text":
        sys.exit("stopped\\nhere")
    if BUILD == "print":
        print("building the model")
        return ModelSpec("fz", layers, make_batch, loss_fn)
    if BUILD == "hang":
        while True:
            time.sleep(0.05)
    if BUILD == "list":
        return layers
    if BUILD == "int":
        return 3
    if BUILD == "sequential":
        return nn.Sequential(*layers)
    if BUILD == "name":
        return ModelSpec(None, layers, make_batch, loss_fn)
    if BUILD == "names":
        return ModelSpec("fz", layers, make_batch, loss_fn, names=["a"] * len(layers))
    if BUILD == "roles":
        return ModelSpec("fz", layers, make_batch, loss_fn, roles=["boss"] * len(layers))
    return None


NOT_CALLABLE = 3
'''

LAYER_FAULTS = ("raise", "raise_msg", "exit", "exit_none", "none", "tuple", "int", "shape")
"""A layer behaviour that must end the run with one line once it happens."""
SPEC_RUN = ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--warmup", "0",
            "--repeat", "1"]


def spec_case(rng: random.Random) -> Case:
    """A ModelSpec file with one hostile part (or none, or two): the file's top level, the
    builder, a layer at its k-th forward, ``make_batch``, the loss, frozen layers. The
    hostile part marks ``.hit`` when it runs, so the verdict knows whether it happened."""
    top = rng.choice(["ok"] * 8 + ["print", "raise", "exit"])
    hostile = rng.choice(["none", "build", "layer", "layer", "batch", "loss", "frozen", "ref"])
    build, batch, loss, frozen, ref = "good", "good", "good", [], "build"
    n_layers = rng.choice((2, 2, 3, 4))
    layers = [["", 0] for _ in range(n_layers)]
    if hostile == "build":
        build = rng.choice(["raise", "exit", "exit3", "exit_text", "print", "list", "int",
                            "sequential", "name", "names", "roles", "none"])
    elif hostile == "layer":
        i = rng.randrange(n_layers)
        layers[i] = [rng.choice([*LAYER_FAULTS, "print", "nan"]), rng.choice((1, 1, 2, 3, 5))]
    elif hostile == "batch":
        batch = rng.choice(["list", "triple", "floats", "rows", "raise", "print", "none"])
    elif hostile == "loss":
        loss = rng.choice(["detached", "vector", "float", "raise", "nan", "none"])
    elif hostile == "frozen":
        frozen = rng.choice([list(range(n_layers)), [0], [n_layers - 1]])
    elif hostile == "ref":
        ref = rng.choice(["missing", "NOT_CALLABLE", "", "build:x", "torch"])
    hang = False
    if rng.random() < 0.08:  # never returns: only the distributed launcher's pre-flight
        hang = True          # check runs it (bounded by --action-timeout), nothing launched
        where = rng.choice(["build", "batch", "layer"])
        build = "hang" if where == "build" else build
        batch = "hang" if where == "batch" else batch
        if where == "layer":
            layers[0] = ["hang", 1]
        top, ref, frozen, loss = "ok", "build", [], "good"
    text = SPEC_FILE.format(top=top, batch=batch, loss=loss, build=build,
                            layers=[tuple(x) for x in layers], frozen=frozen)
    model = "{d}/fz.py" + (f":{ref}" if ref != "torch" else "")
    if ref == "torch":
        model = "torch.nn:Linear"
    if hang:
        argv = ["run", "--schedule", "1f1b", "-p", "2", "-m", "2", "--model", model,
                "--action-timeout", rng.choice(["0.5", "1"])]
    else:
        kind = rng.choice(["run", "run", "run", "profile"])
        if kind == "profile":
            argv = ["profile", "--model", model, "--batch", "2", "--warmup", "0",
                    "--repeats", "1"]
        else:
            argv = [*SPEC_RUN, "--model", model, "--steps", rng.choice(["1", "1", "2", "3"])]
            if rng.random() < 0.5:
                argv.append("--json")
            if rng.random() < 0.15:
                argv.append("--check")
            if rng.random() < 0.15:
                argv.append("--recompute")
            if n_layers == 3 and rng.random() < 0.3:
                argv += ["--boundaries", "1"]
        if rng.random() < 0.5 and "--json" not in argv:
            argv.append("--json")
    # any layer count runs on -p 2 (the balanced cut, runtime/cut.py): 3 layers are valid
    bad = (top in ("raise", "exit") or ref != "build"
           or build not in ("good", "print")
           or batch not in ("good", "print", "list") or loss not in ("good", "nan")
           or (hostile == "frozen" and len(frozen) == n_layers) or hang)
    if bad:
        allowed = {2}
    elif hostile == "layer" or loss == "nan":
        allowed = {0, 1, 2}  # decided by .hit (see verdict)
    elif hostile == "frozen":
        allowed = {0, 2}
    else:
        allowed = {0}
    if "--check" in argv and not bad:
        allowed |= {1}  # a --check FAIL
    hit = ""
    if hostile == "layer" and not bad:
        behave = next(b for b, _ in layers if b)
        hit = "refuse" if behave in LAYER_FAULTS else "ok" if behave == "print" else "diverge"
    elif loss == "nan" and not bad:
        hit = "diverge"
    note = (f"top={top} build={build} layers={layers} batch={batch} loss={loss} "
            f"frozen={frozen} ref={ref}")
    return Case(tuple(argv), "spec", frozenset(allowed), (("fz.py", text),), note=note,
                hit=hit)


# ---- HuggingFace configs: dense and MoE shapes, one or two keys hostile -----------------------
HF_BASES: dict[str, dict] = {
    **DENSE_HF_BASES,  # the dense families of hf_config_cases
    "mixtral": {"model_type": "mixtral", "vocab_size": 40, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 64,
                "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "qwen2_moe": {"model_type": "qwen2_moe", "vocab_size": 40, "hidden_size": 16,
                  "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "max_position_embeddings": 64, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                  "shared_expert_intermediate_size": 16, "decoder_sparse_step": 1,
                  "mlp_only_layers": []},
    "deepseek_v3": {"model_type": "deepseek_v3", "vocab_size": 40, "hidden_size": 16,
                    "intermediate_size": 24, "moe_intermediate_size": 8,
                    "num_hidden_layers": 3, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "max_position_embeddings": 64,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "q_lora_rank": 8, "kv_lora_rank": 8,
                    "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4,
                    "n_group": 1, "topk_group": 1},
}
HF_SIZE_KEYS = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "head_dim", "n_embd", "n_layer", "n_head", "n_positions", "n_inner",
                "num_local_experts", "num_experts_per_tok", "num_experts",
                "moe_intermediate_size", "n_routed_experts", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}
"""Keys whose value is a size: -1, 0, 10**12, text, a list, 2.5 or true must be refused."""
HF_DROP = object()
HF_VALUES: dict[str, object] = {
    "missing": HF_DROP, "-1": -1, "0": 0, "1": 1, "huge": 10**12, "string": "x",
    "null": None, "nested": {"a": [1]}, "float": 2.5, "bool": True, "1e308": 1e308,
    "big-int": "@RAW:" + "1" + "0" * 5000, "nan": "@RAW:NaN", "deep": "@RAW:" + "[" * 5000
    + "]" * 5000, "list": [4, 4], "double": 2, "neg-float": -0.5, "tiny": 1e-320}
HF_REFUSED = {"-1", "0", "huge", "string", "nested", "float", "bool", "1e308", "big-int",
              "nan", "deep", "list", "neg-float", "tiny"}
HF_FILES = {"empty": "", "junk": "\x00\xff{", "list": "[1, 2]", "deep": "[" * 100_000,
            "bignum": '{"model_type": "llama", "hidden_size": 1' + "0" * 5000 + "}",
            "latin1": b'{"model_type": "ll\xe9ma"}', "no-type": '{"hidden_size": 16}',
            "alien": '{"model_type": "nope-model", "hidden_size": 16}'}


def _hf_json(config: dict) -> str:
    """``config`` as JSON text, a ``@RAW:`` value written as-is (NaN, deep lists, 5,000-digit
    integers that json.dumps cannot make or that must stay text)."""
    import json

    raws = {}
    out = {}
    for k, v in config.items():
        if isinstance(v, str) and v.startswith("@RAW:"):
            raws[k] = v[5:]
            out[k] = f"@@{k}@@"
        else:
            out[k] = v
    text = json.dumps(out)
    for k, raw in raws.items():
        text = text.replace(f'"@@{k}@@"', raw)
    return text


def hf_case(rng: random.Random) -> Case:
    """A small config.json of a dense or MoE family with one or two keys changed (or a
    hostile file), read by ``profile --analytic --hf-config`` or ``run --local --model hf:``."""
    base = rng.choice(list(HF_BASES))
    config = dict(HF_BASES[base])
    changed: list[tuple[str, str]] = []
    text: str | bytes
    if rng.random() < 0.08:
        kind = rng.choice(list(HF_FILES))
        text, changed = HF_FILES[kind], [("file", kind)]
    else:
        for _ in range(rng.choice((0, 1, 1, 1, 2))):
            key = rng.choice([k for k in HF_BASES[base] if k != "model_type"] + ["model_type"])
            value = rng.choice(list(HF_VALUES))
            if key == "model_type":
                value = rng.choice(["missing", "string", "null", "1"])
            changed.append((key, value))
            if HF_VALUES[value] is HF_DROP:
                config.pop(key, None)
            else:
                config[key] = HF_VALUES[value]
        text = _hf_json(config)
    if rng.random() < 0.6:
        argv = ["profile", "--analytic", "--hf-config", "{d}/hf/config.json", "--seq",
                rng.choice(["8", "8", "64", "65", "0"]), "--json"]
        if rng.random() < 0.3:
            argv += ["--tflops", "100", "--mfu", "0.4"]
    else:
        argv = ["run", "--local", "--model", rng.choice(["hf:{d}/hf", "hf:{d}/hf/config.json"]),
                "--schedule", "gpipe", "-p", rng.choice(["1", "2"]), "-m", "2", "--seq", "8",
                "--batch", "2", "--warmup", "0", "--repeat", "1", "--json"]
    final = dict(changed)  # a key changed twice keeps its last value
    refused = any(k == "file" and v != "none" for k, v in final.items()) or any(
        (k in HF_SIZE_KEYS and v in HF_REFUSED) or k == "model_type" for k, v in final.items())
    if "--seq" in argv and argv[argv.index("--seq") + 1] in ("65", "0"):
        refused = True  # beyond max_position_embeddings (64), or no tokens
    allowed = {2} if refused else {0} if not changed else {0, 2}
    return Case(tuple(argv), "hf", frozenset(allowed), (("hf/config.json", text),),
                note=f"{base} {changed}")


def make_files(d: str) -> None:
    """The hostile (and a few good) input files every case's directory holds."""
    def write(name: str, data: str | bytes) -> None:
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(os.path.join(d, name), mode) as f:
            f.write(data)

    write("junk.bin", bytes(range(256)) * 64)
    write("deep.json", "[" * 100_000 + "]" * 100_000)
    write("markers.csv", "0UNSHARD,0RESHARD\n1UNSHARD,1REDUCE_GRAD\n")
    write("empty", "")
    write("list.json", "[1, 2, 3]")
    write("latin1.csv", b"0F\xe90\n")
    write("ok.csv", "0F0,0F1,1B0,1B1\n")  # not a valid schedule either: B before its F
    layer = ('{"name": "l%d", "forward": %s, "backward": 0.002, "params": 1000, '
             '"activation_bytes": 4096, "flops": 1000000}')
    def profile(*layers: str) -> str:
        return '{"layers": [' + ", ".join(layers) + "]}"

    write("prof.json", profile(*(layer % (i, "0.001") for i in range(4))))
    write("nan.json", profile(layer % (0, "NaN")))
    write("bignum.json", profile(layer % (0, "1e308")))
    ev = '{"rank": %d, "stage": %d, "kind": "%s", "microbatch": 0, "start": %d, "end": %d}'
    events = [ev % (0, 0, "F", 0, 1), ev % (1, 1, "F", 1, 2), ev % (1, 1, "B", 2, 4),
              ev % (0, 0, "B", 4, 6)]
    write("tl.json", '{"ranks": 2, "stages": 2, "microbatches": 1, "events": ['
          + ", ".join(events) + "]}")
    os.mkfifo(os.path.join(d, "fifo"))


# ---- checkpoints: --resume a damaged or hostile folder, --save to a hostile target ------------
CK_RUN = ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "4",
          "--width", "8", "--warmup", "0", "--repeat", "1"]
CK_SHARD = "__0_0.distcp"
CK_FILES = (".metadata", CK_SHARD, "pipebubble.json")
CK_JSON_EDITS: dict[str, list] = {
    # key: values that must be refused ("@DROP": the key removed)
    "steps_done": [-1, "1", 1.5, 10**30, None, "@DROP"],
    "losses": [["nan"], "x", [None], [1e400], {"a": 1}, "@DROP"],
    "format": ["nope", 1, "@DROP"],
    "version": [99, "1", -1, "@DROP"],
    "parameters": [{}, [], {"layers.0.linear.weight": [8, 9]}, {"x": [1]}, "@DROP"],
    "optimizer": ["lion", 3, "@DROP"],
    "files": [{}, [], {".metadata": {"bytes": -1, "sha256": "0"}}],
    "seed": [-1, "0", 2**70],
    "next_step": [-5, "x"],
    "lr": [-1.0, "x", 1e400],
}


class _Pwn:
    """Unpickling this runs code: it creates ``pwned`` in the case's directory."""

    def __reduce__(self):
        return (os.mkdir, ("pwned",))


def ckpt_case(rng: random.Random) -> Case:
    """``--resume {d}/ck`` of a real checkpoint (made once, :func:`asset`) after zero to two
    damages (truncated, zeroed or deleted files, a hostile pickle as ``.metadata``, an edited
    ``pipebubble.json``, the hashes fixed up or not), or ``--save`` to a hostile target."""
    if rng.random() < 0.3:
        return _save_case(rng)
    ops: list[tuple] = []
    for _ in range(rng.choice((0, 0, 1, 1, 1, 2))):
        kind = rng.choice(["truncate", "zero", "delete", "junk", "pickle", "json", "json",
                           "deep-json", "symlink", "extra"])
        name = rng.choice(CK_FILES)
        if kind == "truncate":
            ops.append(("truncate", name, rng.choice((0, 1, 7, 100, -1, -100))))
        elif kind in ("zero", "delete", "junk", "symlink"):
            ops.append((kind, name))
        elif kind == "pickle":
            ops.append(("pickle", rng.choice(["pwn", "int", "dict"])))
        elif kind == "json":
            key = rng.choice(list(CK_JSON_EDITS))
            ops.append(("json", key, rng.choice(CK_JSON_EDITS[key])))
        elif kind == "deep-json":
            ops.append(("write", "pipebubble.json", rng.choice(["deep", "bignum", "list"])))
        else:
            ops.append(("extra", rng.choice(["__9_0.distcp", "x.txt"])))
    if ops and rng.random() < 0.5:
        ops.append(("fixhash",))  # the hashes agree with the damage: the reader must look
    argv = [*CK_RUN, "--resume", "{d}/ck", "--steps", rng.choice(["1", "2"])]
    change = rng.choice(["none"] * 6 + ["width", "layers", "sgd", "seed", "cut", "model"])
    allowed = {0}
    if change == "width":
        argv = _set(argv, "--width", "16")
        allowed = {2}
    elif change == "layers":
        argv = _set(argv, "--layers", "6")
        allowed = {2}
    elif change == "sgd":
        argv += ["--optimizer", "sgd"]
        allowed = {2}
    elif change == "seed":
        argv += ["--seed", "3"]
        allowed = {0, 2}
    elif change == "cut":
        argv = _set(_set(argv, "-p", "1"), "--schedule", "gpipe")
    elif change == "model":
        argv += ["--model", "transformer"]
        allowed = {2}
    if rng.random() < 0.4:
        argv.append("--json")
    if any(op[0] in ("extra", "symlink") for op in ops):  # a file DCP's index does not
        allowed = {0, 2} if allowed == {0} else allowed  # name, a link to the same bytes
    if not all(op[0] in ("extra", "symlink") or op == ("fixhash",) for op in ops):
        allowed = {2}
    if ("json", "losses", [None]) in ops and all(
            op[0] in ("extra", "symlink", "fixhash") or op == ("json", "losses", [None])
            for op in ops):
        allowed = {0, 2}  # null: the loss of a diverged step, as --json writes it
    return Case(tuple(argv), "ckpt", frozenset(allowed), (("ck", "@ck"),), tuple(ops),
                note=f"resume, change={change}")


def _save_case(rng: random.Random) -> Case:
    targets = {"{d}/new": {0}, "{d}/ck": {2}, "": {2}, ".": {2}, "{d}": {2}, "{d}/fifo": {2},
               "/proc/pbfuzz": {2}, "/sys/pbfuzz": {2}, "/dev/pbfuzz": {2}, "{d}/link": {2},
               "{d}/part": {2}, "{d}/junk.bin": {2}, "{d}/nodir/x": {0, 2},
               "{d}/" + "a" * 300: {2}, "/dev/null": {2}, "{d}/new/": {0, 2}}
    target = rng.choice(list(targets))
    allowed = set(targets[target])
    argv = [*CK_RUN, "--save", target]
    if rng.random() < 0.3:
        argv.append("--overwrite")
        if target == "{d}/ck":
            allowed = {0}
    if rng.random() < 0.4:
        argv.append("--json")
    files = [("ck", "@ck"), ("part.partial", "a file where the save's folder goes")]
    return Case(tuple(argv), "ckpt", frozenset(allowed), tuple(files), (("symlink-dir",),),
                note=f"save to {target!r}")


def apply_ops(d: str, ops: tuple[tuple, ...]) -> None:
    """Damage ``{d}/ck`` (a copy of the template checkpoint) as ``ops`` say."""
    import hashlib
    import json
    import pickle

    ck = os.path.join(d, "ck")
    meta_path = os.path.join(ck, "pipebubble.json")
    for op in ops:
        kind = op[0]
        path = os.path.join(ck, op[1]) if len(op) > 1 and isinstance(op[1], str) else ""
        if kind == "symlink-dir":  # for --save {d}/link
            os.symlink(ck, os.path.join(d, "link"))
        elif not os.path.isdir(ck):
            continue
        elif kind == "truncate" and os.path.isfile(path):
            size = os.path.getsize(path)
            keep = op[2] if op[2] >= 0 else max(0, size + op[2])
            os.truncate(path, min(keep, size))
        elif kind == "zero" and os.path.isfile(path):
            size = os.path.getsize(path)
            with open(path, "wb") as f:
                f.write(b"\0" * size)
        elif kind == "delete" and os.path.lexists(path):
            os.remove(path)
        elif kind == "junk" and os.path.exists(path):
            with open(path, "wb") as f:
                f.write(bytes(range(256)) * 4)
        elif kind == "symlink" and os.path.exists(path):
            os.rename(path, path + ".real")
            os.symlink(path + ".real", path)
        elif kind == "pickle":
            payload = {"pwn": _Pwn(), "int": 3, "dict": {"state_dict_metadata": {}}}[op[1]]
            with open(os.path.join(ck, ".metadata"), "wb") as f:
                pickle.dump(payload, f)
        elif kind == "json" and os.path.isfile(meta_path):
            try:
                meta = json.loads(open(meta_path).read())
                if op[2] == "@DROP":
                    meta.pop(op[1], None)
                else:
                    meta[op[1]] = op[2]
                text = json.dumps(meta)
            except (ValueError, TypeError, AttributeError, RecursionError):
                continue  # pipebubble.json is no JSON object now: the damage stays
            open(meta_path, "w").write(text)
        elif kind == "write":
            text = {"deep": "[" * 100_000 + "]" * 100_000, "list": "[1]",
                    "bignum": '{"steps_done": 1' + "0" * 5000 + "}"}[op[2]]
            open(os.path.join(ck, op[1]), "w").write(text)
        elif kind == "extra":
            open(os.path.join(ck, op[1]), "wb").write(b"\0" * 64)
        elif kind == "fixhash" and os.path.isfile(meta_path):
            try:
                meta = json.loads(open(meta_path).read())
                files = {}
                for name in sorted(os.listdir(ck)):
                    full = os.path.join(ck, name)
                    if name != "pipebubble.json" and os.path.isfile(full):
                        data = open(full, "rb").read()
                        files[name] = {"bytes": len(data),
                                       "sha256": hashlib.sha256(data).hexdigest()}
                meta["files"] = files
                open(meta_path, "w").write(json.dumps(meta))
            except (ValueError, TypeError, AttributeError, RecursionError):
                continue  # pipebubble.json is no JSON object now: the damage stays


# ---- --data files: token ids as .npy, .bin or text ----------------------------------------
DATA_RUN = ["run", "--local", "--model", "transformer", "--layers", "2", "--width", "16",
            "--heads", "2", "--vocab", "64", "--seq", "8", "--schedule", "1f1b", "-p", "2",
            "-m", "2", "--batch", "2", "--warmup", "0", "--repeat", "1"]
DATA_NEEDED = 2 * 9  # one step: --batch 2 windows of --seq + 1 tokens


def data_case(rng: random.Random) -> Case:
    """A token file: its length, dtype, values, shape and format drawn; valid exactly when
    it holds >= one step of integer ids in 0..vocab-1 (README, training on real data)."""
    import io

    import numpy as np

    fmt = rng.choice(["npy", "npy", "npy", "bin", "bin", "txt", "hostile-npy"])
    n = rng.choice((0, 1, DATA_NEEDED - 1, DATA_NEEDED, 100, 100, 1000, 1000))
    top = rng.choice((63, 63, 63, 63, 63, 64, 65535, -1))
    ok = n >= DATA_NEEDED and 0 <= top < 64
    rs = np.random.RandomState(rng.randrange(2**31))
    extra: list[str] = []
    if fmt == "npy":
        dtype = rng.choice(["uint16", "int32", "int64", "uint8", "int8", ">u2", "float32",
                            "float64", "bool", "complex64", "object", "U3", "pwn"])
        hi = max(top, 0)
        ids = rs.randint(0, hi + 1, size=n)
        if n and top < 0:
            ids[n // 2] = -1
        elif n:
            ids[n // 2] = top
        if dtype in ("uint8", "uint16", ">u2") and top < 0:
            ids = np.abs(ids)
            ok = n >= DATA_NEEDED
        if dtype == "pwn":  # an object array whose pickle runs code when loaded
            arr = np.array([_Pwn()] * max(n, 1), dtype=object)
        else:
            arr = ids.astype(dtype) if dtype != "object" else ids.astype(object)
        if dtype == "int8" and top > 127:
            ok = False if n else ok  # wraps negative
        shape = rng.choice(["flat", "2d", "fortran"])
        if shape == "2d" and n % 2 == 0 and n:
            arr = arr.reshape(2, -1)
        elif shape == "fortran" and n % 2 == 0 and n:
            arr = np.asfortranarray(arr.reshape(2, -1))
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=True)
        data, name = buf.getvalue(), "tok.npy"
        if dtype in ("float32", "float64", "bool", "complex64", "object", "U3", "pwn"):
            ok = False
        note = f"npy {dtype} {shape} n={n} top={top}"
    elif fmt == "bin":
        dtype = rng.choice(["uint16", "uint32", "int32", "int64"])
        ids = rs.randint(0, max(top, 0) + 1, size=n).astype("int64")
        if n:
            ids[n // 2] = top
        if top < 0 and n:
            ok = False  # negative, or as unsigned 65535 / 4294967295: outside the vocabulary
        data = ids.astype("<" + np.dtype(dtype).str[1:]).tobytes()
        if rng.random() < 0.2 and data:
            data = data[:-1]
            ok = False  # not a whole number of tokens
        given = rng.choice([dtype, dtype, "uint16", "int64"])
        if given != dtype:  # read with another width or sign: the generator cannot tell
            ok = False if len(data) % np.dtype(given).itemsize or not data else (
                None if ok is not False or top >= 0 else ok)
        extra = ["--data-dtype", given]
        name = "tok.bin"
        note = f"bin {dtype} read as {given} n={n} top={top}"
    elif fmt == "txt":
        data, name, ok = ("some text " * n).encode(), "tok.txt", False  # no tokenizer here
        note = f"text n={n}"
    else:
        kind = rng.choice(["huge-shape", "bad-magic", "empty", "header-only", "v3",
                           "long-header"])
        header = {"huge-shape": "{'descr': '<u2', 'fortran_order': False, "
                                "'shape': (1000000000000,), }",
                  "header-only": "{'descr': '<u2', 'fortran_order': False, 'shape': (50,), }",
                  "long-header": "{'descr': '<u2', 'fortran_order': False, 'shape': ("
                                 + "1," * 20000 + "), }"}.get(kind, "")
        if kind in ("huge-shape", "header-only", "long-header"):
            h = header.encode().ljust(((len(header) + 11) // 64 + 1) * 64 - 10, b" ")[:-1]
            h += b"\n"
            if len(h) < 65536:
                data = b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + b"\0" * 4
            else:
                data = b"\x93NUMPY\x02\x00" + len(h).to_bytes(4, "little") + h + b"\0" * 4
        elif kind == "bad-magic":
            data = b"\x93NUMPX" + bytes(100)
        elif kind == "v3":
            data = b"\x93NUMPY\x03\x00" + bytes(100)
        else:
            data = b""
        name, ok, note = "tok.npy", False, f"hostile npy {kind}"
    model_flags = list(DATA_RUN)
    if rng.random() < 0.08:  # --data needs a causal LM
        model_flags = _set(_set(model_flags, "--model", "mlp"), "--width", "8")
        model_flags = [a for a in model_flags if not a.startswith(("--heads", "--vocab",
                                                                    "--seq"))]
        ok = False
    argv = [*model_flags, "--data", "{d}/" + name, "--steps", rng.choice(["1", "2"]), *extra]
    if rng.random() < 0.4:
        argv.append("--json")
    allowed = {0} if ok else {2} if ok is False else {0, 2}
    return Case(tuple(argv), "data", frozenset(allowed), ((name, data),), note=note)


# ---- plan --config strings --------------------------------------------------------------------
CONFIG_VALUES: dict[str, list[str]] = {
    "tp": ["1", "2", "4", "8", "3", "0", "-1", "x", "1.5", "16", "9" * 30],
    "sp": ["0", "1", "2", "-1", "yes"], "cp": ["1", "2", "4", "3", "0"],
    "pp": ["1", "2", "4", "8", "3", "0", "16"], "dp": ["1", "2", "4", "8", "5", "0"],
    "sharding": ["ddp", "zero1", "zero2", "fsdp", "hsdp", "nope", "FSDP"],
    "mbs": ["1", "2", "4", "0", "-2", "3", "100000"],
    "schedule": ["1f1b", "gpipe", "zbv", "interleaved-1f1b", "dualpipe", "nope", "auto"],
    "v": ["1", "2", "4", "0", "100000"], "recompute": ["none", "full", "selective", "nope"],
}
CONFIG_RAW = ["", ",", "tp", "tp=", "=8", "tp=8=8", "TP=2", " tp = 2 ", "tp=1e3",
              "tp=" + "9" * 5000, "tp=٢", "tp=2,tp=4", "pp=2,,dp=4", "zz=1", "tp=2;pp=4",
              "💥=1", "tp=\u202e2"]
CONFIG_PLAN = ["plan", "--profile", "{d}/an.json", "--gpus", "4", "--gpu", "h100-sxm",
               "--global-batch", "8", "--top", "1", "--schedules", "1f1b,gpipe", "--mbs",
               "1,2", "--max-chunks", "2"]  # a small search: a case takes about a second
GPUS = 4


def _config_valid(items: list[tuple[str, str]]) -> bool | None:
    """True: the text is well formed (it may still be refused for what it asks, e.g. memory);
    False: it must be refused (README, plan --config); None: the generator cannot tell."""
    import math

    seen = {}
    for k, v in items:
        if k not in CONFIG_VALUES or not v:
            return False
        if k in seen:
            return None  # a key given twice: refused or the last kept
        seen[k] = v
        if k in ("tp", "cp", "pp", "dp", "mbs", "v", "sp"):
            if not v.isascii() or not v.lstrip("-").isdigit() or len(v) > 4000:
                return False
            x = int(v)
            if (k == "sp" and x not in (0, 1)) or (k != "sp" and x < 1):
                return False
    degrees = [int(seen[k]) for k in ("tp", "cp", "pp", "dp") if k in seen]
    prod = math.prod(degrees)
    if GPUS % prod or (len(degrees) == 4 and prod != GPUS):
        return False
    if seen.get("sharding", "ddp").lower() not in ("ddp", "zero1", "zero2", "fsdp", "hsdp"):
        return False
    if seen.get("sharding", "ddp").lower() == "hsdp":  # replicas across nodes: 4 GPUs are one
        return None
    if seen.get("recompute", "none") not in ("none", "full", "selective"):
        return False
    if seen.get("schedule", "1f1b") == "nope":
        return False
    if int(seen.get("tp", "1")) > 4 or int(seen.get("v", "1")) > 1 or seen.get(
            "mbs", "1") not in ("1", "2", "4") or seen.get("schedule", "1f1b") not in (
            "1f1b", "gpipe"):  # 4 heads, 4 layers, a global batch of 8, 4 GPUs
        return None
    return True


def config_case(rng: random.Random) -> Case:
    """``plan --config`` with one to four items drawn from the keys' valid and invalid values,
    or a malformed string; on an analytic profile of a small transformer."""
    if rng.random() < 0.25:
        text = rng.choice(CONFIG_RAW)
        items = [(i.partition("=")[0].strip().lower(), i.partition("=")[2].strip())
                 for i in text.split(",") if i.strip()]
        valid = _config_valid(items) if all("=" in i for i in text.split(",") if i.strip()
                                            ) and items else False
        if text.strip() in ("", ","):
            valid = False
    else:
        keys = rng.sample(list(CONFIG_VALUES), rng.choice((1, 2, 3, 4)))
        items = [(k, rng.choice(CONFIG_VALUES[k])) for k in keys]
        text = ",".join(f"{k}={v}" for k, v in items)
        valid = _config_valid(items)
    argv = [*CONFIG_PLAN, "--config", text]
    if rng.random() < 0.5:
        argv.append("--json")
    if rng.random() < 0.15:
        argv += ["--measured-step", rng.choice(["1.0", "0", "nan", "1e-9", "1e9"])]
        valid = None if valid else valid
    allowed = {0, 2} if valid is None else {0} if valid else {2}
    return Case(tuple(argv), "config", frozenset(allowed), (("an.json", "@analytic"),),
                note=f"--config {text[:80]!r}")


# ---- assets: made once per process, copied into each case's directory -------------------------
ASSETS: dict[str, tuple[str, list[str]]] = {
    "ck": ("the checkpoint of: pipebubble " + " ".join(CK_RUN) + " --save ck",
           [*CK_RUN, "--save", "{d}/ck"]),
    "analytic": ("pipebubble profile --analytic --layers 4 --hidden 256 --heads 4 --vocab "
                 "1000 --seq 128 --ffn 1024 --out an.json",
                 ["profile", "--analytic", "--layers", "4", "--hidden", "256", "--heads", "4",
                  "--vocab", "1000", "--seq", "128", "--ffn", "1024", "--out", "{d}/out"]),
}
_ASSET_DIR: list[str] = []


def asset(name: str) -> str:
    """The path of asset ``name`` (a file or folder), made on first use by running its
    command in a forked child, as a case runs."""
    if not _ASSET_DIR:
        _ASSET_DIR.append(tempfile.mkdtemp(prefix="pbfuzz-assets"))
        import atexit
        import shutil

        atexit.register(shutil.rmtree, _ASSET_DIR[0], True)
    where = os.path.join(_ASSET_DIR[0], name)
    if not os.path.exists(where):
        d = tempfile.mkdtemp(dir=_ASSET_DIR[0])
        argv = [a.replace("{d}", d) for a in ASSETS[name][1]]
        rc, err = _fork_main(argv, d, 600.0)[:2]
        made = os.path.join(d, name if name == "ck" else "out")
        if rc != 0 or not os.path.exists(made):
            raise RuntimeError(f"cannot make the fuzz asset {name}: exit {rc}: {err[-2000:]}")
        os.rename(made, where)
    return where


@dataclass
class Result:
    rc: int | None  # None: killed (time or memory)
    err: str
    seconds: float  # CPU seconds of the child
    how: str = ""  # "timeout" when killed for time
    out: str = ""  # standard output (its first 1 MB)
    hit: bool = False  # the model spec's hostile part ran (it made {d}/.hit)
    pwned: bool = False  # an input file ran code (a hostile pickle made {d}/pwned)


def _child(argv: list[str], err_path: str, out_path: str,
           mem_bytes: int) -> None:  # pragma: no cover
    """In the forked child: cap memory, send stdout and stderr to files, run."""
    rc = 99
    try:
        soft = _vm_size() + mem_bytes
        resource.setrlimit(resource.RLIMIT_AS, (soft, soft))
        cpu = int(os.environ.get("PIPEBUBBLE_FUZZ_CPU_SECONDS", "60"))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU: a runaway case
        out = os.open(out_path, os.O_WRONLY | os.O_TRUNC)
        err = os.open(err_path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.environ.pop("RANK", None)  # never act as a worker
        from http.server import HTTPServer

        def stop(self, poll_interval=0.5):  # explore: serve, then Ctrl-C at once
            raise KeyboardInterrupt

        HTTPServer.serve_forever = stop  # type: ignore[method-assign]
        import webbrowser

        webbrowser.open = lambda *a, **k: True  # type: ignore[assignment]
        from pipebubble.cli import main

        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # a bug: its traceback is what the test shows
        traceback.print_exc()
        rc = 98
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: S110  (stdout on /dev/full)
            pass
        os._exit(rc if isinstance(rc, int) and 0 <= rc < 256 else 97)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _fork_main(argv: list[str], d: str, timeout: float,
               mem_bytes: int = 2 << 30) -> tuple[int | None, str, str, float, str]:
    """(exit code, stderr, stdout, CPU seconds, how) of ``pipebubble.cli.main(argv)`` in a
    forked child working in ``d``, killed after ``timeout`` seconds (of the clock, or of
    CPU time: a busy machine slows a case, it does not make it hang)."""
    err_path, out_path = os.path.join(d, ".stderr"), os.path.join(d, ".stdout")
    for path in (err_path, out_path):
        open(path, "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        os.chdir(d)
        _child(argv, err_path, out_path, mem_bytes)
    rc: int | None = None
    how = ""
    cpu = 0.0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            cpu = usage.ru_utime + usage.ru_stime
            break
        if time.monotonic() - started > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            how = "timeout"
            break
        time.sleep(0.005)
    with open(err_path, errors="replace") as f:
        err = f.read()
    with open(out_path, errors="replace") as f:
        out = f.read(1 << 20)
    return rc, err, out, cpu, how


def write_case_files(case: Case, d: str) -> None:
    """The files of ``case`` in ``d``: the common ones (:func:`make_files`), its own, the
    assets copied in, the checkpoint damaged by its ops."""
    import shutil

    make_files(d)
    for name, content in case.files:
        path = os.path.join(d, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(content, str) and content.startswith("@"):
            src = asset(content[1:])
            if os.path.isdir(src):
                shutil.copytree(src, path)
            else:
                shutil.copyfile(src, path)
        else:
            with open(path, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
    apply_ops(d, case.ops)


def run_case(case: Case, timeout: float = 30.0, mem_bytes: int = 2 << 30) -> Result:
    """Run ``case`` in a forked child in a fresh directory (its ``{d}``); kill it after
    ``timeout`` seconds. ``mem_bytes``: address space it may add to what it inherits."""
    with tempfile.TemporaryDirectory(prefix="pbfuzz") as d:
        write_case_files(case, d)
        argv = [a.replace("{d}", d) for a in case.argv]
        rc, err, out, seconds, how = _fork_main(argv, d, timeout, mem_bytes)
        hit = os.path.exists(os.path.join(d, ".hit"))
        pwned = os.path.exists(os.path.join(d, "pwned"))
    return Result(rc, err.replace(d, "{d}"), seconds, how, out.replace(d, "{d}"), hit, pwned)


USER_PRINTS = {"the model file says hello", "layer says hi", "making a batch",
               "building the model"}
"""What the generated model files print: the model's own words on stderr (``--json`` owns
stdout), not pipebubble's; they do not count as lines of an error."""


def allowed_codes(case: Case, result: Result) -> frozenset[int]:
    """The exit codes the rule allows for ``case``, knowing whether its hostile part ran."""
    if not case.hit:
        return case.allowed
    extra = {1} if "--check" in case.argv else set()
    if not result.hit:  # nothing hostile happened: a valid run
        return frozenset({0} | extra)
    if case.hit == "diverge" and case.command == "profile":  # times, not a training run
        return frozenset({0, 2})
    # NaN may come in the up-front check's forward (no training step sees it): 0 is valid
    return frozenset({"refuse": {2}, "ok": {0} | extra, "diverge": {0, 1, 2}}[case.hit])


def verdict(case: Case, result: Result, timeout: float) -> str | None:
    """None when ``result`` keeps the rule, else what broke it (one line)."""
    import json

    if result.how == "timeout":
        return f"hang: still running after {timeout:g} s"
    if result.rc is None or result.rc < 0:
        return f"killed by signal {-(result.rc or 0)} (over its memory or CPU-time limit?)"
    if "Traceback" in result.err or result.rc == 98:
        return "traceback: " + result.err.strip().splitlines()[-1][:300]
    if result.pwned:
        return "an input file ran code (a hostile pickle was unpickled)"
    lines = [line for line in result.err.splitlines() if line not in USER_PRINTS]
    allowed = allowed_codes(case, result)
    if result.rc not in allowed:
        what = ("bad input silently accepted" if result.rc == 0 else
                "valid request refused" if result.rc == 2 and 0 in allowed else "wrong exit code")
        return f"{what}: exit {result.rc}, expected {sorted(allowed)}: {lines[-3:]}"
    if result.rc == 2:
        if len(lines) != 1:
            return f"{len(lines)}-line error: {lines[:6]}"
        if not lines[0].startswith("pipebubble: error: "):
            return f"error line not 'pipebubble: error: ...': {lines[0][:200]!r}"
        return None
    errors = [line for line in lines if line.startswith("pipebubble: error:")]
    if result.rc == 1 and errors and all("training diverged" in e for e in errors):
        errors = []  # exit 1 with its one line: a diverged run (README, divergence)
    if errors:
        return f"exit {result.rc} with an error line: {lines[-3:]}"
    if case.surface != "flags" and "--json" in case.argv:
        try:
            json.loads(result.out)
        except ValueError:
            return f"--json output is not one JSON object: {result.out[:200]!r}"
    return None




def main(argv: list[str]) -> int:
    """``python tests/fuzz_cases.py N SEED [FIRST [LAST]]``: run cases FIRST..LAST-1 of the
    ``N`` drawn with ``SEED``; print each violation (with how to reproduce it) and the count
    of cases and violations by surface. For the big runs, in chunks, at low priority.
    ``PIPEBUBBLE_FUZZ_ONLY=I,J``: only those cases (rerun the violations after a fix);
    ``PIPEBUBBLE_FUZZ_TIMEOUT``: seconds of the clock a case may take (30; more on a
    crowded machine); ``PIPEBUBBLE_FUZZ_VERBOSE=1``: a line per case."""
    import collections

    n, seed = int(argv[0]), int(argv[1])
    first = int(argv[2]) if len(argv) > 2 else 0
    last = int(argv[3]) if len(argv) > 3 else n
    only = {int(x) for x in os.environ.get("PIPEBUBBLE_FUZZ_ONLY", "").split(",") if x}
    timeout = float(os.environ.get("PIPEBUBBLE_FUZZ_TIMEOUT", "30"))
    warm()
    counts: collections.Counter = collections.Counter()
    bad: collections.Counter = collections.Counter()
    secs: collections.Counter = collections.Counter()
    for i, case in enumerate(generate(n, seed)[first:last], first):
        if only and i not in only:
            continue
        result = run_case(case, timeout=timeout)
        counts[case.surface] += 1
        secs[case.surface] += result.seconds
        v = verdict(case, result, timeout)
        if os.environ.get("PIPEBUBBLE_FUZZ_VERBOSE"):
            print(f"#{i} {case.surface} rc={result.rc} cpu={result.seconds:.2f}s", flush=True)
        if v is not None:
            bad[case.surface] += 1
            print(f"#{i} VIOLATION {v}\n{case.show()}\n", flush=True)
    total = sum(counts.values())
    print(f"cases {first}..{last - 1}: {total} run, {sum(bad.values())} violations; by surface: "
          + ", ".join(f"{s} {counts[s]}/{bad[s]}" for s in SURFACES) + " (cases/violations); "
          "CPU seconds a case: " + ", ".join(f"{s} {secs[s] / max(counts[s], 1):.2f}"
                                         for s in SURFACES), flush=True)
    return 1 if bad else 0


def warm() -> None:
    """Import what the cases' children use (torch, transformers' model classes), so that each
    forked child starts with them instead of importing them again."""
    import torch  # noqa: F401

    import pipebubble.cli  # noqa: F401

    try:
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
