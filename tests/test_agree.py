"""``runtime/dist/agree.py``: rank 0 builds a searched schedule, the others read its order
from the store (a torch HashStore here: the same calls as the run's TCPStore)."""

import threading

import pytest

torch = pytest.importorskip("torch")

from pipebubble import CostModel, get_schedule  # noqa: E402
from pipebubble.ir.schedule import ScheduleError  # noqa: E402
from pipebubble.runtime.dist.agree import (  # noqa: E402
    agreed_schedule,
    schedule_from_json,
    schedule_to_json,
)
from pipebubble.runtime.dist.watchdog import publish_failure  # noqa: E402


def test_round_trip_keeps_pairs_chains_and_placement():
    for name in ("dualpipe", "zbv", "interleaved-1f1b"):
        s = get_schedule(name, 4, 8)
        back = schedule_from_json(schedule_to_json(s))
        assert (back.orders, back.stage_to_rank, back.chain_starts, back.num_microbatches) == (
            s.orders, s.stage_to_rank, s.chain_starts, s.num_microbatches)


def test_only_rank_0_searches_and_every_rank_gets_its_order():
    store = torch.distributed.HashStore()
    calls = []

    def search():
        calls.append(1)
        return get_schedule("auto", 3, 4, costs=CostModel(f=1, b=2, w=1), memory_limit=3)

    got = {}
    others = [threading.Thread(target=lambda r=r: got.__setitem__(
        r, agreed_schedule(store, r, search, timeout=30))) for r in (1, 2)]
    for t in others:
        t.start()
    got[0] = agreed_schedule(store, 0, search)
    for t in others:
        t.join()
    assert calls == [1]
    assert got[1].orders == got[2].orders == got[0].orders


def test_a_failed_search_stops_the_waiting_ranks():
    store = torch.distributed.HashStore()
    publish_failure(store, "rank 0: ScheduleError: --memory-limit 0.5 is below ...")
    with pytest.raises(ScheduleError, match="rank 0 could not make the schedule"):
        agreed_schedule(store, 1, lambda: None, timeout=5)
    with pytest.raises(ScheduleError, match="did not publish"):
        agreed_schedule(torch.distributed.HashStore(), 1, lambda: None, timeout=0.2)
