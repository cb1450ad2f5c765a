"""The built-in MoE model (models/moe.py): its routing against a brute-force oracle, every
registered schedule's gradients against the unsplit model's (float64), training against plain
PyTorch, the refused auxiliary loss, and one gloo run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.limits import model_params
from pipebubble.models import build_model
from pipebubble.models.moe import MoE, moe
from pipebubble.runtime.local import run_local
from pipebubble.runtime.stages import split_stages
from pipebubble.schedules import get_schedule, schedule_names
from runtime_helpers import first_schedule

TINY = dict(dim=8, heads=2, experts=4, top_k=2, vocab=32, seq=5)


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@torch.no_grad()
def brute_force(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, then each token's top-k by sorting its probabilities."""
    tokens = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(tokens @ layer.router.weight.T, dim=-1)
    every = torch.stack([e(tokens) for e in layer.experts], dim=1)  # (tokens, E, dim)
    out = torch.zeros_like(tokens)
    for n in range(tokens.shape[0]):
        order = sorted(range(probs.shape[1]), key=lambda e: -float(probs[n, e]))
        top = order[:layer.top_k]
        norm = sum(probs[n, e] for e in top)
        for e in top:
            out[n] += probs[n, e] / norm * every[n, e]
    if layer.shared is not None:
        out = out + layer.shared(tokens)
    return out.view_as(x)


def test_routing_equals_brute_force_and_is_per_token(float64):
    torch.manual_seed(3)
    layer = MoE(dim=8, experts=5, top_k=2, ffn=12, shared=1)
    x = torch.randn(3, 7, 8)
    out = layer(x)
    torch.testing.assert_close(out, brute_force(layer, x), rtol=1e-12, atol=1e-12)
    # a token's output does not depend on the others in its batch: microbatching is exact
    torch.testing.assert_close(torch.cat([layer(x[i:i + 1]) for i in range(3)]), out,
                               rtol=1e-12, atol=1e-12)
    chosen = layer.router(x.reshape(-1, 8)).topk(2, dim=-1).indices
    assert len(set(chosen.flatten().tolist())) >= 3  # the routing is not trivial


def test_an_expert_no_token_chose_gets_a_zero_gradient(float64):
    torch.manual_seed(0)
    layer = MoE(dim=4, experts=3, top_k=1, ffn=4, shared=0)
    with torch.no_grad():  # every token prefers expert 0
        layer.router.weight.zero_()
        layer.router.weight[0].fill_(10.0)
    x = torch.rand(2, 3, 4) + 0.1
    layer(x).sum().backward()
    assert layer.experts[0].up.weight.grad.abs().sum() > 0
    for e in (1, 2):
        assert layer.experts[e].up.weight.grad is not None
        assert layer.experts[e].up.weight.grad.abs().sum() == 0


def _problem(stages: int, batch: int, seed: int = 0):
    spec = moe(layers=2 * stages - 2 if stages > 1 else 1, seed=seed, **TINY)
    layers = [m.to(torch.float64) for m in spec.layers]
    ref = copy.deepcopy(nn.Sequential(*layers))
    x, y = spec.make_batch(batch, torch.Generator().manual_seed(seed + 1))
    n = len(layers)
    cuts = None if n % stages == 0 else [round(n * i / stages) for i in range(1, stages)]
    return split_stages(layers, stages, cuts), ref, x, y, spec.loss_fn


