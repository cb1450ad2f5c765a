"""The axes around the pipeline: presets, the network's two levels, model states by sharding,
the compute model's shape penalty, HF configs, --config and its rank, calibration, and every
bad input as one line with exit 2."""

import json

import pytest

from pipebubble.cli import main
from pipebubble.plan.analytic import TransformerShape
from pipebubble.plan.hardware import PRESETS, get_hardware
from pipebubble.plan.hfconfig import shape_from_hf
from pipebubble.plan.memory import block_activation_bytes, model_state_bytes
from pipebubble.plan.network import Network, allreduce
from pipebubble.plan.sharding import Sync

LLAMA_TINY = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 4,
              "vocab_size": 1000}


def test_presets_carry_the_data_sheet_numbers():
    assert set(PRESETS) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x"}
    assert get_hardware("a100-80gb").peak_flops == 312e12
    # memory as the driver reports it: H100 80 GB has 81,559 MiB, H200 143,771 MiB
    assert get_hardware("h100-sxm").memory == 81559 * 2**20
    assert get_hardware("h200").memory == 143771 * 2**20
    assert get_hardware("a100-80gb").memory == 80 * 2**30
    assert get_hardware("b200").peak_flops == 2250e12
    assert get_hardware("h100-sxm", gpus_per_node=4).gpus_per_node == 4


def test_zero_model_states_by_hand():
    """ZeRO paper, K = 12, N = 64: DDP 16, ZeRO-1 4 + 12/64, ZeRO-2 2 + 14/64, ZeRO-3 16/64."""
    assert [model_state_bytes(s, 64) for s in ("ddp", "zero1", "zero2", "fsdp")] == [
        16, 4 + 12 / 64, 2 + 14 / 64, 16 / 64]


def test_a_group_that_leaves_the_node_uses_the_slower_link():
    net = Network(8, (300e9, 0.0), (25e9, 0.0))
    n = 1e9
    inside = allreduce(n, 8, net.link(1, 8))
    across = allreduce(n, 8, net.link(8, 8))  # DP of 8 over TP 8: one member a node
    assert across == pytest.approx(inside * 12)
    # DP of 8 over TP 2: 4 members a node drive 4 NICs, 100 of NVLink's 300 GB/s
    assert allreduce(n, 8, net.link(2, 8)) == pytest.approx(inside * 3)


def test_overlap_hides_all_but_one_bucket():
    sync = Sync("ddp", Network.flat(1e9, 0.0), n=4, grad_bytes=4)
    times = sync.times(1e9, pp=1)  # 4 GB all-reduced over 4: 2 x 3/4 x 4 s = 6 s
    assert times == (0.0, 6.0)
    assert sync.exposed(times, forward=1.0, backward=10.0, params=1e9) == pytest.approx(
        6.0 * 40e6 / 1e9)
    assert sync.exposed(times, forward=1.0, backward=1.0, params=1e9) == pytest.approx(5.0)


def test_sequence_parallel_splits_what_tp_replicates():
    sh = TransformerShape(layers=1, hidden=1024, ffn=4096, heads=16, vocab=10, swiglu=False,
                          dropout=True)
    s, b = 2048, 1
    assert block_activation_bytes(sh, s, b, tp=8, sp=True) * 8 == block_activation_bytes(
        sh, s, b)
    assert block_activation_bytes(sh, s, b, cp=4) * 4 == block_activation_bytes(sh, s, b)


def test_hf_configs_llama_gpt2_and_rejections():
    shape, used = shape_from_hf(dict(LLAMA_TINY))
    assert shape.kv == 4 and shape.swiglu and "num_key_value_heads" in used
    gpt2, _ = shape_from_hf({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                             "vocab_size": 50257, "n_positions": 1024})
    assert gpt2.total_params() == 124439808  # GPT-2 small (tied head)
    for bad, msg in (({"model_type": "bert"}, "not supported"),
                     ({**LLAMA_TINY, "hidden_size": 0}, "'hidden_size' must be an integer"),
                     ({k: v for k, v in LLAMA_TINY.items() if k != "vocab_size"},
                      "missing key 'vocab_size'"),
                     ({**LLAMA_TINY, "num_key_value_heads": 3}, "must divide")):
        with pytest.raises(ValueError, match=msg):
            shape_from_hf(bad)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("axes")
    cfg = d / "config.json"
    cfg.write_text(json.dumps(LLAMA_TINY))
    out = d / "tiny.json"
    assert main(["profile", "--analytic", "--hf-config", str(cfg), "--seq", "512", "--out",
                 str(out), "--json"]) == 0
    return str(out), str(cfg)


