"""Measured activation memory: bytes a person can count, GPipe vs 1F1B, split I/W, recompute.

The model is ``Block`` = Linear -> tanh in float64. Per microbatch of n rows and width w, a
block saves two n x w tensors (the Linear's input, tanh's output): ``M_B = 2 * n * w * 8``
bytes. The last stage also keeps the target for the loss (the prediction is tanh's output,
already counted): ``3 * n * w * 8``. With the split backward, W needs only the Linear's input:
``M_W = n * w * 8``.
"""

import gc
import weakref
from dataclasses import replace

import pytest
import torch
from torch import nn

from pipebubble import simulate
from pipebubble.models import MLPBlock
from pipebubble.plan.calibrate import calibrated_costs, predict, stage_memory
from pipebubble.runtime.local import run_local
from pipebubble.runtime.memory import SavedTensors, graph_bytes, param_storages
from pipebubble.runtime.split import backward_input
from pipebubble.schedules import get_schedule, lookup, schedule_names
from runtime_helpers import greedy_schedule, mlp_problem, transformer_problem

N, W = 2, 6  # rows per microbatch, width
TENSOR = N * W * 8  # bytes of one n x w float64 tensor


def run(schedule, recompute=False, layers_per_stage=1):
    m = schedule.num_microbatches
    stages, _, x, y, loss_fn = mlp_problem(schedule.num_stages, N * m, W, layers_per_stage)
    return run_local(schedule, stages, x, y, loss_fn, recompute=recompute)


def m_b(stage, num_stages):
    return (3 if stage == num_stages - 1 else 2) * TENSOR


@pytest.mark.parametrize("p, m", [(4, 8), (4, 3), (3, 5), (2, 1)])
def test_gpipe_holds_m_microbatches_and_1f1b_at_most_p(p, m):
    g = run(get_schedule("gpipe", p, m))
    o = run(get_schedule("1f1b", p, m))
    for r in range(p):
        assert g.peak_bytes[r] == m * m_b(r, p)
        assert o.peak_bytes[r] == min(p - r, m) * m_b(r, p)
    assert [s.peak_activations for s in g.timeline.rank_stats()] == [m] * p
    assert [s.peak_activations for s in o.timeline.rank_stats()] == [min(p - r, m)
                                                                     for r in range(p)]
    assert [s.peak_memory for s in o.timeline.rank_stats()] == [float(b) for b in o.peak_bytes]


def test_split_backward_frees_all_but_what_w_needs():
    schedule = greedy_schedule(3, 1, 4, split=True, defer_w=True)
    t = run(schedule).timeline
    for e in t.events():
        if e.kind == "F":
            assert e.mem_start == m_b(e.stage, 3)
        elif e.kind == "I":
            assert -e.mem_end == m_b(e.stage, 3) - TENSOR  # tanh output (and target) freed
        elif e.kind == "W":
            assert -e.mem_end == TENSOR  # the Linear's input, for dA = g^T x
    mem = stage_memory(t)
    assert mem["weight_memory"] == [TENSOR] * 3
    assert mem["activation_memory"] == [2 * TENSOR, 2 * TENSOR, 3 * TENSOR]


def test_i_frees_for_real_and_w_frees_the_rest():
    torch.manual_seed(0)
    stage = nn.Sequential(MLPBlock(W), MLPBlock(W)).double()  # Linear -> GELU, twice
    x = torch.randn(N, W, dtype=torch.float64, requires_grad=True)
    weights = param_storages(stage.parameters())
    saved = SavedTensors(storages=weights)
    with saved:
        y = stage(x)
    # saved activations: x, the two pre-GELU tensors, the hidden h (the 2nd Linear's input)
    alive = {b.tensor.data_ptr(): weakref.ref(b.tensor) for b in saved.boxes
             if b.tensor.untyped_storage().data_ptr() not in weights and b.tensor is not x}
    assert saved.nbytes == 4 * TENSOR and len(alive) == 3

    def count():
        gc.collect()
        return sum(r() is not None for r in alive.values())

    dx, work = backward_input(y, torch.ones_like(y), x, saved)
    del y
    assert count() == 1  # only h, which W needs for the 2nd Linear's weight gradient
    assert work.nbytes == 2 * TENSOR  # x and h
    assert all(p.grad is None for p in stage.parameters())
    work.run()
    assert count() == 0
    assert all(p.grad is not None for p in stage.parameters())
    assert dx.shape == x.shape


def test_saved_tensor_hooks_count_what_the_graph_walk_finds():
    stages, _, x, y, _ = transformer_problem(2, 3)
    h = stages[0](x)
    saved = SavedTensors(storages=param_storages(stages[1].parameters()))
    inp = h.detach().requires_grad_()
    with saved:
        out = stages[1](inp)
    assert saved.nbytes == graph_bytes(out, stages[1].parameters()) > 0


def equal_batch_schedules():
    """Every registered schedule at a (p, m, v) it takes, plus hand-built split ones."""
    out = []
    for name in schedule_names(searched=False):
        spec = lookup(name)
        for p, m in [(4, 8), (2, 4), (3, 6)]:
            try:
                out.append(get_schedule(name, p, m, spec.chunks))
                break
            except Exception:
                continue
    out.append(greedy_schedule(3, 1, 5, split=True, defer_w=True, name="split-deferred-w"))
    out.append(greedy_schedule(2, 2, 4, placement="v", split=True, overlap=True, name="v-split"))
    out.append(greedy_schedule(2, 2, 3, name="loop-2-chunks"))
    return out


