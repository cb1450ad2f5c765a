"""Expert parallelism on HuggingFace mixtures of experts (``run --model hf:... --ep N``,
runtime/ep.py's ExpertParallelHFExperts): mixtral, qwen2_moe, qwen3_moe and deepseek_v3 at
toy size (float64, tests/test_hf_moe.py's configs).

In one process, EP members run as threads exchanging rows in memory: a block's sharded
experts against transformers' own experts, then whole pipelines (dp 2 replicas, EP 2, three
schedules) against the unsplit HF model. Over gloo, one run per family (dp 2 or 4, EP 2 or
4, a schedule each), with ``--check`` and a checkpoint saved or resumed under ``--ep``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

pytest.importorskip("transformers")

from pipebubble.models.hf import MOE_TYPES, hf_spec  # noqa: E402
from pipebubble.runtime.dist.report import grad_diffs  # noqa: E402
from pipebubble.runtime.ep import (  # noqa: E402
    ExpertParallelHFExperts,
    Rows,
    check_ep,
    expert_parameter_ids,
    row_shards,
    shard_experts,
)
from pipebubble.runtime.local import run_local  # noqa: E402
from pipebubble.runtime.stages import split_stages  # noqa: E402
from pipebubble.schedules import get_schedule  # noqa: E402
from test_hf_moe import CONFIGS, SEQ, _hf_loss, _hf_named, tiny  # noqa: E402
from test_run_ep import MemoryGroup  # noqa: E402


def _threads(n: int, fn) -> None:
    """``fn(i)`` for members 0..n-1, each in its own thread; the first failure re-raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def _close(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= 1e-13 * scale, float((a - b).abs().max())


# ---- one MoE block: the sharded experts against transformers' ------------------------------
@pytest.mark.parametrize("members", [2, 4])
@pytest.mark.parametrize("kind", MOE_TYPES)
def test_sharded_experts_give_the_hf_block_output_and_gradients(kind, members):
    """Each member holds 4/N of the experts (rows of the fused tensors, same names); the
    block's router and shared experts run as they are. Outputs, input gradients, each
    owner's expert rows and the sum of the replicated weights' gradients are the unsplit
    block's."""
    model = tiny(kind)
    hf_spec(model, seq=SEQ)  # its float64 paths (eager experts, DeepSeek's float64 router)
    block = model.model.layers[1].mlp
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 5, 32, generator=gen, dtype=torch.float64) for _ in range(members)]
    cs = [torch.randn(2, 5, 32, generator=gen, dtype=torch.float64) for _ in range(members)]
    group = MemoryGroup(members)
    parts = [copy.deepcopy(block) for _ in range(members)]
    for i, part in enumerate(parts):
        assert shard_experts(part, members, i, group.exchange(i)) == 1
    outs: list = [None] * members

    def member(i: int) -> None:
        x = xs[i].clone().requires_grad_(True)
        out = parts[i](x)
        (out * cs[i]).sum().backward()
        outs[i] = (out.detach(), x.grad)

    _threads(members, member)
    ref = copy.deepcopy(block)
    x = torch.cat(xs).requires_grad_(True)
    out = ref(x)
    (out * torch.cat(cs)).sum().backward()
    per = 4 // members
    assert len({int(e) for p in parts for e in p.experts.own}) == 4
    for i, (o, gx) in enumerate(outs):
        _close(o, out[2 * i:2 * i + 2].detach())
        _close(gx, x.grad[2 * i:2 * i + 2])
        ex = parts[i].experts
        assert isinstance(ex, ExpertParallelHFExperts) and ex.start == i * per
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(ref.experts, name)
            assert getattr(ex, name).shape == (per, *full.shape[1:])
            _close(getattr(ex, name).detach(), full.detach()[i * per:(i + 1) * per])
            _close(getattr(ex, name).grad, full.grad[i * per:(i + 1) * per])
    assert float(ref.experts.down_proj.grad.abs().amax(dim=(1, 2)).min()) > 0  # all used
    for name, p in ref.named_parameters():
        if not name.startswith("experts."):  # router, shared experts: replicated, summed
            _close(sum(dict(q.named_parameters())[name].grad for q in parts), p.grad)


