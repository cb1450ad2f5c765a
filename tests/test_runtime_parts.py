"""Pieces of the distributed runtime that need no processes: sleep workload, 2D costs,
rank 0's clock alignment and comm estimate."""

import pytest
import torch

import pipebubble.models.sleep as sleep_mod
from pipebubble import CostModel, Event, get_schedule, simulate
from pipebubble.models import build_model
from pipebubble.runtime.cut import Cut, choose_cut
from pipebubble.runtime.dist.report import measured_comm, measured_timeline, step_span
from pipebubble.runtime.dist.worker import RankResult
from pipebubble.sim.dataparallel import ring_allreduce_time, step_time_with_allreduce


class _Naps:
    """Stands in for the time module: records what the sleep layers ask for."""

    def __init__(self):
        self.naps = []

    def sleep(self, s):
        self.naps.append(round(s, 9))


@pytest.fixture
def naps(monkeypatch):
    fake = _Naps()
    monkeypatch.setattr(sleep_mod, "time", fake)
    return fake.naps


def test_sleep_layer_sleeps_f_then_i_and_w_apart(naps):
    spec = build_model("sleep", layers=2, width=3, f=[0.1, 0.2], b=[0.5, 0.7], w=[0.2, 0.3])
    x, y = spec.make_batch(4, torch.Generator().manual_seed(0))
    l0, l1 = spec.layers
    h = l0(x)
    out = l1(h)
    assert naps == [0.1, 0.2]  # F of each layer
    naps.clear()
    loss = spec.loss_fn(out, y)
    (gh,) = torch.autograd.grad(loss, [h], retain_graph=True)  # I of layer 1 only
    assert naps == [0.4]
    naps.clear()
    torch.autograd.grad(loss, [l1.weight], retain_graph=True)  # W of layer 1 only
    assert naps == [0.3]
    naps.clear()
    loss.backward()  # B: both halves of both layers (layer 0's I too, as the cost model has)
    assert sorted(naps) == [0.2, 0.3, 0.3, 0.4]
    # the gradients are real: y = x * weight
    g_out = 2 * (out - y) / out.numel()
    torch.testing.assert_close(l1.weight.grad, (g_out * h).sum(0))


def test_sleep_model_rejects_bad_times():
    with pytest.raises(ValueError, match="w must be <= b"):
        build_model("sleep", layers=1, b=0.1, w=0.2)
    with pytest.raises(ValueError, match="expected 1 or 2"):
        build_model("sleep", layers=2, f=[0.1, 0.1, 0.1])


def test_ring_allreduce_by_hand():
    # 4 replicas, 8 MB, 1 GB/s, 10 us: 2*3/4 * 8e6/1e9 + 2*3 * 1e-5 = 0.012 + 0.00006
    assert ring_allreduce_time(8e6, 4, 1e9, 1e-5) == pytest.approx(0.01206)
    with pytest.raises(ValueError):
        ring_allreduce_time(1.0, 0, 1e9)


def test_allreduce_only_counts_with_replicas():
    c = CostModel(f=1, b=2, allreduce=[1.0, 1.0, 1.0, 1.0])
    tl = simulate(get_schedule("gpipe", 4, 8), c)
    assert step_time_with_allreduce(tl, c, dp=1) == tl.step_time == 33
    # rank 0 ends last (its last B at 33); the others end 2, 4, 6 earlier: 33 + 1
    assert step_time_with_allreduce(tl, c, dp=2) == 34


def test_cut_by_layer_count_sizes_differ_by_at_most_one():
    # layers with no counted operation: the default cut balances the layer count
    layers = [torch.nn.Identity() for _ in range(7)]
    assert choose_cut(layers, 3) == Cut([2, 5], "layer count")
    for n in range(1, 12):
        for k in range(1, n + 1):
            edges = [0, *choose_cut([torch.nn.Identity()] * n, k).boundaries, n]
            sizes = [b - a for a, b in zip(edges, edges[1:], strict=False)]
            assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="7 layers, fewer than the 8 stages"):
        choose_cut(layers, 8)


def _result(rank, origin, events, replica=0, host="h"):
    return RankResult(rank, replica, rank, host, origin, events, {}, {}, 0)


def test_alignment_on_one_host_uses_the_shared_clock():
    # rank 1 left the barrier 2 ms after rank 0; its event at local 1.0 s is at 1.002 s
    r0 = _result(0, 100.000, [Event(0, 0, "F", 0, 0.0, 1.0)])
    r1 = _result(1, 100.002, [Event(1, 1, "F", 0, 1.0, 2.0)])
    tl, align = measured_timeline(get_schedule("gpipe", 2, 1), [r0, r1])
    assert align.method == "shared host clock" and align.barrier_skew == pytest.approx(0.002)
    assert [e.start for e in tl.events(1)] == [pytest.approx(1.002)]
    assert step_span([r0, r1]) == pytest.approx(2.002)
    r1.host = "other"
    tl, align = measured_timeline(get_schedule("gpipe", 2, 1), [r0, r1])
    assert align.method == "barrier" and [e.start for e in tl.events(1)] == [1.0]


def test_measured_comm_counts_only_waiting_consumers():
    # 1F0 waited for 0F0 (gap 0.25); 1F1 started late because rank 1 was busy: not counted
    ev = [Event(0, 0, "F", 0, 0.0, 1.0), Event(0, 0, "F", 1, 1.0, 2.0),
          Event(1, 1, "F", 0, 1.25, 3.0), Event(1, 1, "F", 1, 3.0, 4.0)]
    tl, _ = measured_timeline(get_schedule("gpipe", 2, 2),
                              [_result(0, 0.0, ev[:2]), _result(1, 0.0, ev[2:])])
    assert measured_comm(tl) == pytest.approx(0.25)


def test_compare_shows_the_2d_step(capsys):
    import json

    from pipebubble.cli import main

    assert main(["compare", "-p", "4", "-m", "8", "--dp", "2", "--allreduce", "2", "--json"]) == 0
    rows = {r["schedule"]: r for r in json.loads(capsys.readouterr().out)}
    # GPipe: rank 0 ends last at 33 and then all-reduces its stage for 2: 35
    assert rows["gpipe"]["step_time"] == 33 and rows["gpipe"]["step_time_with_allreduce"] == 35
    assert rows["gpipe"]["dp"] == 2
