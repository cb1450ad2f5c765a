"""The planner against published runs beyond Megatron-LM's SC'21 Table 1 (the data and the
sources are in pipebubble.plan.published; bench/bench_published.py prints the table).

One efficiency per GPU, fitted here once: A100 on Table 1's 18.4B row (as
tests/test_plan_megatron.py), H100 on the Llama 3 16,384-GPU 8K row; everything else is
predicted at its published configuration (``plan --config``'s path, no full searches).

Tolerances, and why:

- 5 % where the planner models what the run did (Korthikanti et al.'s 175B / 530B / 1T,
  Llama 3's 128K row and, at the physical memory, its 8,192-GPU row): the same band as
  Table 1 (whose errors are within 4 %), since the sources round their throughput to 2-3
  digits and give no error bars.
- 7 % for Korthikanti et al.'s per-layer times (Table 4): one layer, no averaging over a
  pipeline; the backward is the part the model prices least directly (the overlap of TP
  collectives with weight gradients).
- Every published configuration ran, so it is priced against the GPU's physical memory (no
  reserve); whether it also fits the planner's default 5 % reserve is reported and checked
  beside it. Llama 3 on 8,192 GPUs is where that matters: at the paper's layout (one block a
  chunk, v = 8) the interleaved schedule needs 76.5 GiB on rank 1, under the H100's 79.65
  GiB and over the 75.67 left by the reserve; at the physical memory it is within 5 %, under
  the reserve the planner falls back to 1F1B (33 % bubble) and misses by more than 20 %.
- Known misses, asserted as what they are, with their cause checked: the 22B row (one
  microbatch, pp 1: what surrounds the blocks shows in full; with the optimizer step priced
  it is over-predicted by about 10 %, asserted within 12 %; Table 4's own layer times sum to
  0.97 of the 1.10 s step); BLOOM (over-predicted, within 7 %: with DeepSpeed's BF16 optimizer
  accumulating every microbatch's gradients into fp32 priced and DeepSpeed's engine priced,
  +2 %; ALiBi's extra score traffic and the cross-entropy's fp32 passes over a 250,880
  vocabulary are not, see the README); MT-NLG 530B (over-predicted by 20-30 %, asserted
  within 15-35 %: the same model on the same machine ran at 163 TFLOP/s under Megatron-LM
  (Table 1, predicted within 1 %) and at 113-126 under DeepSpeed's 1F1B pipeline engine,
  whose sourced costs (blocking P2P, the reduction after the flush) are priced and move it
  about 1 point; the cause is not identified; the 1F1B bubble is priced, and the slowdown
  from 2,240 to 3,360 GPUs is checked within 5 %); GPT-NeoX-20B (the same engine, fp16,
  over-predicted by 20 %, asserted within 15-35 %); torchtitan (a 500 W HBM2e H100 in eager
  mode, not the preset: only the ratio between 8 and 128 GPUs is checked, within 5 %).
"""

from dataclasses import replace

import pytest

from pipebubble.costs import CostModel
from pipebubble.plan import frameworks as F
from pipebubble.plan.deepspeed import deepspeed_lowering
from pipebubble.plan.fit import fit_efficiency
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.published import (
    A100_PEAK,
    FRAMEWORK_FITS,
    H100_CALIBRATION,
    H100_PEAK,
    RESERVE,
    TABLE1,
    Row,
    engine_step,
    fits_by_candidate,
    korthikanti_flops,
    layer_times,
    llama_flops,
    memory_of,
    predict_config,
    predict_row,
    predict_runs,
    published_runs,
)
from pipebubble.schedules import get_schedule
from pipebubble.sim.wire import lower, pair_order_mismatches, run_wire

pytestmark = pytest.mark.slow  # long searches and fits: `make test-heavy`

RUNS = {r.name: r for r in published_runs()}


