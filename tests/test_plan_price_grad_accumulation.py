"""A framework that accumulates gradients outside the weight-gradient GEMM (DeepSpeed's BF16
optimizer: a bf16 -> fp32 copy and an fp32 add after every backward, 18 bytes a local
parameter) pays one pass over the layer's parameters per microbatch: in W, nothing else.
"""

from dataclasses import replace

import pytest

from pipebubble.errors import UserError
from pipebubble.plan.compute import Rates
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.network import Network
from pipebubble.plan.parallel_costs import ParallelCosts
from pipebubble.plan.published import published_runs


def _costs(acc: float, b: int = 2) -> object:
    run = next(r for r in published_runs() if r.name == "176B")  # BLOOM's shape
    hw = replace(get_hardware("a100-80gb"), grad_accumulation_bytes=acc)
    return ParallelCosts(run.shape, 2048, Rates.of(hw), Network.of(hw), tp=4,
                         flash=False).at(b, "full"), hw


def test_one_pass_per_microbatch_in_w():
    (plain, hw), (acc, _) = _costs(0.0), _costs(18.0)
    assert (acc.f == plain.f).all() and (acc.i == plain.i).all()
    extra = acc.w - plain.w
    assert extra == pytest.approx(18 * plain.params / hw.hbm_bandwidth, rel=1e-12)
    # per microbatch, not per sequence: the same at microbatch 1 and 2
    one, _ = _costs(18.0, 1)
    one_plain, _ = _costs(0.0, 1)
    assert one.w - one_plain.w == pytest.approx(extra, rel=1e-12)
    # a BLOOM block at TP 4: 616 M local parameters, 18 bytes each at 2,039 GB/s
    assert extra[1] == pytest.approx(18 * 616.6e6 / 2.039e12, rel=1e-3)


def test_negative_is_refused():
    with pytest.raises(UserError, match="grad_accumulation_bytes"):
        get_hardware("a100-80gb", grad_accumulation_bytes=-1.0)


def test_mfu_rates_carry_the_hardware_but_price_no_hbm_time():
    # --mfu: every FLOP at peak x mfu and no HBM time, so the accumulation's bytes (carried
    # like the loss bytes) add nothing; the FLOP rates are the peak's times mfu exactly
    hw = replace(get_hardware("h100-sxm"), grad_accumulation_bytes=18.0)
    r = Rates.of(hw, efficiency=0.9, precision="fp8", mfu=0.4)
    assert r.flat and r.flops == hw.peak_flops * 0.4 and r.fp8_flops == hw.fp8_peak_flops * 0.4
    assert r.grad_accumulation == 18.0 and r.loss_bytes == hw.loss_bytes
    run = next(x for x in published_runs() if x.name == "176B")

    def w(acc: float):
        rates = Rates.of(replace(hw, grad_accumulation_bytes=acc), mfu=0.4)
        return ParallelCosts(run.shape, 2048, rates, Network.of(hw), tp=4,
                             flash=False).at(1, "full").w

    assert (w(18.0) == w(0.0)).all()
