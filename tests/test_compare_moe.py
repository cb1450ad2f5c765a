"""``compare --profile`` on an MoE model: DualPipe's overlapped pairs hide the expert
all-to-all that every other schedule waits for, so it wins there, and not on a dense model
(nor on the MoE model without expert parallelism, where there is nothing to hide)."""

import json

import pytest

from pipebubble.cli import main
from pipebubble.plan.hfconfig import shape_from_hf
from pipebubble.plan.moe import moe_profile
from pipebubble.plan.moe_costs import profile_costs
from pipebubble.plan.profile import Profile
from test_moe_shapes import DEEPSEEK_V3

PAIRED = ("dualpipe", "dualpipev")
LONE = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """DeepSeek-V3 (analytic, H800-like 989 TFLOP/s at 40 %) and a dense model of its width."""
    where = tmp_path_factory.mktemp("profiles")
    moe = where / "moe.json"
    shape, _ = shape_from_hf(DEEPSEEK_V3)
    moe_profile(shape, seq=4096, batch=1, tflops=989, mfu=0.4).save(moe)
    dense = where / "dense.json"
    assert main(["profile", "--analytic", "--layers", "61", "--hidden", "7168", "--ffn",
                 "18432", "--heads", "128", "--vocab", "129280", "--seq", "4096", "--tflops",
                 "989", "--mfu", "0.4", "--out", str(dense)]) == 0
    return moe, dense


def steps(capsys, *flags) -> dict[str, float]:
    capsys.readouterr()
    assert main(["compare", "-p", "4", "-m", "8", *flags, "--json"]) == 0
    return {row["schedule"]: row["step_time"] for row in json.loads(capsys.readouterr().out)}


def test_dualpipe_wins_on_moe_with_expert_parallelism_and_not_on_dense(profiles, capsys):
    moe, dense = profiles
    ep = steps(capsys, "--profile", str(moe), "--ep", "64", "--ep-bandwidth", "50GB")
    assert max(ep[n] for n in PAIRED) < min(ep[n] for n in LONE)
    for without in (steps(capsys, "--profile", str(moe)), steps(capsys, "--profile",
                                                                  str(dense))):
        assert without["zbv"] < min(without[n] for n in PAIRED)
    # what the all-to-all costs each: 1F1B pays all of it, DualPipe much less
    no_ep = steps(capsys, "--profile", str(moe))
    assert ep["dualpipe"] - no_ep["dualpipe"] < 0.6 * (ep["1f1b"] - no_ep["1f1b"])


def test_the_profile_costs_are_the_layer_sums_over_the_ranks(profiles):
    """f = (forward + 2 all-to-alls per MoE layer) / p, each all-to-all moving
    all_to_all_bytes x (EP - 1)/EP at the bandwidth; a2a_b likewise; dense layers none."""
    prof = Profile.load(profiles[0])
    got = profile_costs(prof, 4, ep=8, bandwidth=50e9)
    one = [layer.extra.get("all_to_all_bytes", 0.0) * 7 / 8 / 50e9 for layer in prof.layers]
    assert got["a2a_f"] == pytest.approx(sum(2 * x for x in one) / 4, rel=1e-12)
    assert got["a2a_b"] == got["a2a_f"]
    assert got["f"] == pytest.approx((sum(prof.column("forward")) + 4 * got["a2a_f"]) / 4,
                                     rel=1e-12)
    assert prof.layers[1].extra["all_to_all_bytes"] == 0  # DeepSeek-V3's first dense layers
    alone = profile_costs(prof, 4)  # no expert parallelism: no all-to-all, compute only
    assert alone["a2a_f"] == alone["a2a_b"] == 0.0
    assert alone["f"] == pytest.approx(sum(prof.column("forward")) / 4, rel=1e-12)


@pytest.mark.parametrize("flags, words", [
    (["--ep", "8"], "give --ep-bandwidth"),
    (["--f", "2"], "--profile gives the times; drop --f"),
    (["--ep", "8", "--ep-bandwidth", "0"], "--ep-bandwidth must be"),
])
def test_bad_profile_flags_are_one_line(profiles, capsys, flags, words):
    capsys.readouterr()
    try:
        code = main(["compare", "-p", "4", "-m", "8", "--profile", str(profiles[0]), *flags])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err


def test_a_measured_profile_may_carry_its_all_to_all_seconds():
    layer = {"name": "moe", "forward": 1.0, "backward": 2.0, "weight_backward": 1.0,
             "params": 1, "activation_bytes": 1, "flops": 1, "all_to_all_forward": 0.4,
             "all_to_all_backward": 0.5}
    prof = Profile.from_dict({"layers": [layer]})
    assert profile_costs(prof, 2) == {"f": 0.5, "b": 1.0, "w": 0.5, "a2a_f": 0.2,
                                      "a2a_b": 0.25}
    too_much = Profile.from_dict({"layers": [{**layer, "all_to_all_backward": 1.5}]})
    with pytest.raises(Exception, match="all_to_all_backward 1.5 s is more than its "
                                        "backward less W, 1 s"):
        profile_costs(too_much, 2)
