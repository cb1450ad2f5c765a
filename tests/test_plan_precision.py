"""Precision in the planner: the model-state bytes (``--param-bytes``, ``--grad-bytes``,
``--optimizer-bytes``, ``--grad-wire-bytes``, the older ``--bytes-per-param``) and
``--precision bf16|fp8`` (the blocks' GEMMs at the preset's FP8 peak, an FP8 weight copy).

Every number is checked by hand on a tiny LLaMA (2 layers, hidden 128, SwiGLU 344, 4 heads
of 32, 2 K/V heads, vocabulary 500, untied): embedding 500 x 128 = 64,000 parameters, a block
128 x 128 (Q) + 2 x 128 x 64 (K, V) + 128 x 128 (O) + 3 x 128 x 344 (MLP) + 2 x 128 (norms)
= 181,504, the head 128 + 500 x 128 = 64,128: 491,136 in all.
"""

import json

import pytest

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.plan.analytic import TransformerShape
from pipebubble.plan.compute import Rates, attention_time, gemm_time
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.network import Network
from pipebubble.plan.optimizer import step_bytes
from pipebubble.plan.parallel_costs import ParallelCosts
from pipebubble.plan.plans import Request

PARAMS = 64_000 + 2 * 181_504 + 64_128
LLAMA_TINY = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128,
              "intermediate_size": 344, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 500}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision")
    cfg = d / "config.json"
    cfg.write_text(json.dumps(LLAMA_TINY))
    out = d / "tiny.json"
    assert main(["profile", "--analytic", "--hf-config", str(cfg), "--seq", "128", "--out",
                 str(out), "--json"]) == 0
    return str(out)