def test_sharding_keeps_the_names_and_marks_the_fused_tensors():
    spec = hf_spec(tiny("deepseek_v3"), seq=SEQ)
    layer = spec.layers[2]  # model.layers.1: an MoE layer (layer 0 is dense)
    before = {n: p.shape for n, p in layer.named_parameters()}
    assert shard_experts(layer, 2, 1, exchange=None) == 1
    after = {n: p.shape for n, p in layer.named_parameters()}
    assert after.keys() == before.keys()
    fused = {n for n in after if n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    assert len(fused) == 2
    for n in after:
        assert after[n] == ((2, *before[n][1:]) if n in fused else before[n])
    ids = expert_parameter_ids(layer)
    assert {n for n, p in layer.named_parameters() if id(p) in ids} == fused
    assert sorted(row_shards(layer).values()) == [(2, 4), (2, 4)]  # rows 2..3 of 4
    assert shard_experts(spec.layers[1], 2, 1, exchange=None) == 0  # the dense layer


def test_ep_must_divide_the_experts_of_an_hf_model():
    spec = hf_spec(tiny("qwen3_moe"), seq=SEQ)
    check_ep(2, 2, list(spec.layers), "hf:x")
    check_ep(4, 4, list(spec.layers), "hf:x")
    with pytest.raises(Exception, match="must divide the experts of every MoE layer, got 4"):
        check_ep(3, 3, list(spec.layers), "hf:x")
    dense = hf_spec(tiny("qwen2_moe", mlp_only_layers=[0, 1, 2]), seq=SEQ)
    with pytest.raises(Exception, match="has no mixture-of-experts layers"):
        check_ep(2, 2, list(dense.layers), "hf:x")


# ---- whole pipelines: dp 2 replicas as threads, EP 2 --------------------------------------
@pytest.mark.parametrize("name,m", [("1f1b", 4), ("interleaved-1f1b", 4), ("zb-h1", 4),
                                    ("dualpipe", 4)])
@pytest.mark.parametrize("kind", MOE_TYPES)
def test_two_replicas_with_ep_give_the_unsplit_hf_gradients(kind, name, m):
    """Two data-parallel replicas of a 2-rank pipeline, each MoE layer's 4 experts split
    2 + 2 between them, every replica running the schedule on its half of the batch (its
    tokens sent to the other's experts and back). Summed over the replicas (the experts
    over their one owner), the gradients are the unsplit HF model's on the whole batch,
    and the mean of the two losses is its loss."""
    sched = get_schedule(name, 2, m)
    stages = sched.num_stages // sched.chains
    model = tiny(kind, num_hidden_layers={2: 4, 4: 6}[stages])  # stages of equal layers
    spec = hf_spec(model, seq=SEQ)
    ref = copy.deepcopy(model)
    x, y = spec.make_batch(16, torch.Generator().manual_seed(3))
    group = MemoryGroup(2)
    replicas = []
    for i in range(2):
        mods = split_stages(copy.deepcopy(spec.layers), stages, None)
        assert sum(shard_experts(mod, 2, i, group.exchange(i)) for mod in mods) >= 2
        replicas.append(mods)
    losses = [0.0, 0.0]

    def replica(i: int) -> None:
        losses[i] = run_local(sched, replicas[i], x[8 * i:8 * i + 8], y[8 * i:8 * i + 8],
                              spec.loss_fn).loss

    _threads(2, replica)
    ref_loss = _hf_loss(ref, x, y)
    ref_loss.backward()
    assert (losses[0] + losses[1]) / 2 == pytest.approx(ref_loss.item(), rel=1e-12)
    want = dict(ref.named_parameters())
    scale = max(float(q.grad.abs().max()) for q in want.values())
    got = [dict(p for mod in mods for p in _hf_named(mod)) for mods in replicas]
    assert got[0].keys() == want.keys() == got[1].keys()
    for n, q in want.items():
        if n.endswith(("experts.gate_up_proj", "experts.down_proj")):
            for i in range(2):  # each replica's loss is the mean of its half: / 2
                _close(got[i][n].grad / 2, q.grad[2 * i:2 * i + 2], scale)
        else:
            _close((got[0][n].grad + got[1][n].grad) / 2, q.grad, scale)


def test_the_check_compares_a_members_rows_with_the_same_rows_of_the_reference():
    full = torch.arange(12.0).reshape(4, 3)

    class Result:
        def __init__(self, grads):
            self.grads = grads

    same = [Result({0: [Rows(full[2:4].clone(), 2, 4)]})]
    assert grad_diffs(same, 1.0, {0: [full]}, 1.0)["grad_max_abs_diff"] == 0
    shifted = [Result({0: [Rows(full[0:2].clone(), 2, 4)]})]
    assert grad_diffs(shifted, 1.0, {0: [full]}, 1.0)["grad_max_abs_diff"] == 6


# ---- bad input -----------------------------------------------------------------------------
def _config(tmp_path, kind: str, **extra) -> str:
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({"model_type": kind, **CONFIGS[kind], **extra}))
    return f"hf:{path}"