@pytest.fixture(scope="module")
def efficiency():
    cal = next(r for r in TABLE1 if r.name == "18.4B")
    hw = get_hardware("a100-80gb")
    a100 = fit_efficiency(lambda e: predict_row(cal, hw, e).step_time, cal.step_time(), 1e-5)
    # The H100 fit with the plan's searched choices (sp, mbs, schedule, v) pinned at what the
    # preset's efficiency picks, so each bisection step prices one configuration; that the
    # unpinned search agrees is checked by test_efficiencies_are_fitted_once.
    h = RUNS[H100_CALIBRATION]
    first = predict_config(h, get_hardware("h100-sxm").efficiency)
    pinned = replace(h, config=h.config + f",sp={int(first.sp)},mbs={first.microbatch_size},"
                     f"schedule={first.schedule},v={first.chunks}")
    h100 = fit_efficiency(lambda e: predict_config(pinned, e).step_time, h.step, 1e-5)
    return {"a100-80gb": a100, "h100-sxm": h100}


@pytest.fixture(scope="module")
def rows(efficiency):
    return {r["model"]: r for r in predict_runs(efficiencies=efficiency)[1]}


def test_published_steps_agree_with_the_sources_other_numbers():
    """Each published step, derived from the source's headline metric, against the other
    numbers the same source gives."""
    # Korthikanti et al. Table 5 gives the iteration times beside the MFU.
    for name, seconds in (("22B", 1.10), ("175B", 13.75), ("530B", 37.83), ("1T", 71.49)):
        r = RUNS[name]
        assert r.step == pytest.approx(seconds, rel=0.005)
        assert r.step == pytest.approx(korthikanti_flops(r.shape, 2048, r.batch)
                                       / (r.published * r.gpus * A100_PEAK))
    # BLOOM: 176,247M parameters; its TFLOP/s are hardware FLOPs (4/3 of model FLOPs with
    # full recomputation): 149.77 at 104.70 s.
    bloom = RUNS["176B"]
    assert bloom.shape.total_params() == 176_247_242_752
    hw_flops = korthikanti_flops(bloom.shape, 2048, 2048) * 4 / 3
    assert hw_flops / (bloom.step * 384) / 1e12 == pytest.approx(149.77, rel=0.01)
    # MT-NLG section 2.4: 126 / 121 / 113 TFLOP/s at 60.1 / 50.2 / 44.4 s are Megatron-LM's
    # eq. 3 (with recomputation) on 2,240 / 2,800 / 3,360 GPUs, global batch 1920; DP is the
    # rest of TP 8 x PP 35.
    for gpus, seconds in ((2240, 60.1), (2800, 50.2), (3360, 44.4)):
        r = RUNS[f"530B {gpus}"]
        eq3 = Row("530B", 128, 20480, 105, 8, 35, gpus, 1920, r.published)
        assert r.step == seconds and eq3.dp == gpus // 280
        assert eq3.step_time() == pytest.approx(seconds, rel=0.01)
        assert f"dp={eq3.dp}," in r.config and r.shape.total_params() == pytest.approx(
            530e9, rel=0.01)
    # GPT-NeoX-20B: configs/20B.yml's microbatch 4 x 32 accumulation steps x DP 12 = 1536
    # sequences; the model card's 20,556,201,984 parameters (the shape's count is within
    # 0.01 %: it omits no matrix); 117 TFLOP/s by gpt-neox's get_flops of the time (model
    # FLOPs, B s (6 N + 60 s h L); tests/test_plan_deepspeed.py checks it by hand).
    neox = RUNS["20B"]
    assert neox.batch == 4 * 32 * 12 and "dp=12," in neox.config and "pp=4," in neox.config
    assert neox.shape.total_params() == pytest.approx(20_556_201_984, rel=1e-4)
    count = 1536 * 2048 * (6 * 20_556_201_984 + 60 * 2048 * 6144 * 44)
    assert count / (neox.step * 96) / 1e12 == pytest.approx(117)
    # Llama 3: TP x CP x PP x DP = GPUs, 16M tokens a step, MFU = TFLOP/s / 989 (43/41/38 %).
    for name, mfu in (("405B 8K 8k", 0.43), ("405B 8K 16k", 0.41), ("405B 128K 16k", 0.38)):
        r = RUNS[name]
        deg = dict(kv.split("=") for kv in r.config.split(",") if kv.split("=")[0] in
                   ("tp", "cp", "pp", "dp"))
        assert int(deg["tp"]) * int(deg["cp"]) * int(deg["pp"]) * int(deg["dp"]) == r.gpus
        assert r.batch * r.seq == pytest.approx(16 * 2**20, rel=0.05)
        assert r.published * 1e12 / H100_PEAK == pytest.approx(mfu, abs=0.01)
        assert r.step == pytest.approx(llama_flops(r.shape, r.seq, r.batch)
                                       / (r.published * 1e12 * r.gpus))


