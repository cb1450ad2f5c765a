"""``plan``'s Megatron-LM flags, parsed by Megatron's own ``parse_args`` and ``validate_args``.

For each of several plans (interleaved, an uneven cut, ZeRO-1, FSDP at pp = 1, selective and
full recomputation with tensor and sequence parallelism, context parallelism, and plans
Megatron cannot run, ZeRO-2 with a pipeline and DualPipe, whose paste is the best plan it
runs) the flags go through Megatron-LM's ``megatron.training.arguments`` as
``pretrain_gpt.py`` would (``WORLD_SIZE`` the plan's GPUs), its one GPU query
(``get_device_arch_version``, asked with Megatron-FSDP) answered with Hopper's 9. Then the
parsed arguments must be the plan's: sizes, data-parallel size, microbatches per step, the
transformer layers of every (virtual) stage (from Megatron's own
``PipelineParallelLayerLayout`` for a layout, its documented first/last arithmetic
otherwise), recomputation, the optimizer and the overlap flags; ``--use-torch-fsdp2`` never.

megatron-core's wheel ships ``megatron.core`` only: ``parse_args`` and ``validate_args`` are
Megatron-LM's ``megatron/training`` (with ``megatron/legacy``), from a checkout of the tag
matching megatron-core (core_v0.16.1), found on the path or at ``$MEGATRON_LM``; no package
ships it, so without either the tests skip, saying so.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shlex
import sys

import pytest

from pipebubble.cli import main
from pipebubble.plan.analytic import analytic_profile


def _why_not() -> str | None:
    """Why Megatron-LM's argument module cannot be imported here (cheap: nothing heavy is
    imported), or None."""
    try:
        importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return "megatron-core is not installed (pip install -e '.[test]' installs it)"
    root = os.environ.get("MEGATRON_LM")
    if root and os.path.isdir(os.path.join(root, "megatron", "training")) and \
            root not in sys.path:
        # megatron is a namespace package: the checkout's training/ joins the wheel's core/
        sys.path.append(root)
    if importlib.util.find_spec("megatron.training") is None:
        return ("Megatron-LM's megatron/training is not here (megatron-core's wheel ships "
                "megatron.core only): set MEGATRON_LM to a checkout of tag core_v0.16.1")
    return None


WHY = _why_not()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=str(WHY))]


@pytest.fixture(scope="module")
def arguments():
    from megatron.training import arguments

    return arguments


# tp.cp.pp.dp, sharding, schedule, chunks, mbs, recompute; 8 GPUs, global batch 32.
CONFIGS = {
    "interleaved": "tp=1,cp=1,pp=4,dp=2,sharding=ddp,schedule=interleaved-1f1b,v=2,mbs=1,"
                   "recompute=none",
    "uneven-1f1b": "tp=1,cp=1,pp=4,dp=2,sharding=ddp,schedule=1f1b,mbs=1,recompute=none",
    "zero1": "tp=1,cp=1,pp=2,dp=4,sharding=zero1,schedule=1f1b,mbs=2,recompute=none",
    "fsdp-pp1": "tp=1,cp=1,pp=1,dp=8,sharding=fsdp,mbs=2,recompute=none",
    "tp-sp-selective": "tp=2,sp=1,cp=1,pp=2,dp=2,sharding=zero1,schedule=1f1b,mbs=1,"
                       "recompute=selective",
    "full-recompute-cp": "tp=1,cp=2,pp=2,dp=2,sharding=ddp,schedule=1f1b,mbs=1,"
                         "recompute=full",
    "zero2-pipelined": "tp=1,cp=1,pp=2,dp=4,sharding=zero2,schedule=1f1b,mbs=1,"
                       "recompute=none",
    "dualpipe": "tp=1,cp=1,pp=2,dp=4,sharding=ddp,schedule=dualpipe,mbs=1,recompute=none",
}
BLOCKED = {"zero2-pipelined": "ZeRO-2", "dualpipe": "1F1B and interleaved 1F1B only"}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("mg") / "small.json"
    analytic_profile(layers=8, hidden=512, ffn=1408, heads=8, kv_heads=4, vocab=8192, seq=512,
                     batch=1).save(path)  # hardware free: priced for --gpu h100-sxm
    return str(path)


def flags_of(profile, name, tmp_path, capsys) -> tuple[dict, str, str]:
    """(the plan the flags are for, as JSON, the flags, the environment they need)."""
    assert main(["plan", "--profile", profile, "--gpus", "8", "--global-batch", "32",
                 "--gpu", "h100-sxm", "--config", CONFIGS[name], "--exact-rank", "--json",
                 "--out", str(tmp_path / "p.json")]) == 0  # --exact-rank: the plan instead
    out = json.loads(capsys.readouterr().out)
    mg = out["pastes"]["megatron"]
    assert "core_v0.16.1" in mg["version"]
    if name in BLOCKED:  # said, and the best plan Megatron runs pasted instead
        assert mg["flags"] is None and BLOCKED[name] in mg["reason"]
        alt = mg["instead"]
        runs = [p["predicted_step_time"] for p in out["plans"] if "megatron" in
                p["runnable_in"]]  # none shown that Megatron runs is faster
        assert alt["predicted_step_time"] <= min(runs, default=float("inf")) * (1 + 1e-12)
        return alt["config"], alt["flags"], alt["env"]
    assert mg["flags"] is not None, mg
    return out["config"], mg["flags"], mg["env"]


def stage_layers(item: dict) -> list[int]:
    """Transformer layers of each stage in stage order (profile layers 1..8 are blocks)."""
    return [sum(1 for i in range(s["first_layer"], s["last_layer"] + 1) if 1 <= i <= 8)
            for s in item["stages"]]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_flags_pass_megatrons_parse_args_and_validate_args(arguments, profile, name, tmp_path,
                                                           capsys, monkeypatch):
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    item, flags, env = flags_of(profile, name, tmp_path, capsys)
    assert "--use-torch-fsdp2" not in flags
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for assignment in env.split():  # what the paste says to set, and only that
        monkeypatch.setenv(*assignment.split("=", 1))
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: 9, raising=False)
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *shlex.split(flags)])
    args = arguments.parse_args()
    arguments.validate_args(args)
    capsys.readouterr()  # Megatron prints every argument

    tp, cp, pp, dp = item["tp"], item["cp"], item["pp"], item["dp"]
    assert (args.tensor_model_parallel_size, args.context_parallel_size,
            args.pipeline_model_parallel_size, args.data_parallel_size) == (tp, cp, pp, dp)
    assert args.sequence_parallel == item["sp"]
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (
        item["microbatch_size"], 32, 512)
    assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == \
        item["microbatches"]
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (8, 512, 8)
    assert args.num_query_groups == 4 and args.swiglu
    want = stage_layers(item)
    assert (args.virtual_pipeline_model_parallel_size or 1) == item["chunks"]
    if args.pipeline_model_parallel_layout is not None:
        assert args.num_virtual_stages_per_pipeline_rank is None  # never both
        layout = PipelineParallelLayerLayout(args.pipeline_model_parallel_layout, pp)
        layout.validate_layer_layout(args.num_layers, None)  # Megatron's own check
        got = [str(layout.layout[s % pp][s // pp]).count("decoder") for s in range(len(want))]
        assert got == want
    elif args.decoder_first_pipeline_num_layers is not None:
        first, last = args.decoder_first_pipeline_num_layers, \
            args.decoder_last_pipeline_num_layers
        middle = [(8 - first - last) // (pp - 2)] * (pp - 2) if pp > 2 else []
        assert [first, *middle, last] == want
    else:
        assert want == [8 // pp] * pp
    assert args.recompute_granularity == {"none": None}.get(item["recompute"],
                                                            item["recompute"])
    if item["recompute"] == "full":
        assert (args.recompute_method, args.recompute_num_layers) == ("uniform", 1)
    sharding = item["sharding"]
    assert args.use_distributed_optimizer == (sharding != "ddp")
    assert args.use_megatron_fsdp == (sharding in ("zero2", "fsdp"))
    if args.use_megatron_fsdp:
        assert args.data_parallel_sharding_strategy == (
            "optim_grads" if sharding == "zero2" else "optim_grads_params")
    assert not args.use_torch_fsdp2
    assert args.overlap_grad_reduce == (dp * cp > 1)
    assert args.overlap_param_gather == (sharding != "ddp" and dp * cp > 1)