@pytest.mark.parametrize("schedule", equal_batch_schedules(), ids=lambda s: s.name)
def test_measured_peaks_equal_the_simulators(schedule):
    """Calibrate memory from the run and simulate: the peaks per rank are the same bytes."""
    for recompute in (False, True):
        r = run(schedule, recompute, layers_per_stage=2)
        pred = predict(schedule, r.timeline, recompute, r.input_bytes).predicted
        assert [s.peak_memory for s in pred.rank_stats()] == [float(b) for b in r.peak_bytes]
        assert [s.peak_memory for s in r.timeline.rank_stats()] == [float(b)
                                                                    for b in r.peak_bytes]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_recompute_trade_is_the_cost_models(name):
    """Recomputation lowers the measured peak; the plain run's costs with recompute=True
    predict the recomputed run's peaks exactly, and one more forward per backward."""
    p, m = 4, 6
    schedule = get_schedule(name, p, m)
    plain = run(schedule, layers_per_stage=2)
    stages, _, x, y, loss_fn = mlp_problem(p, N * m, W, 2)
    calls = [0]
    for s in stages:
        s.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    rec = run_local(schedule, stages, x, y, loss_fn, recompute=True)
    assert calls[0] == 2 * p * m  # each F once, and again in its backward
    assert max(rec.peak_bytes) < max(plain.peak_bytes)
    model = replace(calibrated_costs(plain.timeline, False, plain.input_bytes), recompute=True)
    predicted = simulate(schedule, model)
    assert [s.peak_memory for s in predicted.rank_stats()] == [float(b) for b in rec.peak_bytes]
    # A 2-block stage keeps x, t1, t2 (t1 is tanh's output and the 2nd Linear's input):
    # 3 tensors. Rank 0 of 1F1B with recomputation: p inputs kept, and one backward
    # rematerialises the other 2 tensors of its stage.
    if name == "1f1b":
        assert plain.peak_bytes[0] == p * 3 * TENSOR
        assert rec.peak_bytes[0] == p * TENSOR + 2 * TENSOR
    else:
        assert plain.peak_bytes[0] == m * 3 * TENSOR
        assert rec.peak_bytes[0] == m * TENSOR + 2 * TENSOR
    sc = model.resolve(p)
    for s in range(p):
        assert sc.duration(s, "B") == pytest.approx(sc.b[s] + sc.f[s])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocator_peaks_are_recorded():
    stages, _, x, y, loss_fn = mlp_problem(2, 8)
    dev = torch.device("cuda")
    stages = [s.to(dev) for s in stages]
    r = run_local(get_schedule("1f1b", 2, 4), stages, x.to(dev), y.to(dev), loss_fn,
                  device=dev)
    assert r.allocator_peak is not None and r.allocator_peak >= max(r.peak_bytes)


class FlopClock:
    """A clock that counts each action's FLOPs (torch.utils.flop_counter) as its duration:
    deterministic, so tests can compare compute without timing anything."""

    source = "flops"

    def __init__(self, ranks):
        from pipebubble.runtime.clock import VirtualClock

        self.inner = VirtualClock(ranks)
        self.flops = {}

    def time(self, rank, action, earliest, work, overlapped=False):
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            out = work()
        self.flops[action] = fc.get_total_flops()
        start = max(self.inner.now[rank], earliest)
        self.inner.now[rank] = start + self.flops[action]
        return start, self.inner.now[rank], out

    def arrival(self, t, cross_rank):
        return t


def flops_by_stage(schedule, recompute, problem):
    stages, _, x, y, loss_fn = problem
    clock = FlopClock(schedule.num_ranks)
    run_local(schedule, stages, x, y, loss_fn, clock=clock, recompute=recompute)
    out = {}
    for a, f in clock.flops.items():
        out.setdefault((a.stage, a.kind), set()).add(f)
    assert all(len(v) == 1 for v in out.values())  # equal microbatches: equal compute
    return {k: v.pop() for k, v in out.items()}


@pytest.mark.parametrize("problem", ["mlp", "transformer"])
def test_split_adds_no_compute_and_recompute_adds_one_forward(problem):
    """FLOPs: I + W == B (W does not re-run the activation path); with recomputation the
    backward costs F + B, which is what CostModel(recompute=True) charges."""
    p, m = 2, 4

    def make():
        if problem == "mlp":
            return mlp_problem(p, N * m, W, 2)
        return transformer_problem(p, m)

    fused = flops_by_stage(get_schedule("1f1b", p, m), False, make())
    split = flops_by_stage(greedy_schedule(p, 1, m, split=True), False, make())
    rec = flops_by_stage(get_schedule("1f1b", p, m), True, make())
    for s in range(p):
        assert fused[s, "B"] > 0 and split[s, "W"] > 0
        assert split[s, "I"] + split[s, "W"] == fused[s, "B"]
        assert rec[s, "B"] == fused[s, "F"] + fused[s, "B"]
        assert rec[s, "F"] == fused[s, "F"]