def test_efficiencies_are_fitted_once(efficiency, rows):
    assert 0.5 < efficiency["h100-sxm"] < efficiency["a100-80gb"] < 1.0
    assert abs(rows[H100_CALIBRATION]["error"]) < 1e-4  # fitted to 1e-5 in the efficiency


@pytest.mark.parametrize("name", ["175B", "530B", "1T", "405B 128K 16k", "405B 8K 8k"])
def test_modelled_runs_within_5_percent(rows, name):
    assert abs(rows[name]["error"]) < 0.05, rows[name]
    assert rows[name]["fits"]


def test_published_configs_priced_at_the_physical_memory(rows):
    """Each row's plan fits the GPU (torchtitan's 8-GPU row too, its op-level SAC priced as
    recompute op), and the reserve column is the plan's peak against 95 % of it."""
    for name, r in rows.items():
        run = RUNS[name]
        assert r["physical"] == memory_of(run)
        assert r["need"] == max(r["plan"].peak_memory)
        assert r["fits"] == (r["need"] <= r["physical"])
        assert r["fits"]
        assert r["fits_reserve"] == (r["need"] <= (1 - RESERVE) * r["physical"])
        if r["fits_reserve"]:  # a plan within the reserve is also the reserve's plan
            assert r["reserve_plan"].step_time == pytest.approx(r["plan"].step_time, rel=1e-9)
    assert [n for n, r in rows.items() if r["fits"] and not r["fits_reserve"]] == ["405B 8K 8k"]


def test_llama3_8k_fits_the_gpu_not_the_reserve(rows):
    """The published interleaved configuration at the paper's layout: 76.5 GiB on rank 1,
    over the reserve's 75.67 GiB and under the H100's 79.65. Under the reserve the planner
    prices 1F1B (33 % bubble) and misses by 27 %; at the physical memory, within 1 %."""
    r = rows["405B 8K 8k"]
    gib = 2**30
    assert r["physical"] / gib == pytest.approx(79.65, abs=0.01)
    assert r["reserve_budget"] / gib == pytest.approx(75.67, abs=0.01)
    assert 76.4 < r["need"] / gib < 76.6
    assert r["fits"] and not r["fits_reserve"]
    p = r["plan"]
    assert (p.schedule, p.chunks, p.microbatch_size) == ("interleaved-1f1b", 8, 1)
    assert p.ranges[0] == (0, 0) and p.ranges[-1] == (127, 127)  # the paper's layout
    assert abs(r["error"]) < 0.01
    t = r["reserve_plan"]
    assert t.schedule == "1f1b" and r["reserve_plan_fits"]
    assert max(t.peak_memory) <= r["reserve_budget"]
    assert t.bubble_fraction > 0.3 and r["reserve_error"] < -0.2


def test_korthikanti_per_layer_times(efficiency):
    got = layer_times(efficiency["a100-80gb"])
    for r in got:
        assert abs(r["error"]) < 0.07, r
        assert r["predicted_forward"] == pytest.approx(r["forward"], rel=0.05)
    by = {r["technique"]: r for r in got}
    # What the paper shows, predicted: sequence parallelism speeds the forward; selective
    # recomputation costs far less than full.
    assert by["sequence parallel"]["predicted_forward"] < by["baseline (no recompute)"][
        "predicted_forward"]
    extra = lambda k: by[k]["predicted_backward"] - by["baseline (no recompute)"][  # noqa: E731
        "predicted_backward"]
    assert 0 < extra("selective recompute") < extra("full recompute") / 4
    # Without the overlap of the backward's TP collectives the backward is ~20 % high.
    bare = {r["technique"]: r for r in layer_times(efficiency["a100-80gb"], tp_overlap=False)}
    assert bare["baseline (no recompute)"]["predicted_backward"] > 1.15 * 11.9