@pytest.mark.parametrize("kind,flags,says", [
    ("mixtral", ["--dp", "3", "--ep", "3"], "--ep 3 must divide 'num_local_experts' 4 (the "
     "experts of every MoE layer of --model hf:"),
    ("qwen3_moe", ["--dp", "3", "--ep", "3"], "--ep 3 must divide 'num_experts' 4"),
    ("deepseek_v3", ["--dp", "8", "--ep", "8"], "--ep 8 must divide 'n_routed_experts' 4"),
    ("qwen2_moe", ["--dp", "3", "--ep", "2"], "--ep 2 must divide --dp 3"),
    ("mixtral", ["--dp", "2", "--ep", "2", "--engine", "torch"], "drop --engine torch"),
    ("mixtral", ["--local", "--ep", "2"], "drop --local"),
])
def test_bad_ep_on_an_hf_model_is_one_line_and_exit_2(tmp_path, run_cli, kind, flags, says):
    rc, out, err = run_cli("run", "--model", _config(tmp_path, kind), "--seq", str(SEQ),
                           "-p", "2", "-m", "2", "--schedule", "1f1b", *flags)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and says in err, err


# ---- over gloo -----------------------------------------------------------------------------
def _gloo(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run", "--seq", str(SEQ),
                           "--dtype", "float64", "--warmup", "0", "--repeat", "1", "--json",
                           *args], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _local(run_cli, *args: str) -> dict:
    rc, out, err = run_cli("run", "--local", "--seq", str(SEQ), "--dtype", "float64",
                           "--warmup", "0", "--repeat", "1", "--json", *args)
    assert rc == 0, err
    return json.loads(out)


def _assert_exact(out: dict, world: int, dp: int, ep: int) -> None:
    assert (out["world_size"], out["dp"], out["ep"]) == (world, dp, ep)
    rel = out["check"]["relative"]
    assert out["check"]["passed"] and rel["gradients"] < 1e-10 and rel["loss"] < 1e-10
    assert rel["parameters"] < 1e-10 and out["losses"] == pytest.approx(
        out["reference_losses"], rel=1e-12)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("kind,schedule,flags", [
    ("qwen2_moe", "interleaved-1f1b", ["-p", "2", "-m", "4", "--dp", "2", "--ep", "2"]),
    ("qwen3_moe", "dualpipe", ["-p", "2", "-m", "4", "--dp", "2", "--ep", "2"]),
])
def test_gloo_ep_gradients_equal_the_unsplit_hf_model(tmp_path, kind, schedule, flags):
    out = _gloo("--schedule", schedule, "--model", _config(tmp_path, kind), "--check", *flags)
    _assert_exact(out, 4, 2, 2)


@pytest.mark.distributed
@pytest.mark.slow
def test_gloo_ep_mixtral_saves_a_checkpoint_a_local_run_resumes(tmp_path, run_cli):
    """1F1B on 2 ranks x dp 2, EP 2, two AdamW steps checked and saved (each fused expert
    tensor whole: its two halves gathered); a local run resumes it for a third step: the
    three losses are an uninterrupted local run's (same global batch of 32)."""
    model, ck = _config(tmp_path, "mixtral"), str(tmp_path / "ck")
    out = _gloo("--schedule", "1f1b", "-p", "2", "-m", "2", "--dp", "2", "--ep", "2",
                "--model", model, "--check", "--steps", "2", "--save", ck)
    _assert_exact(out, 4, 2, 2)
    common = ["--schedule", "1f1b", "-p", "2", "-m", "2", "--batch", "32", "--model", model]
    resumed = _local(run_cli, *common, "--steps", "1", "--resume", ck)
    assert resumed["train"]["first_step"] == 2
    whole = _local(run_cli, *common, "--steps", "3")
    assert out["losses"] + resumed["losses"] == pytest.approx(whole["losses"], rel=1e-12)
    rc, _, err = run_cli("export-hf", ck, str(tmp_path / "hf"))  # whole experts: loadable
    assert rc == 0 and "mixtral, 40,032 parameters, 2 steps trained" in err, err


@pytest.mark.distributed
@pytest.mark.slow
def test_gloo_ep_deepseek_resumes_a_local_checkpoint_with_dp4_ep2(tmp_path, run_cli):
    """A local run saves two steps; ZB-H1 with dp 4 and EP 2 (expert-data-parallel groups
    of 2: each expert's gradient summed over the two replicas holding it) resumes it for a
    third, checked against the unsplit model resumed alike: the loss of the third step of an
    uninterrupted local run."""
    model, ck = _config(tmp_path, "deepseek_v3"), str(tmp_path / "ck")
    common = ["-m", "2", "--model", model]
    first = _local(run_cli, "--schedule", "1f1b", "-p", "1", "--batch", "32", *common,
                   "--steps", "2", "--save", ck)
    out = _gloo("--schedule", "zb-h1", "-p", "1", "--dp", "4", "--ep", "2", "-m", "2",
                "--batch", "8", "--model", model, "--check", "--steps", "1", "--resume", ck)
    _assert_exact(out, 4, 4, 2)
    assert out["train"]["first_step"] == 2
    whole = _local(run_cli, "--schedule", "1f1b", "-p", "1", "--batch", "32", *common,
                   "--steps", "3")
    assert first["losses"] + out["losses"] == pytest.approx(whole["losses"], rel=1e-12)
