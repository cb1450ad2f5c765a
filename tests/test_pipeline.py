import copy
import runpy
from pathlib import Path

import pytest
import torch
from torch import nn

from pipebubble import CostModel, Pipeline, PipelineStage, bubble_fraction
from pipebubble.demo import run_demo
from pipebubble.errors import UserError


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
    # The per-rank clock never idles without a reason: each action starts exactly when its
    # rank's previous action and its inputs are done (no comm time in the lesson's clock).
    for r in range(t.num_ranks):
        prev_end = 0.0
        for e in t.events(r):
            s, m = e.stage, e.microbatch
            deps = [(s - 1, "F", m)] if e.kind == "F" and s > 0 else []
            if e.kind == "B":
                deps = [(s, "F", m)] + ([(s + 1, "B", m)] if s < 3 else [])
            assert e.start == max([prev_end] + [ev[d].end for d in deps]), e
            prev_end = e.end
    # 1F1B holds at most p - r microbatches in flight on rank r
    assert [s.peak_activations for s in t.rank_stats()] == [4, 3, 2, 1]


def test_trace_has_one_line_per_microbatch():
    r = Pipeline(make(), 8, costs=CostModel()).step(torch.randn(16, 8), torch.randn(16, 8))
    lines = Pipeline.trace(r)
    assert len(lines) == 8 and lines[0].startswith("mb 0: 0F@0-1")


def test_bad_pipeline_input():
    with pytest.raises(UserError, match="num_microbatches must be >= 1, got 0"):
        Pipeline(make(), 0)
    with pytest.raises(UserError, match="cannot be split into 8 microbatches"):
        Pipeline(make(), 8).step(torch.randn(4, 8), torch.randn(4, 8))


@pytest.mark.slow
def test_demo_prints_trace_gantt_and_bubble(capsys):
    """code/main.py as a script (in this process: a new interpreter would only add the
    seconds of importing torch again)."""
    main = Path(__file__).resolve().parents[1] / "code" / "main.py"
    runpy.run_path(str(main), run_name="__main__")
    out = capsys.readouterr().out
    assert "mb 7:" in out and "rank 3" in out
    # the cost-model clock (F=1, B=2) gives exactly (p - 1)/(m + p - 1) = 3/11
    assert "cost-model bubble 27.27% (closed form 27.27%)" in out
    assert "simulated clock" in out  # not called measured: F=1 B=2 is not a measurement


@pytest.mark.parametrize("name, devices, closed", [("interleaved-1f1b", 2, "closed form 11.11%"),
                                                   ("zbv", 2, "over each rank's own span")])
def test_demo_runs_schedules_with_chunks_on_as_many_devices(name, devices, closed):
    """--stages counts devices: a 2-chunk schedule on 2 devices cuts the model into 4
    stages. Interleaved 1F1B at p=2, m=4, v=2 (F=1, B=2): (p-1)/(v*m + p-1) = 1/9."""
    from rich.console import Console

    console = Console(record=True, width=300)
    figures = run_demo(devices, 4, name, console=console)
    out = console.export_text()
    assert f"{name}: 2 devices, 4 stages, 4 microbatches" in out
    assert closed in out
    if name == "interleaved-1f1b":
        assert figures["bubble_cost_clock"] == pytest.approx(1 / 9)
