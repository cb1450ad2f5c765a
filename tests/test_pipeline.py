import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from pipebubble import CostModel, Pipeline, PipelineStage, bubble_fraction


def make(num_stages=4, width=8, seed=0):
    torch.manual_seed(seed)
    return [PipelineStage(nn.Linear(width, width), nn.Tanh()) for _ in range(num_stages)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m, batch", [(8, 32), (3, 10), (1, 4), (5, 5)])
def test_gradients_equal_full_batch(schedule, m, batch):
    stages = make()
    ref = copy.deepcopy(nn.Sequential(*stages))
    x, y = torch.randn(batch, 8), torch.randn(batch, 8)
    result = Pipeline(stages, m, schedule).step(x, y)
    loss = nn.functional.mse_loss(ref(x), y)
    loss.backward()
    assert result.loss == pytest.approx(loss.item(), rel=1e-5)
    for a, b in zip(nn.Sequential(*stages).parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_cost_clock_bubble_is_closed_form():
    r = Pipeline(make(), 8, costs=CostModel(f=1, b=2)).step(torch.randn(16, 8), torch.randn(16, 8))
    assert r.timeline.step_time == 33
    assert r.timeline.bubble_fraction == pytest.approx(bubble_fraction(4, 8))


def test_measured_clock_obeys_timeline_invariants():
    r = Pipeline(make(), 6, "1f1b").step(torch.randn(12, 8), torch.randn(12, 8))
    t = r.timeline
    assert t.source == "measured"
    ev = {(e.stage, e.kind, e.microbatch): e for e in t.events()}
    for (s, k, m), e in ev.items():
        assert e.end > e.start
        if k == "F" and s > 0:
            assert e.start >= ev[s - 1, "F", m].end
        if k == "B" and s < 3:
            assert e.start >= ev[s + 1, "B", m].end
    assert t.step_time >= t.lower_bound
    # 1F1B holds at most p - r microbatches in flight on rank r
    assert [s.peak_activations for s in t.rank_stats()] == [4, 3, 2, 1]


def test_trace_has_one_line_per_microbatch():
    r = Pipeline(make(), 8, costs=CostModel()).step(torch.randn(16, 8), torch.randn(16, 8))
    lines = Pipeline.trace(r)
    assert len(lines) == 8 and lines[0].startswith("mb 0: 0F@0-1")


def test_bad_pipeline_input():
    with pytest.raises(ValueError, match="num_microbatches must be >= 1, got 0"):
        Pipeline(make(), 0)
    with pytest.raises(ValueError, match="cannot be split into 8 microbatches"):
        Pipeline(make(), 8).step(torch.randn(4, 8), torch.randn(4, 8))


def test_demo_prints_trace_gantt_and_bubble():
    main = Path(__file__).resolve().parents[1] / "code" / "main.py"
    res = subprocess.run([sys.executable, str(main)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "mb 7:" in res.stdout and "rank 3" in res.stdout
    assert "measured bubble 27.27% (closed form 27.27%)" in res.stdout