def plan(tiny, capsys, *extra, sharding="ddp"):
    """One plan on 2 H100s at pp = 1 (every parameter on each rank), as JSON."""
    capsys.readouterr()
    rc = main(["plan", "--profile", tiny, "--gpus", "2", "--global-batch", "4", "--gpu",
               "h100-sxm", "--schedules", "1f1b", "--mbs", "1", "--sharding", sharding,
               "--recompute", "none", "--pp", "1", "--tp", "1", "--top", "1", "--json",
               *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_the_tiny_model_has_the_parameters_counted_by_hand(tiny, capsys):
    mem = plan(tiny, capsys)["plans"][0]["memory"][0]
    assert mem["weights"] == 2 * PARAMS  # the defaults: 2 + 2 + 12
    assert mem["gradients"] == 2 * PARAMS and mem["optimizer"] == 12 * PARAMS


def test_each_state_has_its_own_bytes(tiny, capsys):
    d = plan(tiny, capsys, "--param-bytes", "2", "--grad-bytes", "4", "--optimizer-bytes", "6")
    mem = d["plans"][0]["memory"][0]
    assert (mem["weights"], mem["gradients"], mem["optimizer"]) == (2 * PARAMS, 4 * PARAMS,
                                                                     6 * PARAMS)
    assert d["model_states"] == {"weights": 2, "gradients": 4, "optimizer": 6,
                                 "gradient_wire": 4}  # --grad-bytes given: also the wire's
    # ZeRO-1 over dp = 2 shards the optimizer only: 6 / 2 bytes a parameter
    mem = plan(tiny, capsys, "--optimizer-bytes", "6", sharding="zero1")["plans"][0]["memory"][0]
    assert (mem["weights"], mem["gradients"], mem["optimizer"]) == (2 * PARAMS, 2 * PARAMS,
                                                                     3 * PARAMS)


def test_bf16_adam_states_lower_the_peak_by_six_bytes_a_parameter(tiny, capsys):
    fp32 = plan(tiny, capsys)["plans"][0]
    bf16 = plan(tiny, capsys, "--optimizer-bytes", "6")["plans"][0]
    assert fp32["peak_memory"][0] - bf16["peak_memory"][0] == 6 * PARAMS


def test_the_older_total_and_the_wire_keep_their_meaning(tiny, capsys):
    old = plan(tiny, capsys, "--bytes-per-param", "8")  # 1 + 1 + 6
    assert old["model_states"] == {"weights": 1, "gradients": 1, "optimizer": 6,
                                   "gradient_wire": 4}
    assert old["plans"][0]["memory"][0]["optimizer"] == 6 * PARAMS
    wire = plan(tiny, capsys, "--grad-wire-bytes", "2")["model_states"]
    assert wire == {"weights": 2, "gradients": 2, "optimizer": 12, "gradient_wire": 2}


def test_the_optimizer_step_streams_the_states_given(tiny, capsys):
    """Adam moves 2 g + 2 o + w bytes a parameter over the HBM (optimizer.py)."""
    hbm = get_hardware("h100-sxm").hbm_bandwidth
    for extra, (w, g, o) in (((), (2, 2, 12)), (("--optimizer-bytes", "6"), (2, 2, 6)),
                             (("--precision", "fp8"), (3, 2, 12))):
        p = plan(tiny, capsys, *extra)["plans"][0]
        assert step_bytes(w, g, o) == 2 * g + 2 * o + w
        assert p["optimizer_time"] == pytest.approx(PARAMS * (2 * g + 2 * o + w) / hbm,
                                                    rel=1e-12)


def test_fp8_keeps_an_fp8_copy_of_every_weight(tiny, capsys):
    d = plan(tiny, capsys, "--precision", "fp8")
    mem = d["plans"][0]["memory"][0]
    assert d["precision"] == "fp8" and d["model_states"]["weights"] == 3
    assert mem["weights"] == 3 * PARAMS and mem["optimizer"] == 12 * PARAMS


def test_fp8_runs_the_block_gemms_at_the_fp8_peak(tiny, capsys):
    bf16 = plan(tiny, capsys)["plans"][0]["predicted_step_time"]
    fp8 = plan(tiny, capsys, "--precision", "fp8")["plans"][0]["predicted_step_time"]
    assert fp8 < bf16
    slower = plan(tiny, capsys, "--precision", "fp8", "--fp8-peak-tflops", "100")["plans"][0]
    assert slower["predicted_step_time"] > fp8  # the override reaches the GEMMs


SHAPE = TransformerShape(layers=2, hidden=256, ffn=512, heads=4, vocab=1000, kv_heads=4,
                         swiglu=False)


def block_forward(precision: str, mfu: float = 0.5) -> float:
    """A block's forward under ``--mfu`` (every FLOP at mfu x its peak, no shape curve, no
    HBM time), as the planner builds it."""
    hw = get_hardware("h100-sxm")
    fp8 = hw.fp8_peak_flops * mfu if precision == "fp8" else 0.0
    rates = Rates(hw.peak_flops * mfu, hw.hbm_bandwidth, flat=True, fp8_flops=fp8)
    return ParallelCosts(SHAPE, 64, rates, Network.of(hw)).at(1).f[1]


def test_fp8_forward_is_gemm_flops_at_fp8_plus_attention_at_bf16():
    T, h, f = 64, 256, 512  # one sequence of 64 tokens, GELU MLP, 4 heads of 64
    gemm = 2 * T * (3 * h * h + h * h + 2 * h * f)  # QKV, O, up, down: 2 m n k each
    attention = 4 * T * T * h  # Q K^T and scores x V, counted in full under --mfu
    bf16, fp8 = 989e12 * 0.5, 1979e12 * 0.5
    assert block_forward("bf16") == pytest.approx((gemm + attention) / bf16, rel=1e-12)
    assert block_forward("fp8") == pytest.approx(gemm / fp8 + attention / bf16, rel=1e-12)


def test_fp8_gemm_rate_and_operand_bytes():
    hw = get_hardware("h100-sxm")
    b, e = Rates.of(hw, 0.7), Rates.of(hw, 0.7, "fp8")
    big = 8192
    assert e.fp8_flops == 1979e12 * 0.7 and b.fp8_flops == 0
    assert gemm_time(big, big, big, b) / gemm_time(big, big, big, e, fp8=True) == \
        pytest.approx(1979 / 989, rel=1e-12)
    # a one-token GEMM is HBM-bound: 1-byte operands, a 16-bit result
    m, n, k = 1, 8192, 8192
    assert gemm_time(m, n, k, e, fp8=True) == (m * k + k * n + 2 * m * n) / hw.hbm_bandwidth
    assert gemm_time(m, n, k, b) == 2 * (m * k + k * n + m * n) / hw.hbm_bandwidth
    # attention is not a block GEMM: the same in both
    assert attention_time(1024, 1024, 512, e, flash=False) == attention_time(1024, 1024, 512, b,
                                                                           flash=False)


def test_fp8_leaves_the_head_and_embedding_in_bf16():
    hw = get_hardware("h100-sxm")
    net = Network.of(hw)
    b = ParallelCosts(SHAPE, 64, Rates.of(hw), net).at(1)
    e = ParallelCosts(SHAPE, 64, Rates.of(hw, precision="fp8"), net).at(1)
    for field in ("f", "i", "w"):
        assert getattr(e, field)[0] == getattr(b, field)[0]
        assert getattr(e, field)[-1] == getattr(b, field)[-1]
        assert getattr(e, field)[1] < getattr(b, field)[1]


def test_presets_carry_fp8_peaks():
    for name, tflops in (("h100-sxm", 1979), ("h200", 1979), ("b200", 4500), ("mi300x", 2615),
                         ("a100-80gb", 0), ("a100-40gb", 0)):
        assert get_hardware(name).fp8_peak_flops == tflops * 1e12


def one_line_error(capsys, args, *words):
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_bad_input_is_one_line(tiny, capsys):
    base = ["plan", "--profile", tiny, "--gpus", "2", "--global-batch", "4", "--gpu",
            "h100-sxm", "--top", "1"]
    one_line_error(capsys, [*base, "--precision", "fp16"], "--precision", "bf16, fp8")
    one_line_error(capsys, [*base[:-3], "a100-80gb", "--precision", "fp8"],
                   "a100-80gb has no FP8 tensor cores")
    for flag in ("--param-bytes", "--grad-bytes", "--optimizer-bytes", "--grad-wire-bytes"):
        for bad in ("0", "-2", "nan", "inf"):
            one_line_error(capsys, [*base, f"{flag}={bad}"], flag, repr(bad))
    one_line_error(capsys, [*base, "--bytes-per-param", "16", "--optimizer-bytes", "6"],
                   "--bytes-per-param", "--optimizer-bytes")
    one_line_error(capsys, [*base, "--fp8-peak-tflops", "0"], "--fp8-peak-tflops")


def test_fp8_needs_a_shape_to_price(tmp_path, capsys):
    prof = tmp_path / "measured.json"
    layer = {"forward": 1e-3, "backward": 2e-3, "params": 10, "activation_bytes": 100,
             "flops": 0}
    prof.write_text(json.dumps({"batch": 1, "layers": [dict(layer, name=str(i))
                                                       for i in range(4)]}))
    one_line_error(capsys, ["plan", "--profile", str(prof), "--gpus", "2", "--global-batch",
                            "4", "--precision", "fp8"], "--precision fp8", "--gpu")


def test_the_library_refuses_the_same():
    for states in ((0.0, 2.0, 12.0), (2.0, float("nan"), 12.0), (2.0, 2.0, -6.0)):
        with pytest.raises(UserError, match="must be a finite number of bytes > 0"):
            Request(gpus=2, gpu_memory=1e9, global_batch=4, state_bytes=states).check()
    with pytest.raises(UserError, match="valid are bf16, fp8"):
        Request(gpus=2, gpu_memory=1e9, global_batch=4, precision="int8").check()