def _check_step(schedule, recompute=False):
    stages, ref, x, y, loss_fn = _problem(schedule.num_stages // schedule.chains, 9)
    ref.zero_grad(set_to_none=True)
    ref_loss = loss_fn(ref(x), y)
    ref_loss.backward()
    result = run_local(schedule, stages, x, y, loss_fn, recompute=recompute)
    assert result.loss == pytest.approx(ref_loss.item(), rel=1e-12, abs=1e-12)
    params = [p for s in stages for p in s.parameters()]
    refs = list(ref.parameters())
    assert len(params) == len(refs)
    for i, (p, r) in enumerate(zip(params, refs, strict=True)):
        assert p.grad is not None, f"parameter {i} has no gradient"
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_every_registered_schedule_matches_the_unsplit_moe(name, float64):
    _check_step(first_schedule(name))


def test_recomputation_is_exact_too(float64):
    _check_step(get_schedule("zb-h1", 2, 4), recompute=True)


@pytest.mark.slow
def test_training_equals_plain_pytorch(float64):
    """Three AdamW steps of the pipeline (ZB-H1: split I and W) against plain PyTorch."""
    schedule = get_schedule("zb-h1", 2, 4)
    stages, ref, _, _, loss_fn = _problem(2, 8)
    spec = moe(layers=2, **TINY)
    pipe_opt = torch.optim.AdamW([p for s in stages for p in s.parameters()], lr=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        x, y = spec.make_batch(8, gen)
        result = run_local(schedule, stages, x, y, loss_fn)
        pipe_opt.step()
        pipe_opt.zero_grad(set_to_none=True)
        ref_loss = loss_fn(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert result.loss == pytest.approx(ref_loss.item(), rel=1e-12)
    for p, r in zip([p for s in stages for p in s.parameters()], ref.parameters(),
                    strict=True):
        torch.testing.assert_close(p, r, rtol=1e-9, atol=1e-11)
    assert any(not torch.equal(p, q) for p, q in zip(ref.parameters(),
                                                       _problem(2, 8)[1].parameters(),
                                                       strict=True))  # it did train


@pytest.mark.slow
@pytest.mark.parametrize("name", ["interleaved-1f1b", "zb-h2", "dualpipe", "dualpipev"])
def test_run_local_check_float64_cli(name, capsys):
    """``run --local --model moe --check``: one chunked, one split, both DualPipes (every
    family runs through the same executor above), two AdamW steps against plain PyTorch."""
    assert main(["run", "--local", "--schedule", name, "-p", "2", "-m", "4",
                 "--model", "moe", "--check", "--dtype", "float64", "--steps", "2",
                 "--warmup", "0", "--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grad_max_abs_diff"] < 1e-12 and out["loss_abs_diff"] < 1e-12
    assert out["losses"] == pytest.approx(out["reference_losses"], rel=1e-12)


def test_the_auxiliary_loss_is_refused_in_one_line(capsys):
    with pytest.raises(UserError, match="load-balancing loss is refused"):
        moe(aux_loss=0.01)
    rc = main(["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2",
               "--model", "pipebubble.models.moe:moe", "--model-arg", "aux_loss=0.01"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "aux_loss=0.01" in err and "Traceback" not in err


def test_bad_shapes_are_refused():
    with pytest.raises(UserError, match="top_k must be in 1..4"):
        moe(experts=4, top_k=5)
    with pytest.raises(UserError, match="shared must be 0 or 1"):
        moe(shared=2)


@pytest.mark.parametrize("kwargs", [dict(layers=2), dict(layers=3, dim=16, vocab=100, seq=7)])
def test_the_size_estimate_counts_the_parameters(kwargs):
    spec = build_model("moe", **kwargs)
    real = sum(p.numel() for m in spec.layers for p in m.parameters())
    assert model_params("moe", kwargs["layers"], kwargs.get("dim"), kwargs.get("vocab", 512),
                        kwargs.get("seq", 16)) == real


@pytest.mark.distributed
def test_gloo_1f1b_gradients_equal_the_unsplit_model():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run", "--schedule", "1f1b",
                           "-p", "2", "-m", "4", "--model", "moe", "--check", "--dtype",
                           "float64", "--warmup", "0", "--repeat", "1", "--json"],
                          capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["world_size"] == 2
    assert out["grad_max_abs_diff"] < 1e-12 and out["loss_abs_diff"] < 1e-12


@pytest.mark.slow
def test_a_checkpoint_resumes_under_another_schedule(tmp_path, capsys):
    """Two steps, saved, one more under ZB-H1: the same losses as three steps in one run."""
    common = ["-p", "2", "-m", "4", "--model", "moe", "--warmup", "0", "--repeat", "1",
              "--dtype", "float64", "--json"]
    ck = str(tmp_path / "ck")
    assert main(["run", "--local", "--schedule", "1f1b", "--steps", "2", "--save", ck,
                 *common]) == 0
    first = json.loads(capsys.readouterr().out)["losses"]
    assert main(["run", "--local", "--schedule", "zb-h1", "--steps", "1", "--resume", ck,
                 *common]) == 0
    resumed = json.loads(capsys.readouterr().out)["losses"]
    assert main(["run", "--local", "--schedule", "1f1b", "--steps", "3", *common]) == 0
    whole = json.loads(capsys.readouterr().out)["losses"]
    assert first + resumed == pytest.approx(whole, rel=1e-12)