def test_known_misses_have_the_named_causes(efficiency, rows):
    assert 0 < rows["22B"]["error"] < 0.12
    assert 0 < rows["176B"]["error"] < 0.07
    # MT-NLG 530B: DeepSpeed's 1F1B engine, slower than the planner prices it at Megatron-LM's
    # A100 efficiency; the bubble is priced (240 / 192 / 160 microbatches over 35 stages) and
    # the slowdown from 2,240 to 3,360 GPUs is within 5 %.
    mt = [rows[f"530B {g}"] for g in (2240, 2800, 3360)]
    for r in mt:
        assert 0.15 < r["error"] < 0.35, r
        assert r["plan"].schedule == "1f1b" and r["plan"].recompute == "full"
        assert r["plan"].bubble_fraction > 0.15
    assert mt[0]["error"] < mt[1]["error"] < mt[2]["error"]
    published = RUNS["530B 2240"].step / RUNS["530B 3360"].step
    assert mt[0]["plan"].step_time / mt[2]["plan"].step_time == pytest.approx(published,
                                                                            rel=0.05)
    # GPT-NeoX-20B at the A100 Megatron-LM fit (the planner's pricing): over-predicted by
    # about 13 % (-8 % in step at DeepSpeed's own fit: test_deepspeed_fit_predicts_neox).
    neox = rows["20B"]
    assert 0.08 < neox["error"] < 0.2, neox
    assert (neox["plan"].microbatches, neox["plan"].recompute) == (32, "full")
    # torchtitan: over-predicted (another GPU), but the 8 -> 128 GPU scaling is right.
    t1, t3 = rows["8B FSDP 8"], rows["8B FSDP 128"]
    assert t1["error"] > 0 and t3["error"] > 0
    assert (t3["predicted"] / t1["predicted"]) == pytest.approx(5605 / 5762, rel=0.05)


def test_tp_overlap_at_16k_gpus_helps_only_the_fused_backward(efficiency):
    """Llama 3 405B on 16,384 GPUs, 8K: the backward's TP collectives hide behind the weight
    gradients only where W runs in the same pass (plan/tensor.py). So for ZBV (W deferred)
    ``tp_overlap`` changes nothing, at TP 4 or 8; for the interleaved schedule (B fused) it
    shortens the step, more at TP 8 (larger collectives behind the same GEMMs' share). Either
    ZBV plan beats the published TP 8 / PP 16 / DP 128 by its bubble: 16 microbatches per
    pipeline against 128-256."""
    run = RUNS["405B 8K 16k"]
    e = efficiency["h100-sxm"]

    def step(config, overlap):
        r = replace(run, config=config, search=(("schedules", ("zbv", "interleaved-1f1b")),),
                    hardware=(("tp_overlap", overlap),))
        return predict_config(r, e)

    zbv4 = "tp=4,sp=1,cp=4,pp=64,dp=16,sharding=zero1,mbs=1,recompute=none,schedule=zbv,v=2"
    zbv8 = "tp=8,sp=1,cp=4,pp=64,dp=8,sharding=zero1,mbs=1,recompute=none,schedule=zbv,v=2"
    il4, il8 = (c.replace("schedule=zbv,v=2", "schedule=interleaved-1f1b") for c in (zbv4, zbv8))
    for c in (zbv4, zbv8):
        assert step(c, True).step_time == pytest.approx(step(c, False).step_time, rel=1e-9)
    gain4 = step(il4, False).step_time - step(il4, True).step_time
    gain8 = step(il8, False).step_time - step(il8, True).step_time
    assert gain8 > gain4 > 0
    published = run.config + ",sp=1,mbs=1,schedule=interleaved-1f1b,v=4"
    pub = step(published, True)
    for c in (zbv4, zbv8):
        pick = step(c, True)
        assert pick.step_time < pub.step_time
        assert pub.bubble_fraction - pick.bubble_fraction > 0.05
        assert pick.microbatches == 2048 // pick.dp  # 128 or 256
    assert pub.microbatches == 2048 // 128


