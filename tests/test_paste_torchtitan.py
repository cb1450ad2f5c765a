"""``plan``'s torchtitan pastes, loaded by torchtitan's own code.

For each of several plans (1F1B with FSDP, interleaved with full recomputation, a ZB-H1 order
from its CSV over an uneven cut, ZBV V-placed, a V-Half CSV, pp = 1 with selective
recomputation, and a ZeRO-1 plan torchtitan cannot run, whose paste is the best plan it
does run) the paste goes through the installed torchtitan:

- torchtitan 0.2.x: the TOML through ``ConfigManager().parse_args(["--job.config_file",
  F])``; torchtitan 0.3.x: the CLI overrides after ``--module llama3 --config
  llama3_debugmodel`` (its ``config_registry``), through the same ``ConfigManager``;
- the parsed values must be the plan's: local and global batch, sequence length, degrees,
  microbatch size, schedule, CSV, module lists, activation checkpointing;
- then torchtitan's own pipeline split builds every rank's stages of its 6-layer debug
  model on a fake process group (torch's ``fake`` backend, one rank at a time), and its own
  schedule builder the schedule: every top-level module lands in exactly the stage the plan
  put it in, on the rank the plan put that stage on, and the schedule has the plan's m
  microbatches (a CSV order loaded into ``_PipelineScheduleRuntime``).

The ``test`` extra installs torchtitan 0.3 (``make test`` does); without it these tests skip.
One torchtitan line is imported at a time, so the other line's tests skip, saying so: the
Makefile also keeps torchtitan 0.2.2 in ``.venv/torchtitan-0.2`` (pure Python, no
dependencies of its own), and ``make test-heavy`` runs this file a second time with that
folder first on ``PYTHONPATH``, so CI loads the TOML into 0.2 and the overrides into 0.3.
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex

import pytest

from pipebubble.cli import main
from pipebubble.plan.analytic import analytic_profile

try:
    VERSION = importlib.metadata.version("torchtitan")
except importlib.metadata.PackageNotFoundError:
    VERSION = None

needs_torchtitan = pytest.mark.skipif(VERSION is None, reason="torchtitan is not installed "
                                      "(pip install -e '.[test]' installs it)")

# tp.cp.pp.dp, sharding, schedule, chunks, mbs, recompute; 8 GPUs, global batch 32.
CONFIGS = {
    "1f1b-fsdp": "tp=1,cp=1,pp=2,dp=4,sharding=fsdp,schedule=1f1b,mbs=1,recompute=none",
    "interleaved-full": "tp=1,cp=1,pp=2,dp=4,sharding=ddp,schedule=interleaved-1f1b,v=2,"
                        "mbs=1,recompute=full",
    "zb-h1-csv": "tp=1,cp=1,pp=4,dp=2,sharding=ddp,schedule=zb-h1,mbs=1,recompute=none",
    "zbv": "tp=1,cp=1,pp=2,dp=4,sharding=fsdp,schedule=zbv,mbs=2,recompute=none",
    "v-half-csv": "tp=1,cp=1,pp=2,dp=4,sharding=ddp,schedule=v-half,mbs=1,recompute=none",
    "pp1-selective": "tp=1,cp=1,pp=1,dp=8,sharding=fsdp,mbs=2,recompute=selective",
    "zero1": "tp=1,cp=1,pp=2,dp=4,sharding=zero1,schedule=1f1b,mbs=1,recompute=none",
    "1f1b-op": "tp=1,cp=1,pp=2,dp=4,sharding=fsdp,schedule=1f1b,mbs=1,recompute=op",
}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """torchtitan's llama3 debug model's shape (6 layers, dim 256, 16 heads, vocab 2048)."""
    path = tmp_path_factory.mktemp("tt") / "debug.json"
    analytic_profile(layers=6, hidden=256, ffn=768, heads=16, vocab=2048, seq=256, batch=1,
                     tflops=100, mfu=0.4).save(path)
    return str(path)


def paste_of(profile, name, tmp_path, capsys):
    """(the plan's JSON item the paste is for, its torchtitan paste)."""
    out_file = tmp_path / "plan.json"
    assert main(["plan", "--profile", profile, "--gpus", "8", "--global-batch", "32",
                 "--config", CONFIGS[name], "--exact-rank", "--json", "--out",
                 str(out_file)]) == 0  # --exact-rank: the best plan it runs, when blocked
    out = json.loads(capsys.readouterr().out)
    paste = out["pastes"]["torchtitan"]
    item = out["config"]
    if paste.get("runnable") is False:  # said, and the best plan it runs pasted instead
        assert name == "zero1" and "ZeRO-1" in paste["reason"]
        paste = paste["instead"]
        runs = [p["predicted_step_time"] for p in out["plans"] if "torchtitan" in
                p["runnable_in"]]  # the best plan torchtitan runs: none shown is faster
        assert paste["predicted_step_time"] <= min(runs, default=float("inf")) * (1 + 1e-12)
        item = paste["config"]
        assert item["sharding"] in ("ddp", "fsdp", "hsdp")
    return item, paste


def expected_parts(item: dict, head: str) -> list[list[str]]:
    """Each stage's torchtitan modules, from the plan's stages (layer 0 the embedding,
    1..6 the blocks, 7 the norm and head)."""
    names = [["tok_embeddings"], *[[f"layers.{i}"] for i in range(6)], ["norm", head]]
    return [[n for i in range(s["first_layer"], s["last_layer"] + 1) for n in names[i]]
            for s in item["stages"]]


def check_parsed(cfg, item: dict, paste: dict, head: str) -> None:
    """The values torchtitan parsed are the plan's."""
    pp, mbs, m = item["pp"], item["microbatch_size"], item["microbatches"]
    assert cfg.training.global_batch_size == 32
    assert cfg.training.local_batch_size == (mbs * m if pp > 1 else mbs)
    assert cfg.training.seq_len == 256
    par = cfg.parallelism
    assert (par.tensor_parallel_degree, par.context_parallel_degree,
            par.pipeline_parallel_degree) == (item["tp"], item["cp"], pp)
    shard = item["dp"] if item["sharding"] == "fsdp" else 1
    assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree) == (
        shard, item["dp"] // shard)
    if pp > 1:
        assert par.pipeline_parallel_microbatch_size == mbs
        assert cfg.training.local_batch_size // par.pipeline_parallel_microbatch_size == m
        assert par.module_fqns_per_model_part == expected_parts(item, head)
        csv = paste["parallelism"].get("pipeline_parallel_schedule_csv")
        assert (par.pipeline_parallel_schedule_csv or None) == csv
        if csv:
            from pipebubble.interop.torch_csv import read_torch_csv

            assert read_torch_csv(csv).num_microbatches == m
        v_placed = item["placement"] == "v"
        assert par.pipeline_parallel_schedule == (
            "ZBVZeroBubble" if v_placed else "Interleaved1F1B" if item["chunks"] > 1 else
            {"1f1b": "1F1B", "zb-h1": "1F1B"}.get(item["schedule"], "1F1B"))


def check_split(split, build, model, item: dict, parts: list[list[str]]) -> None:
    """torchtitan's split on a fake process group puts each module where the plan does,
    and its schedule runs the plan's microbatches."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    pp = item["pp"]
    children = [n for n, _ in model.named_children()]
    layer_key = next(n for n in children if n == "layers")
    everything = [n for n in children if n != layer_key] + [
        f"layers.{i}" for i in range(len(getattr(model, layer_key)))]
    held: dict[str, int] = {}
    for rank in range(pp):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=pp)
        try:
            mesh = init_device_mesh("cpu", (pp,), mesh_dim_names=("pp",))
            stages, chunks = split(model, mesh, torch.device("cpu"), parts)
            want = [s for s, st in enumerate(item["stages"]) if st["rank"] == rank]
            assert sorted(st.stage_index for st in stages) == want
            for stage, chunk in zip(stages, chunks, strict=True):
                kept = [n for n, c in chunk.named_children()
                        if c is not None and n != layer_key]
                layers = getattr(chunk, layer_key)
                keys = list(layers.keys()) if hasattr(layers, "keys") else None
                if keys is None:  # a ModuleList keeps the listed blocks, renumbered
                    names = [n for n in parts[stage.stage_index] if n.startswith("layers.")]
                    assert len(layers) == len(names)
                    kept += names
                else:
                    kept += [f"layers.{k}" for k in keys]
                assert sorted(kept) == sorted(parts[stage.stage_index])
                for n in kept:
                    held[n] = held.get(n, 0) + 1
            schedule = build(stages)
            assert schedule._n_microbatches == item["microbatches"]
        finally:
            dist.destroy_process_group()
    assert held == {n: 1 for n in everything}  # every module once, none dropped


# ---- without torchtitan: what the pastes say --------------------------------------------

def test_partition_names_every_module_of_an_analytic_llama(profile, capsys):
    """The analytic head is the final norm and the output projection: both are listed (a
    list without norm makes torchtitan skip the final norm without an error)."""
    assert main(["partition", "--profile", profile, "--ranks", "2"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "torchtitan 0.2 [parallelism]" in x)
    parts = json.loads(line.split("module_fqns_per_model_part = ", 1)[1])
    assert [n for part in parts for n in part] == [
        "tok_embeddings", *[f"layers.{i}" for i in range(6)], "norm", "output"]
    v03 = next(x for x in text.splitlines() if "torchtitan 0.3" in x)
    assert v03.endswith('"norm", "lm_head"]]')


def test_a_profiled_models_roles_become_torchtitans_module_names():
    """torchtitan splits its own decoder: a model profiled with roles (an HF LLaMA's
    ``model.embed_tokens``, ``model.layers.i``, ``model.norm+lm_head``) is pasted with
    torchtitan's names, the head as each version names it."""
    from pipebubble.plan.layercosts import ProfileSet
    from pipebubble.plan.profile import LayerProfile, Profile
    from pipebubble.plan.settings import torchtitan_modules

    layers = [("model.embed_tokens", "embedding"), ("model.layers.0", "layer"),
              ("model.layers.1", "layer"), ("model.norm+lm_head", "head")]
    prof = ProfileSet([Profile([LayerProfile(n, 1, 1, 1, 0, 0, "", {"role": r})
                                for n, r in layers], metadata={"batch": 1})])
    body = [["tok_embeddings"], ["layers.0"], ["layers.1"]]
    assert torchtitan_modules(prof) == [*body, ["norm", "output"]]
    assert torchtitan_modules(prof, "lm_head") == [*body, ["norm", "lm_head"]]


def test_config_pastes_its_own_plan_and_writes_its_csv_without_out(profile, tmp_path,
                                                                   monkeypatch, capsys):
    from pipebubble.interop.torch_csv import read_torch_csv
    from pipebubble.schedules import get_schedule

    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--profile", profile, "--gpus", "8", "--global-batch", "32",
                 "--config", CONFIGS["zb-h1-csv"]]) == 0
    out, err = capsys.readouterr()
    assert "pastes for --config (tp=1 cp=1 pp=4 dp=2 ddp zb-h1 v=1 mbs=1 m=16" in out
    assert 'pipeline_parallel_schedule_csv = "plan.config.zb-h1.csv"' in out
    assert "wrote plan.config.zb-h1.csv" in err
    assert read_torch_csv("plan.config.zb-h1.csv").orders == get_schedule("zb-h1", 4, 16).orders
    assert "local_batch_size = 16" in out and "seq_len = 256" in out
    assert "Megatron-LM: not runnable in Megatron-LM: Megatron-LM pipelines 1F1B" in out


