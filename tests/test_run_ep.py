"""Expert parallelism (``run --ep N``, runtime/ep.py): the group layout, the dispatch and
combine index logic, an EP layer's forward and backward against the unsplit MoE (members run
as threads exchanging rows in memory: no processes), the flags' bad input, and one gloo run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from pipebubble.models.moe import MoE
from pipebubble.runtime.ep import (
    ExpertParallelMoE,
    expert_layout,
    expert_parameter_ids,
    expert_rows,
    owned_experts,
    plan_dispatch,
    shard_experts,
)


# ---- layout ---------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks,dp,ep", [(1, 2, 2), (2, 4, 2), (3, 4, 4), (2, 6, 3), (2, 4, 1)])
def test_every_rank_is_in_one_ep_group_and_one_expert_data_parallel_group(ranks, dp, ep):
    eps, edps = expert_layout(ranks, dp, ep)
    world = range(ranks * dp)
    for groups, size in ((eps, ep), (edps, dp // ep)):
        assert sorted(g for grp in groups for g in grp) == list(world)
        assert all(len(grp) == size for grp in groups)
        assert all(len({g % ranks for g in grp}) == 1 for grp in groups)  # one pipeline rank
    for a in eps:  # an EP group and an EDP group of the same pipeline rank share one rank
        for b in edps:
            if a[0] % ranks == b[0] % ranks:
                assert len(set(a) & set(b)) == 1


def test_layout_by_hand():
    # P = 2, dp = 4: replicas 0,1 and 2,3 share experts; EDP pairs replicas 0,2 and 1,3
    eps, edps = expert_layout(2, 4, 2)
    assert eps == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert edps == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert [list(owned_experts(8, 4, k)) for k in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


# ---- dispatch / combine indices -------------------------------------------------------------
def test_dispatch_by_hand():
    d = plan_dispatch(torch.tensor([[3, 0], [1, 0], [2, 3]]), experts=4, members=2)
    # sorted by expert: e0 <- (t0,s1), (t1,s1); e1 <- (t1,s0); e2 <- (t2,s0); e3 <- (t0,s0), (t2,s1)
    assert d.rows.tolist() == [0, 1, 1, 2, 0, 2]
    assert d.slots.tolist() == [1, 1, 0, 0, 0, 1]
    assert d.counts.tolist() == [[2, 1], [1, 2]]


def test_dispatch_is_a_permutation_of_the_assignments_sorted_by_expert():
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        tokens, k, experts, members = 11, 3, 6, 3
        chosen = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
        d = plan_dispatch(chosen, experts, members)
        assert sorted(zip(d.rows.tolist(), d.slots.tolist(), strict=True)) == [
            (t, s) for t in range(tokens) for s in range(k)]
        sent = chosen[d.rows, d.slots]
        assert sent.tolist() == sorted(sent.tolist())
        assert d.counts.reshape(-1).tolist() == torch.bincount(
            chosen.reshape(-1), minlength=experts).tolist()


def test_expert_rows_by_hand():
    # member 0 sent 2 rows for my expert 0 and 1 for expert 1; member 1 none, then 3
    got = expert_rows(torch.tensor([[2, 1], [0, 3]]))
    assert [r.tolist() for r in got] == [[0, 1], [2, 3, 4, 5]]


# ---- an EP layer against the unsplit MoE, members as threads ----------------------------------
class MemoryGroup:
    """``all_to_all_single`` between ``n`` threads, in memory: member i's ``exchange``."""

    def __init__(self, n: int):
        self.n, self.slots = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=30)

    def exchange(self, i: int):
        def run(out, x, recv=None, send=None):
            send = send or [x.shape[0] // self.n] * self.n
            self.slots[i] = torch.split(x, send)
            self.barrier.wait()
            out.copy_(torch.cat([self.slots[j][i] for j in range(self.n)]))
            self.barrier.wait()  # nobody overwrites a slot before all have read it

        return run


def _run_members(moe: MoE, xs: list[torch.Tensor], cs: list[torch.Tensor]):
    """Each member's EP copy of ``moe`` runs forward and backward (loss sum(out * c))."""
    n = len(xs)
    group = MemoryGroup(n)
    layers = [ExpertParallelMoE(copy.deepcopy(moe), n, i, group.exchange(i)) for i in range(n)]
    outs, errors = [None] * n, []

    def member(i: int) -> None:
        try:
            x = xs[i].clone().requires_grad_(True)
            out = layers[i](x)
            (out * cs[i]).sum().backward()
            outs[i] = (out.detach(), x.grad)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return layers, outs


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal to float64 rounding (not torch.testing.assert_close: it imports DTensor, 6 s)."""
    assert a.shape == b.shape and float((a - b).abs().max()) < 1e-13


@pytest.mark.parametrize("members,experts,top_k,shared", [(2, 4, 2, 1), (4, 4, 1, 0),
                                                          (2, 6, 3, 0)])
def test_ep_layer_equals_the_unsplit_moe_forward_and_backward(members, experts, top_k, shared):
    torch.manual_seed(0)
    dim = 8
    moe = MoE(dim, experts, top_k, ffn=12, shared=shared).double()
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(3, 5, dim, generator=gen, dtype=torch.float64) for _ in range(members)]
    cs = [torch.randn(3, 5, dim, generator=gen, dtype=torch.float64) for _ in range(members)]
    layers, outs = _run_members(moe, xs, cs)
    ref = copy.deepcopy(moe)
    x = torch.cat(xs).requires_grad_(True)
    out = ref(x)
    (out * torch.cat(cs)).sum().backward()
    for i, (o, gx) in enumerate(outs):
        _close(o, out[3 * i:3 * (i + 1)].detach())
        _close(gx, x.grad[3 * i:3 * (i + 1)])
    assert all(float(p.grad.abs().max()) > 0 for p in ref.experts.parameters())  # all used
    # an expert's gradient on its owner is the whole group's; replicated weights sum
    for i, layer in enumerate(layers):
        assert sorted(int(k) for k in layer.experts) == list(owned_experts(experts, members, i))
        for e, mod in layer.experts.items():
            for a, b in zip(mod.parameters(), ref.experts[int(e)].parameters(), strict=True):
                _close(a.grad, b.grad)
    for name, p in ref.named_parameters():
        if name.startswith("experts."):
            continue
        total = sum(dict(layer.named_parameters())[name].grad for layer in layers)
        _close(total, p.grad)


def test_an_expert_no_token_chose_gets_a_zero_gradient_on_its_owner():
    torch.manual_seed(0)
    moe = MoE(4, 8, 1, ffn=4, shared=0).double()  # 8 experts, 2 tokens in all: 6+ unused
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(1, 1, 4, generator=gen, dtype=torch.float64) for _ in range(2)]
    layers, _ = _run_members(moe, xs, [torch.ones(1, 1, 4, dtype=torch.float64)] * 2)
    grads = [p.grad for layer in layers for p in layer.experts.parameters()]
    assert all(g is not None for g in grads)
    assert sum(bool(g.abs().max() == 0) for g in grads) >= 6 * 3  # 3 weights per expert


def test_sharding_keeps_the_unsplit_names_of_the_own_experts():
    from pipebubble.models import build_model

    spec = build_model("moe", layers=2, dim=8, heads=2, vocab=20, seq=4, experts=4, top_k=2)
    block = spec.layers[1]
    before = {n for n, _ in block.named_parameters()}
    assert shard_experts(block, 2, 1, exchange=None) == 1
    after = {n for n, _ in block.named_parameters()}
    assert after < before
    assert {n.split(".")[2] for n in after if n.startswith("moe.experts.")} == {"2", "3"}
    ids = expert_parameter_ids(block)
    assert {n for n, p in block.named_parameters() if id(p) in ids} == {
        n for n in after if n.startswith("moe.experts.")}


# ---- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("flags,says", [
    (["--model", "moe", "--dp", "2", "--ep", "3"], "--ep 3 must divide --dp 2"),
    (["--model", "moe", "--dp", "3", "--ep", "3"], "must divide the experts of every MoE"),
    (["--model", "mlp", "--dp", "2", "--ep", "2"], "has no mixture-of-experts layers"),
    (["--model", "moe", "--dp", "2", "--ep", "2", "--engine", "torch"], "drop --engine torch"),
    (["--model", "moe", "--local", "--ep", "2"], "drop --local"),
    (["--model", "moe", "--dp", "2", "--ep", "0"], "--ep must be >= 1, got 0"),
])
def test_bad_ep_is_one_line_and_exit_2(flags, says, run_cli):
    rc, _, err = run_cli("run", "--schedule", "1f1b", "-p", "1", "-m", "2", "--layers", "2",
                         *flags)
    err = err.strip()
    assert rc == 2 and says in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ---- one gloo run ---------------------------------------------------------------------------
@pytest.mark.distributed
def test_gloo_ep2_gradients_equal_the_unsplit_model_and_the_checkpoint_is_whole(tmp_path,
                                                                                  run_cli):
    """dp 2, EP 2: each replica holds 2 of the 4 experts of each layer (pp 1: half the
    processes of README's pp 2 command; both pass). Two AdamW steps, saved: every expert is
    in the checkpoint (a rank-local load of the whole model from it succeeds)."""
    ck = tmp_path / "ck"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "run", "--schedule", "1f1b",
                           "-p", "1", "-m", "2", "--dp", "2", "--ep", "2", "--model", "moe",
                           "--check", "--dtype", "float64", "--warmup", "0", "--repeat", "1",
                           "--steps", "2", "--save", str(ck), "--json"],
                          capture_output=True, text=True, timeout=170, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["world_size"] == 2 and out["dp"] == 2 and out["ep"] == 2
    assert out["grad_max_abs_diff"] < 1e-12 and out["loss_abs_diff"] < 1e-12
    assert out["param_max_abs_diff"] < 1e-12 and out["check"]["passed"]
    rc, text, err = run_cli("run", "--local", "--schedule", "1f1b", "-p", "1", "-m", "2",
                            "--model", "moe", "--dtype", "float64", "--resume", str(ck),
                            "--warmup", "0", "--repeat", "1", "--json")
    assert rc == 0, err
    assert json.loads(text)["train"]["first_step"] == 2