def plan(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


BASE = ["--gpus", "16", "--global-batch", "32", "--gpu", "h100-sxm", "--schedules",
        "1f1b,interleaved-1f1b", "--mbs", "1,2", "--max-chunks", "2"]


def test_config_is_predicted_and_ranked(tiny, capsys):
    cfg_text = "tp=2,sp=1,pp=2,dp=4,sharding=zero1,mbs=1,schedule=1f1b,recompute=none"
    out = plan(capsys, "--profile", tiny[0], *BASE, "--config", cfg_text, "--exact-rank")
    cfg = out["config"]
    assert (cfg["tp"], cfg["sp"], cfg["pp"], cfg["dp"], cfg["sharding"]) == (2, True, 2, 4,
                                                                            "zero1")
    assert cfg["fits"] and len(cfg["peak_memory"]) == 2
    faster = sum(p["predicted_step_time"] < cfg["predicted_step_time"] for p in out["plans"])
    assert cfg["rank"] in (faster + 1, None)
    assert cfg["predicted_step_time"] >= out["plans"][0]["predicted_step_time"]
    assert "--use-distributed-optimizer" in cfg["megatron"] and "--sequence-parallel" in \
        cfg["megatron"]
    for p in out["plans"]:
        assert p["tp"] * p["cp"] * p["pp"] * p["dp"] == 16
        assert p["tokens_per_second_per_gpu"] == pytest.approx(
            32 * 512 / p["predicted_step_time"] / 16)
    # without --exact-rank: the same plan and pastes, no full search, a rank interval from
    # the bounds that holds the true rank (a full search listing every plan)
    alone = plan(capsys, "--profile", tiny[0], *BASE, "--config", cfg_text)
    assert alone["plans"] == []

    def own(pastes):  # the configuration's own pastes (the plan another runs instead aside)
        return {fw: {k: v for k, v in pastes[fw].items() if not k.startswith("instead")}
                for fw in ("torchtitan", "megatron")}

    assert own(alone["pastes"]) == own(out["pastes"])
    assert alone["pastes"]["torchtitan"]["instead"] is None  # ZeRO-1: none searched for
    mine = alone["config"]
    for key in ("predicted_step_time", "peak_memory", "stages", "megatron", "memory",
                "mfu"):
        assert mine[key] == cfg[key], key
    every = plan(capsys, "--profile", tiny[0], *BASE, "--top", "100000")
    assert len(every["plans"]) < 100000  # every configuration's plan
    true_rank = 1 + sum(p["predicted_step_time"] < mine["predicted_step_time"] * (1 - 1e-12)
                        for p in every["plans"])
    rb = mine["rank_bounds"]
    assert rb["low"] <= true_rank <= rb["high"] and rb["considered"] == every["searched"]
    assert mine["rank"] == (rb["low"] if rb["low"] == rb["high"] else None)
    assert mine["rank_note"].startswith(f"rank between #{rb['low']} and #{rb['high']:,}: "
                                        if rb["low"] < rb["high"] else f"rank: #{rb['low']} (")


def test_calibration_round_trips(tiny, capsys):
    cfg = "tp=1,pp=1,dp=16,sharding=ddp,mbs=2,recompute=none"
    at = plan(capsys, "--profile", tiny[0], *BASE, "--config", cfg, "--efficiency", "0.5")
    step = at["config"]["predicted_step_time"]
    fit = plan(capsys, "--profile", tiny[0], *BASE, "--config", cfg, "--measured-step",
               str(step))
    assert fit["efficiency"] == pytest.approx(0.5, rel=1e-3)


@pytest.mark.parametrize("extra, message", [
    (["--gpu", "v100"], "unknown --gpu 'v100'"),
    (["--tp", "3"], "--tp 3 does not divide the model's 8 attention heads"),
    (["--config", "tp=2,pp=2,dp=2,cp=1"], "!= --gpus 16"),
    (["--config", "cp=3"], "does not divide"),
    (["--config", "tp=1,pp=1,dp=16", "--measured-step", "1e-9"], "faster than this"),
    (["--config", "tp=1,pp=1,dp=16", "--measured-step", "1", "--efficiency", "0.5"],
     "contradicts"),
    (["--measured-step", "1"], "needs --config"),
    (["--gpu-memory", "1MiB"], "nothing fits"),
    (["--sharding", "zero9"], "unknown --sharding"),
])
def test_bad_input_is_one_line(tiny, capsys, extra, message):
    args = ["plan", "--profile", tiny[0], "--gpus", "16", "--global-batch", "32",
            "--schedules", "1f1b", "--mbs", "1"]
    if "--gpu" not in extra:
        args += ["--gpu", "h100-sxm"]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebubble: error: ") and err.count("\n") == 1 and message in err


def test_a_hardware_free_profile_needs_a_gpu(tiny, capsys):
    assert main(["plan", "--profile", tiny[0], "--gpus", "2", "--global-batch", "4"]) == 2
    assert "hardware free" in capsys.readouterr().err


def test_bad_hf_config_is_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "t5"}))
    assert main(["profile", "--analytic", "--hf-config", str(bad), "--seq", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_type 't5' is not supported" in err


def test_a_v_placed_csv_order_names_a_class_that_places_stages_v_wise(tiny, capsys, tmp_path,
                                                                       monkeypatch):
    """torchtitan places stages from the class alone: a V-placed order run from its CSV must
    name ZBVZeroBubble (V, two stages per rank), never a loop-placing class."""
    monkeypatch.chdir(tmp_path)  # (the pastes' torch CSV is written where plan runs)
    out = plan(capsys, "--profile", tiny[0], "--gpus", "4", "--global-batch", "16", "--gpu",
               "h100-sxm", "--schedules", "v-half,zb-h1", "--pp", "2", "--tp", "1", "--cp",
               "1", "--mbs", "1", "--top", "10", "--sharding", "ddp,fsdp")
    seen = set()
    for p in out["plans"]:
        par = p["torchtitan"]["parallelism"]
        seen.add(p["schedule"])
        if p["placement"] == "v":
            assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
        else:
            assert par["pipeline_parallel_schedule"] == "1F1B"
    assert seen == {"v-half", "zb-h1"}


def _gpt_plan(pp: int, dp: int = 1, sharding: str = "ddp", tied: bool = True):
    """The best plan of a small GPT (tied or not) on A100s at a fixed pp, dp, sharding."""
    from pipebubble.plan.analytic import shape_profile
    from pipebubble.plan.layercosts import ProfileSet
    from pipebubble.plan.planner import Request, search

    shape = TransformerShape(layers=4, hidden=1024, ffn=4096, heads=16, vocab=50000,
                             tied_embeddings=tied, swiglu=False, positions=1024, dropout=True,
                             biases=True)
    prof = ProfileSet([shape_profile(shape, 1024, 1)])
    req = Request(gpus=pp * dp, gpu_memory=80 * 2**30, global_batch=8 * dp,
                  microbatch_sizes=(1,), schedules=("1f1b",), recompute=("none",), tp=(1,),
                  cp=(1,), pp=(pp,), shardings=(sharding,), top=1)
    return shape, search(prof, req, get_hardware("a100-80gb")).plans[0]


def test_the_optimizer_step_is_priced_by_hand():
    """pp = 1, dp = 1: nothing else follows the pipeline, so the step is the pipeline plus
    Adam over every parameter at 2 g + 2 o + w = 30 bytes (2 : 2 : 12) through HBM."""
    from pipebubble.plan.optimizer import step_time

    shape, plan = _gpt_plan(1)
    hbm = get_hardware("a100-80gb").hbm_bandwidth
    adam = shape.total_params() * 30 / hbm
    assert plan.step_time - plan.pipeline_time == pytest.approx(adam, rel=1e-9)
    # sharded: each of N ranks updates 1 / N of the states; hsdp over its shard group
    assert step_time(8e9, "zero1", 8, (2, 2, 12), hbm) == pytest.approx(1e9 * 30 / hbm)
    assert step_time(8e9, "fsdp", 8, (2, 2, 12), 0.0) == 0.0  # no HBM rate: not priced


def test_a_tied_embedding_is_copied_to_the_last_stage_at_pp_2():
    """Megatron-LM at pp > 1: the head's stage keeps a copy of the tied embedding (weights,
    gradients, optimizer state) and all-reduces its gradient with the first stage after the
    backward; at pp = 1 (or untied) there is one copy and no such all-reduce."""
    from pipebubble.plan.axes import Axes, Point

    shape, plan = _gpt_plan(2)
    copy = shape.vocab * shape.hidden
    layers = [shape.embedding_params(), *[shape.block_params()] * shape.layers,
              shape.head_params()]
    held = [sum(layers[a:b + 1]) for a, b in plan.ranges]
    assert plan.memory[0]["weights"] == pytest.approx(2 * held[0])
    assert plan.memory[1]["weights"] == pytest.approx(2 * (held[1] + copy))
    assert plan.memory[1]["optimizer"] == pytest.approx(12 * (held[1] + copy))
    net = Network.of(get_hardware("a100-80gb"))
    t = Axes(Point(), net).tied_allreduce(1, 2, copy)
    assert t == allreduce(4 * copy, 2, net.hop(1)) > 0
    assert plan.step_time >= plan.pipeline_time + t  # rank 0 ends the pipeline, then waits
    _, one = _gpt_plan(1)
    assert one.memory[0]["weights"] == pytest.approx(2 * shape.total_params())
    untied, plain = _gpt_plan(2, tied=False)  # its head holds its own matrix: no copy
    layers = [untied.embedding_params(), *[untied.block_params()] * untied.layers,
              untied.head_params()]
    assert plain.memory[1]["weights"] == pytest.approx(
        2 * sum(layers[plain.ranges[1][0]:plain.ranges[1][1] + 1]))