def test_zero1_is_said_not_runnable_in_torchtitan_never_pasted_as_ddp(profile, capsys,
                                                                       tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the pastes' torch CSV is written where plan runs)
    assert main(["plan", "--profile", profile, "--gpus", "8", "--global-batch", "32",
                 "--config", CONFIGS["zero1"], "--exact-rank", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tt = out["pastes"]["torchtitan"]
    assert tt["runnable"] is False and "no ZeRO-1" in tt["reason"]
    assert "parallelism" not in tt and tt["instead"]["config"]["sharding"] in ("ddp", "fsdp")
    mg = out["pastes"]["megatron"]["flags"]
    assert "--use-distributed-optimizer" in mg and "--overlap-param-gather" in mg
    # without --exact-rank no search looks for the plan it runs instead, and it says so
    assert main(["plan", "--profile", profile, "--gpus", "8", "--global-batch", "32",
                 "--config", CONFIGS["zero1"], "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    tt = fast["pastes"]["torchtitan"]
    assert tt["runnable"] is False and "no ZeRO-1" in tt["reason"] and tt["instead"] is None
    assert "add --exact-rank, for the best plan torchtitan runs" in tt["instead_note"]
    assert fast["pastes"]["megatron"]["flags"] == out["pastes"]["megatron"]["flags"]


# ---- torchtitan 0.2: the TOML job file ---------------------------------------------------

needs_02 = pytest.mark.skipif(VERSION is not None and not VERSION.startswith("0.2."),
                              reason=f"the TOML paste is for torchtitan 0.2.x; installed: "
                              f"{VERSION} (pip install 'torchtitan>=0.2,<0.3' to test it)")


@pytest.mark.slow
@needs_torchtitan
@needs_02
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_toml_loads_into_torchtitan_02(profile, name, tmp_path, capsys):
    from torchtitan.config import ConfigManager

    from pipebubble.plan.settings import toml_text

    item, paste = paste_of(profile, name, tmp_path, capsys)
    toml = tmp_path / "job.toml"
    toml.write_text(toml_text(paste) + "\n")
    cfg = ConfigManager().parse_args(["--job.config_file", str(toml)])
    check_parsed(cfg, item, paste, "output")
    assert cfg.activation_checkpoint.mode == {"full": "full", "op": "selective"}.get(
        item["recompute"], "none")
    if item["recompute"] == "op":  # torchtitan's op-level SAC
        assert cfg.activation_checkpoint.selective_ac_option == "op"
    if item["pp"] == 1:
        return
    from torchtitan.distributed.pipeline_parallel import (
        build_pipeline_schedule,
        pipeline_module_split,
    )
    from torchtitan.models.llama3 import Transformer, llama3_args

    model = Transformer(llama3_args["debugmodel"])
    schedule = cfg.parallelism.pipeline_parallel_schedule
    check_split(lambda m, mesh, dev, parts: pipeline_module_split(m, mesh, schedule, dev, parts),
                lambda stages: build_pipeline_schedule(cfg, stages, lambda o, t: o.sum()),
                model, item, cfg.parallelism.module_fqns_per_model_part)


# ---- torchtitan 0.3: config_registry + CLI overrides -------------------------------------

needs_03 = pytest.mark.skipif(VERSION is not None and not VERSION.startswith("0.3."),
                              reason=f"the CLI paste is for torchtitan 0.3.x; installed: "
                              f"{VERSION}")


@pytest.mark.slow
@needs_torchtitan
@needs_03
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_cli_overrides_load_into_torchtitan_03(profile, name, tmp_path, capsys):
    pytest.importorskip("triton", reason="torchtitan 0.3's llama3 config imports triton")
    from torchtitan.config.manager import ConfigManager

    item, paste = paste_of(profile, name, tmp_path, capsys)
    args = ["--module", "llama3", "--config", "llama3_debugmodel", *shlex.split(paste["cli"])]
    cfg = ConfigManager().parse_args(args)
    check_parsed(cfg, item, paste, "lm_head")
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if item["recompute"] == "full":
        assert isinstance(cfg.activation_checkpoint, FullAC.Config)
    elif item["recompute"] == "op":  # 0.3's selective subcommand is its per-op SAC
        assert isinstance(cfg.activation_checkpoint, SelectiveAC.Config)
    else:
        assert cfg.activation_checkpoint is None  # none: torchtitan's default is selective
    if item["pp"] == 1:
        return
    from torchtitan.distributed.pipeline_parallel import (
        _build_pipeline_schedule,
        _pipeline_module_split,
    )

    model = cfg.model_spec.model.build()
    par = cfg.parallelism
    check_split(lambda m, mesh, dev, parts: _pipeline_module_split(
                    m, mesh, par.pipeline_parallel_schedule, dev, parts),
                lambda stages: _build_pipeline_schedule(
                    parallelism=par, local_batch_size=cfg.training.local_batch_size,
                    stages=stages, loss_fn=lambda o, t: o.sum()),
                model, item, par.module_fqns_per_model_part)


# ---- an MoE plan: expert parallelism and expert tensor parallelism -----------------------

def _small_moe_profile(tmp_path):
    """A 4-layer MoE profile (8 experts, top 2) saved under ``tmp_path``; its path."""
    from pipebubble.plan.moe import MoEShape, moe_profile

    shape = MoEShape(layers=4, hidden=64, heads=4, vocab=128, experts=8, top_k=2,
                     expert_ffn=64)
    prof = tmp_path / "moe.json"
    moe_profile(shape, seq=32, batch=1).save(str(prof))
    return prof

@pytest.mark.slow
@needs_torchtitan
def test_an_moe_paste_carries_ep_and_etp_into_torchtitan(tmp_path, capsys):
    """tp 2 with sp, etp 1 (experts whole), ep 8 borrowing the TP ranks: 0.2's TOML sets
    expert_tensor_parallel_degree 1, 0.3's CLI (no such option: its EP always borrows TP)
    leaves it out; each line's own ParallelDims accepts the degrees."""
    prof = _small_moe_profile(tmp_path)
    assert main(["plan", "--profile", str(prof), "--gpu", "h100-sxm", "--gpus", "8",
                 "--global-batch", "16", "--config", "tp=2,sp=1,pp=1,dp=4,ep=8,etp=1,"
                 "sharding=fsdp,mbs=1,recompute=none", "--json"]) == 0
    paste = json.loads(capsys.readouterr().out)["pastes"]["torchtitan"]
    assert paste["parallelism"]["expert_parallel_degree"] == 8
    assert paste["parallelism"]["expert_tensor_parallel_degree"] == 1
    assert "expert_tensor_parallel_degree" not in paste["cli"]
    if VERSION.startswith("0.2."):
        from torchtitan.config import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims

        from pipebubble.plan.settings import toml_text

        toml = tmp_path / "job.toml"
        toml.write_text(toml_text(paste) + "\n")
        par = ConfigManager().parse_args(["--job.config_file", str(toml)]).parallelism
        assert (par.expert_parallel_degree, par.expert_tensor_parallel_degree) == (8, 1)
        ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                     dp_shard=par.data_parallel_shard_degree, cp=par.context_parallel_degree,
                     tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                     ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree,
                     world_size=8)
    else:
        pytest.importorskip("triton", reason="torchtitan 0.3's llama3 config imports triton")
        from torchtitan.config.manager import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims

        args = ["--module", "llama3", "--config", "llama3_debugmodel",
                *shlex.split(paste["cli"])]
        par = ConfigManager().parse_args(args).parallelism
        assert par.expert_parallel_degree == 8 and par.tensor_parallel_degree == 2
        ParallelDims.from_config(par, 8)


@pytest.mark.slow
@needs_torchtitan
@needs_03
def test_an_hsdp_ep_paste_loads_into_torchtitan_03(tmp_path, capsys):
    """HSDP x EP on 32 GPUs (4 replicas of a shard group of 8, ep 4, tp 1): 0.3's CLI
    carries data_parallel_replicate_degree, data_parallel_shard_degree and
    expert_parallel_degree, its ParallelDims accepts them, and its efsdp (dp_shard x cp x
    tp / ep, distributed/parallel_dims.py build_mesh) is the group the planner shards the
    experts' states over."""
    pytest.importorskip("triton", reason="torchtitan 0.3's llama3 config imports triton")
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    prof = _small_moe_profile(tmp_path)
    assert main(["plan", "--profile", str(prof), "--gpu", "h100-sxm", "--gpus", "32",
                 "--global-batch", "64", "--config", "tp=1,pp=1,dp=32,ep=4,sharding=hsdp,"
                 "mbs=1,recompute=none", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    paste, c = data["pastes"]["torchtitan"], data["config"]
    assert (c["dp_replicate"], c["dp_shard"], c["ep"]) == (4, 8, 4)
    args = ["--module", "llama3", "--config", "llama3_debugmodel", *shlex.split(paste["cli"])]
    par = ConfigManager().parse_args(args).parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree,
            par.expert_parallel_degree) == (4, 8, 4)
    dims = ParallelDims.from_config(par, 32)
    efsdp = dims.dp_shard * dims.cp * dims.tp // dims.ep
    assert efsdp == c["all_to_all"]["efsdp"] == 2
