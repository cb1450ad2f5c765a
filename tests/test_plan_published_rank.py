"""plan/published.py ``rank_config`` under a framework: the planner's pick for a published
workload is a plan that framework runs, priced as it runs it (issue 27), and it is never
slower than the published configuration."""

from __future__ import annotations

import pytest

from pipebubble.plan.frameworks import blocker
from pipebubble.plan.published import (
    engine_step,
    framework_plan,
    predict_config,
    published_runs,
    rank_config,
    ranked_plans,
)

RUNS = {r.name: r for r in published_runs()}
DEEPSPEED, TORCHTITAN = 0.643, 0.391  # plan/frameworks.py CALIBRATIONS (any would do)


def test_a_deepspeed_rows_pick_is_a_plan_deepspeeds_engine_runs():
    """GPT-NeoX-20B (DeepSpeed's pipeline engine): the pick is 1F1B with one stage a rank
    (or no pipeline), no ZeRO-2/3 under PP, cp 1; its step is the engine's
    (blocking P2P, the reduction after the flush), and no slower than the published one's."""
    run = RUNS["20B"]
    rank, pick, step = rank_config(run, DEEPSPEED, framework="deepspeed")
    c = pick.config
    assert blocker("deepspeed", pick) is None
    assert c.pp == 1 or (c.schedule == "1f1b" and c.chunks == 1)
    assert not (c.pp > 1 and c.sharding.shards_grads) and c.cp == 1
    assert step == engine_step(run, pick, DEEPSPEED) >= pick.step_time
    assert step <= framework_plan(run, DEEPSPEED)[1]


def test_a_torchtitan_rows_pick_is_one_torchtitan_runs_and_none_ranks_every_plan():
    """torchtitan's 8-GPU Llama 3.1 8B: under torchtitan the pick is a plan it runs (FSDP,
    DDP or HSDP: no ZeRO-1/2) and no slower than the published configuration; with no
    framework, every plan ranked at the planner's own pricing, the pick is no slower than
    the published configuration priced that way."""
    run = RUNS["8B FSDP 8"]
    _, pick, step = rank_config(run, TORCHTITAN, framework="torchtitan")
    assert blocker("torchtitan", pick) is None
    assert step == pick.step_time <= framework_plan(run, TORCHTITAN)[0].step_time
    _, free, free_step = rank_config(run, TORCHTITAN)
    assert free_step == free.step_time <= predict_config(run, TORCHTITAN).step_time


def _pruning_is_exact(name: str) -> None:
    """Every plan ``rank_config`` ranks the row's configuration among: its step on
    DeepSpeed's engine is never under the planner's (what the pruning assumes), and the
    rank, pick and step are the same with the engine pricing every plan (brute force)."""
    run = RUNS[name]
    mine, plans, step = ranked_plans(run, DEEPSPEED, framework="deepspeed")
    assert len(plans) == 30
    steps = [step(p) for p in plans]
    assert step(mine) >= mine.step_time
    assert all(x >= p.step_time for p, x in zip(plans, steps, strict=True))
    ours = step(mine)
    faster = sum(1 for x in steps if x < ours * (1 - 1e-12))
    best = min(range(len(plans)), key=lambda i: (steps[i], i))
    rank, pick, pick_step = rank_config(run, DEEPSPEED, framework="deepspeed")
    assert rank == (faster + 1 if faster < len(plans) else None)
    assert (pick.config, pick_step) == (plans[best].config, steps[best])


def test_deepspeed_engine_pruning_is_exact_on_neox():
    _pruning_is_exact("20B")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["176B", "530B 2240"])
def test_deepspeed_engine_pruning_is_exact_on_bloom_and_mt_nlg(name):
    _pruning_is_exact(name)
