""""chunks" means one thing everywhere: stages per rank per chain.

Schedule.chunks, Timeline.chunks and the registry's ``chunks`` agree for every schedule, so
``get_schedule(name, p, m, s.chunks)`` gives ``s`` back, and costs resolved per stage agree
between the simulator and the 2D (pipeline x data parallel) step time.
"""

import pytest

from pipebubble import CostModel, get_schedule, schedule_names, simulate
from pipebubble.ir.schedule import ScheduleError
from pipebubble.schedules.registry import lookup
from pipebubble.sim.dataparallel import step_time_with_allreduce


def _valid_chunks(name: str) -> list[int]:
    spec = lookup(name)
    return [spec.chunks] if spec.fixed_chunks else list(range(spec.min_chunks, 4))


@pytest.mark.parametrize("name", schedule_names(searched=False))
def test_get_schedule_round_trips_its_chunks(name):
    made = 0
    for p in (1, 2, 3, 4):
        for m in (1, 2, 4, 8, 9):
            for v in _valid_chunks(name):
                try:
                    s = get_schedule(name, p, m, v)
                except ScheduleError:  # e.g. dualpipe needs an even p and m >= 2p
                    continue
                made += 1
                assert s.chunks == v, (name, p, m, v)
                again = get_schedule(name, p, m, s.chunks)
                assert again.orders == s.orders and again.stage_to_rank == s.stage_to_rank
                # stages = ranks x chunks x chains, and the simulated timeline says the same
                assert s.num_stages == p * s.chunks * s.chains
                t = simulate(s)
                assert (t.chunks, t.chains, t.chain_starts) == (s.chunks, s.chains,
                                                                s.chain_starts)
    assert made > 0, name


def test_dualpipe_is_one_chunk_per_rank_per_chain():
    s = get_schedule("dualpipe", 4, 8)
    assert (s.num_stages, s.chains, s.chunks) == (8, 2, 1)
    assert get_schedule("dualpipe", 4, 8, 1).orders == s.orders
    with pytest.raises(ScheduleError, match="exactly 1 chunk"):
        get_schedule("dualpipe", 4, 8, 2)
    # DualPipeV: one chain of 2p stages, two per rank
    v = get_schedule("dualpipev", 4, 8)
    assert (v.num_stages, v.chains, v.chunks) == (8, 1, 2)


def test_dualpipe_step_time_with_allreduce_by_hand():
    # DualPipe p=4, M=8 with F=1, B=2, W=1 per stage (a scalar is one rank's share of one
    # model copy, here one stage): every rank busy 2 stages x 4 mb x 3 = 24 plus a bubble of
    # (p/2 - 1)(F&B + B - 3W) = 2, so every rank ends at 26. Each rank holds one stage of
    # each copy, so it all-reduces two stages' gradients, 1 each: 26 + 2 = 28.
    s = get_schedule("dualpipe", 4, 8)
    c = CostModel(f=1, b=2, w=1, allreduce=1)
    t = simulate(s, c)
    assert t.step_time == 26
    assert step_time_with_allreduce(t, c, dp=2) == 28
    # the same model as 1F1B's: one stage per rank, 33 + 1
    t1 = simulate(get_schedule("1f1b", 4, 8), c)
    assert step_time_with_allreduce(t1, c, dp=2) == 34
    # interleaved with 2 chunks: a stage is half a rank-share, so two stages cost 0.5 + 0.5
    ti = simulate(get_schedule("interleaved-1f1b", 4, 8, 2), c)
    ends = max(ti.end)
    assert step_time_with_allreduce(ti, c, dp=2) == ends + 1