def _train_schedule(p: int, m: int, s: int) -> list[str]:
    """Stage ``s``'s program by DeepSpeed's ``TrainSchedule`` (runtime/pipe/schedule.py):
    ``2 (m + p - 1)`` steps; on a step of the stage's parity it forwards microbatch
    ``step // 2 - s // 2``, on the others it backwards ``(step - 1) // 2 - p + 1 + s // 2``
    (even stages) or ``step // 2 - p + (s + 1) // 2`` (odd); a forward step is
    SendGrad(previous), RecvActivation(this), a backward step RecvGrad(this),
    SendActivation(previous), each only towards a stage that exists, and only for a valid
    microbatch. In the text form of ``pipebubble.sim.wire``."""
    out, prev = [], -1
    for t in range(2 * (m + p - 1)):
        fwd = t % 2 == s % 2
        mb = (t // 2 - s // 2 if fwd else
              (t - 1) // 2 - p + 1 + s // 2 if s % 2 == 0 else t // 2 - p + (s + 1) // 2)
        ok, was = 0 <= mb < m, 0 <= prev < m
        if fwd and s > 0:
            out += [f"{s}SEND_B{prev}"] * was + [f"{s}RECV_F{mb}"] * ok
        if not fwd and s < p - 1:
            out += [f"{s}RECV_B{mb}"] * ok + [f"{s}SEND_F{prev}"] * was
        out += [f"{s}{'F' if fwd else 'B'}{mb}"] * ok
        prev = mb
    return out


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (3, 7), (4, 8), (5, 3), (6, 12)])
def test_deepspeed_lowering_is_its_train_schedule(p, m):
    """The lowering of 1F1B in DeepSpeed's order is, rank by rank, the program DeepSpeed's
    TrainSchedule issues (compute order and every send / receive in place); its rank pairs
    send and receive in the same order (NCCL-safe) and it runs to the end with blocking
    P2P."""
    wired = deepspeed_lowering(get_schedule("1f1b", ranks=p, microbatches=m))
    for s, line in enumerate(wired.to_text().splitlines()):
        assert line.split() == _train_schedule(p, m, s)
    assert pair_order_mismatches(wired) == []
    assert run_wire(wired, CostModel(f=1, b=2, comm=0.1), blocking=True).timeline.step_time > 0


@pytest.mark.parametrize("p,m", [(4, 8), (5, 16)])
def test_deepspeed_blocking_p2p_costs_only_the_wire(p, m):
    """Without message time DeepSpeed's blocking order runs 1F1B's closed form
    ``(m + p - 1)(F + B)``; with it, never faster than the planner's batched, buffered wire
    (which is the planner's own timeline) and slower by less than the serialised messages,
    four per microbatch and stage: ``4 (m + p - 1) comm``."""
    sched = get_schedule("1f1b", ranks=p, microbatches=m)
    free = run_wire(deepspeed_lowering(sched), CostModel(f=1, b=2, comm=0.0), blocking=True)
    assert free.timeline.step_time == pytest.approx((m + p - 1) * 3)
    c = 0.05
    slow = run_wire(deepspeed_lowering(sched), CostModel(f=1, b=2, comm=c), blocking=True)
    fast = run_wire(lower(sched, "batched"), CostModel(f=1, b=2, comm=c), blocking=False)
    extra = slow.timeline.step_time - fast.timeline.step_time
    assert 0 < extra < 4 * (m + p - 1) * c


