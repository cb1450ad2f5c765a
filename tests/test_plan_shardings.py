"""The Sharding type (plan/shardings.py): each member's facts against the ZeRO paper's table
(Rajbhandari et al. 2020: 16, 4 + 12/N, 2 + 14/N, 16/N bytes a parameter), how it splits dp,
what it sends, and one-line errors for an unknown name."""

import json

import pytest

from pipebubble.commands._flags import render
from pipebubble.errors import UserError
from pipebubble.plan.memory import model_state_bytes
from pipebubble.plan.network import Network
from pipebubble.plan.optimizer import updated_share
from pipebubble.plan.sharding import Sync
from pipebubble.plan.shardings import SHARDINGS, Sharding, hsdp_shard


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_state_bytes_are_the_zero_table(n):
    assert Sharding.DDP.state_bytes(n) == 16
    assert Sharding.ZERO1.state_bytes(n) == 4 + 12 / n
    assert Sharding.ZERO2.state_bytes(n) == 2 + 14 / n
    assert Sharding.FSDP.state_bytes(n) == Sharding.HSDP.state_bytes(n) == 16 / n
    assert Sharding.FSDP.state_bytes(n, keep=True) == 4 + 12 / n  # reshard never: kept
    for s in SHARDINGS:  # memory.py reads the member
        assert model_state_bytes(s, n) == Sharding(s).state_bytes(n)


def test_sharded_states_agree_with_the_bytes():
    """The per-state flags give the same bytes as the table, for any w, g, o."""
    w, g, o, n = 2.0, 4.0, 12.0, 8
    for s in Sharding:
        for keep in (False, True):
            flags = s.sharded(keep)
            total = sum(x / (n if f else 1) for x, f in zip((w, g, o), flags, strict=True))
            assert total == pytest.approx(s.state_bytes(n, w, g, o, keep))
    assert [s.sharded() for s in Sharding] == [
        (False, False, False), (False, False, True), (False, True, True), (True, True, True),
        (True, True, True)]


def test_optimizer_share():
    assert updated_share("ddp", 8) == 1.0
    assert updated_share("zero1", 8) == updated_share("fsdp", 8) == 1 / 8


def test_split_dp():
    assert Sharding.DDP.split_dp(8, 1, 8) == (8, 1)
    assert Sharding.ZERO1.split_dp(8, 1, 8) == Sharding.FSDP.split_dp(8, 1, 8) == (1, 8)
    assert Sharding.HSDP.split_dp(32, 2, 8) == (8, 4)  # tp 2: 4 shards fit a node
    assert Sharding.HSDP.split_dp(8, 1, 8) == (8, 1)  # the group would be all of dp
    assert hsdp_shard(12, 1, 8) == 6 and hsdp_shard(7, 1, 8) == 0


def test_traffic_per_member():
    """Once a step over 4 ranks on a 1 GB/s link, 1 M parameters, 4-byte gradients: ddp
    all-reduces 2 x 3/4 x 4 MB; zero and fsdp (kept) gather 3/4 x 2 MB and reduce-scatter
    3/4 x 4 MB; fsdp resharded always moves its traffic per microbatch instead."""
    net = Network.flat(1e9, 0.0)
    assert Sync("ddp", net, 4).times(1e6, 1) == (0.0, 0.006)
    for s in ("zero1", "zero2", "fsdp"):
        assert Sync(s, net, 4).times(1e6, 1) == (0.0015, 0.003)
    always = Sync(Sharding.FSDP, net, 4, reshard="always")
    assert always.per_microbatch and always.times(1e6, 1) == (0.0, 0.0)
    assert always.layer_traffic(1e6) == (0.0015, 0.003)
    assert not Sync("zero2", net, 4, reshard="always").per_microbatch


def test_names():
    assert Sharding.of(" FSDP ") is Sharding.FSDP and Sharding.FSDP == "fsdp"
    assert json.dumps({"s": Sharding.ZERO2}) == '{"s": "zero2"}' and f"{Sharding.HSDP}" == "hsdp"
    assert [s.label for s in Sharding] == ["DDP", "ZeRO-1", "ZeRO-2", "FSDP", "HSDP"]
    with pytest.raises(UserError, match=r"^unknown sharding 'zero3'; valid are ddp, zero1, "
                                        r"zero2, fsdp, hsdp$") as info:
        Sharding.of("zero3")
    assert render(info.value).startswith("unknown --sharding 'zero3'")  # the CLI's words
    with pytest.raises(UserError, match="unknown sharding 'x'"):
        Sync("x", Network.flat(1e9, 0.0), 2)
