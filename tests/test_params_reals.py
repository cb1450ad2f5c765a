"""The real numbers the planner prices with (pipebubble.params.REALS, parse_real, parse_size):
every float flag of ``plan`` and ``profile --analytic`` refuses what would overflow the
pricing (a denormal 1e-320, 1e308, inf, nan, a negative) with its valid range in one line and
exit 2; the ends of each range still plan; the library refuses the same values."""

import json

import pytest

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.params import REALS, ParamError, check_real, parse_real, parse_size

LLAMA_TINY = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128,
              "intermediate_size": 344, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 500}
HOSTILE = ("1e-320", "1e308", "inf", "-inf", "nan", "-1")

# (flag, the value at the low end, at the high end) of every float flag of plan
PLAN_FLAGS = {
    "--efficiency": ("0.001", "1"), "--mfu": ("0.001", "1"),
    "--peak-tflops": ("0.001", "1e6"), "--hbm-bandwidth": ("1", "1e18"),
    "--nvlink-bandwidth": ("1", "1e18"), "--inter-node-bandwidth": ("1", "1e18"),
    "--nvlink-latency": ("0", "1e12"), "--inter-node-latency": ("0", "1e12"),
    "--latency": ("0", "1e12"), "--p2p-bandwidth": ("1", "1e18"),
    "--allreduce-bandwidth": ("1", "1e18"), "--gpu-memory": ("1", "1e18"),
    "--bytes-per-param": ("0.001", "1000"), "--grad-bytes": ("0.001", "1000"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("reals")
    cfg = d / "config.json"
    cfg.write_text(json.dumps(LLAMA_TINY))
    out = d / "tiny.json"
    assert main(["profile", "--analytic", "--hf-config", str(cfg), "--seq", "128", "--out",
                 str(out), "--json"]) == 0
    return str(out)


def plan_args(profile: str) -> list[str]:
    return ["plan", "--profile", profile, "--gpus", "2", "--global-batch", "4", "--gpu",
            "h100-sxm", "--schedules", "1f1b", "--mbs", "1", "--sharding", "ddp",
            "--recompute", "none", "--top", "1", "--json"]


@pytest.mark.parametrize("flag", sorted(PLAN_FLAGS))
def test_every_plan_float_flag_refuses_overflow_in_one_line(tiny, capsys, flag):
    r = REALS[flag[2:].replace("-", "_")]  # REALS is by name, the flag is --name
    for text in HOSTILE:
        assert main([*plan_args(tiny), f"{flag}={text}"]) == 2, (flag, text)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        # the range in the message: its two ends, as the user can read them
        assert flag in err and f"[{r.lo:g}, {r.hi:g}]" in err and repr(text) in err, err


@pytest.mark.parametrize("flag", sorted(PLAN_FLAGS))
def test_the_ends_of_each_range_plan(tiny, capsys, flag):
    for text in PLAN_FLAGS[flag]:
        rc = main([*plan_args(tiny), flag, text])
        out, err = capsys.readouterr()
        if flag == "--gpu-memory" and text == "1":  # nothing fits in a byte: one line
            assert rc == 2 and "nothing fits" in err and err.count("\n") == 1
            continue
        assert rc == 0, (flag, text, err)
        plan = json.loads(out)["plans"][0]
        assert 0 < plan["predicted_step_time"] < float("inf")


def test_measured_step_and_profile_rates(tiny, capsys):
    for text in HOSTILE:
        assert main([*plan_args(tiny), "--config", "tp=1,pp=1", f"--measured-step={text}"]) == 2
        assert "--measured-step must be a number in [1e-12, 1e+12] s" in capsys.readouterr().err
        for flag in ("--tflops", "--mfu"):
            other = {"--tflops": ["--mfu", "0.5"], "--mfu": ["--tflops", "100"]}[flag]
            assert main(["profile", "--analytic", "--layers", "2", "--hidden", "64", "--ffn",
                         "128", "--heads", "2", "--vocab", "10", "--seq", "8", f"{flag}={text}",
                         *other]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{flag} must be a number in [" in err


def test_reserve_is_a_size_in_the_memory_range(tiny, capsys):
    assert main([*plan_args(tiny), "--reserve", "1e-320"]) == 2
    assert "--reserve must be a number in [1, 1e+18] bytes" in capsys.readouterr().err


def test_readers_by_hand():
    assert parse_real("0.7", "--efficiency") == 0.7
    assert parse_real("0", "--latency") == 0.0  # a latency may be 0, a bandwidth not
    assert parse_size("50GB/s", "--p2p-bandwidth") == 50e9
    assert parse_size("512MiB", "--gpu-memory") == 512 * 2**20
    with pytest.raises(ParamError, match="--p2p-bandwidth must be a number in"):
        parse_size("0", "--p2p-bandwidth")
    with pytest.raises(ParamError, match="with an optional unit"):
        parse_size("5 parsecs", "--gpu-memory")
    with pytest.raises(ParamError, match=r"in \[0.001, 1\], got 1e-320"):
        check_real(1e-320, "--efficiency")


def test_float_flag_refuses_denormals_everywhere(capsys):
    """The generic reader (--overlap, --lr, timeouts) refuses a denormal too: its reciprocal
    is infinite."""
    assert main(["simulate", "--schedule", "1f1b", "--ranks", "2", "--microbatches", "2",
                 "--overlap", "1e-320"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not denormal" in err


def test_the_library_checks_the_same_ranges():
    from pipebubble.plan.hardware import get_hardware
    from pipebubble.plan.planner import Request

    for field, value in (("efficiency", 1e-320), ("nvlink_latency", 1e308),
                         ("peak_flops", float("inf")), ("hbm_bandwidth", float("nan"))):
        with pytest.raises(UserError, match="must be"):
            get_hardware("h100-sxm", **{field: value})
    with pytest.raises(UserError, match="^latency must be 0 or a number"):
        Request(gpus=2, gpu_memory=2**30, global_batch=4, latency=1e308).check()
    with pytest.raises(UserError, match="^p2p_bandwidth must be a number"):
        Request(gpus=2, gpu_memory=2**30, global_batch=4, p2p_bandwidth=1e-320).check()