def test_deepspeed_engine_prices_every_deepspeed_run(rows):
    """``engine="deepspeed"`` is on every run made with DeepSpeed's pipeline engine (MT-NLG,
    GPT-NeoX-20B, BLOOM) and on no other; it only adds (blocking P2P, the data-parallel
    reduction after the flush), and the other rows are priced as the planner prices them."""
    ds = {n for n, r in rows.items() if r["engine"] == "deepspeed"}
    assert ds == {"530B 2240", "530B 2800", "530B 3360", "20B", "176B"}
    for name, r in rows.items():
        if name in ds:
            assert r["step"] > r["plan"].step_time
            assert r["error"] < r["planner_error"]
        else:
            assert r["step"] == r["plan"].step_time and r["error"] == r["planner_error"]


def test_unknown_engine_is_named():
    with pytest.raises(ValueError, match="unknown engine 'megatron-x'.*valid are '', 'deepspeed'"):
        engine_step(replace(RUNS["20B"], engine="megatron-x"), None, 0.7)


@pytest.fixture(scope="module")
def framework_rows():
    """Each run at its (GPU, framework) fit, priced under its framework (bench_frameworks)."""
    eff, got = predict_runs(by_framework=True)
    return eff, {r["model"]: r for r in got}


def test_deepspeed_fit_predicts_every_other_deepspeed_run_within_10_percent(framework_rows):
    """At DeepSpeed's A100 fit (GPT-NeoX-20B): MT-NLG 530B on 2,240 / 2,800 / 3,360 GPUs
    predicted 2-8 % faster than it ran, BLOOM-176B up to 10 % slower (its 2022 engine ran
    fastest); the DeepSpeed fit below Megatron-LM's; and the fit the recorded calibration
    (plan/frameworks.py CALIBRATIONS: its efficiency and spread, to the figure)."""
    eff, rows = framework_rows
    assert eff["a100-80gb", "deepspeed"] < eff["a100-80gb", "megatron"]
    assert rows["20B"]["calibration"] and abs(rows["20B"]["error"]) < 1e-3
    step = lambda r: 1 / (1 + r["error"]) - 1  # noqa: E731  predicted / published step - 1
    mt = [step(rows[f"530B {g}"]) for g in (2240, 2800, 3360)]
    assert all(-0.08 < d < -0.02 for d in mt) and mt[0] > mt[1] > mt[2], mt
    assert 0 < step(rows["176B"]) < 0.10
    others = [*mt, step(rows["176B"])]
    for (gpu, fw), cal in F.CALIBRATIONS.items():
        assert round(eff[gpu, fw], 3) == cal.efficiency, (gpu, fw)
    cal = F.CALIBRATIONS["a100-80gb", "deepspeed"]
    assert cal.spread == (round(min(others), 3), round(max(others), 3)) and cal.runs == 4
    assert all(r["fits"] for r in rows.values())
    # Both calibrations are reported: at one efficiency per GPU torchtitan's rows are +50 %.
    assert rows["8B FSDP 128"]["gpu_error"] > 0.4 > abs(rows["8B FSDP 128"]["error"])


def test_deepspeeds_fit_is_the_run_that_predicts_the_others_best():
    """Fitted on each of DeepSpeed's five A100 runs in turn, GPT-NeoX-20B's fit has the
    smallest worst error over the other four (FRAMEWORK_FITS's rule), and the only one
    within 10 % of all of them; BLOOM-176B's (0.714) predicts the rest 8-15 % fast."""
    fits = {cal.name: (e, d) for cal, e, d in fits_by_candidate("a100-80gb", "deepspeed")}
    assert set(fits) == {"530B 2240", "530B 2800", "530B 3360", "20B", "176B"}
    worst = {n: max(map(abs, d.values())) for n, (_, d) in fits.items()}
    assert min(worst, key=worst.get) == FRAMEWORK_FITS["a100-80gb", "deepspeed"] == "20B"
    assert [n for n, w in worst.items() if w < 0.10] == ["20B"]
    e, d = fits["176B"]
    assert round(e, 3) == 0.714 and all(-0.16 < x < -0.07 for x in d.values())
