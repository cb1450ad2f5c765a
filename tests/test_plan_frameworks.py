"""``plan --framework``: each framework's defaults applied and overridable, what each one
runs (DualPipe never first under a framework, Megatron-LM's FSDP with PP marked with its
reason), the pricing knobs the profiles set, and the calibration note (plan/frameworks.py)."""

import json

import pytest

from pipebubble.cli import main
from pipebubble.errors import UserError
from pipebubble.plan import frameworks as F
from pipebubble.plan.analytic import analytic_profile
from pipebubble.plan.hardware import get_hardware
from pipebubble.plan.network import Network
from pipebubble.plan.plans import Request
from pipebubble.plan.sharding import Sync
from pipebubble.plan.tensor import _sp_parts, block_tp_comm
from pipebubble.schedules import lookup


@pytest.fixture(scope="module")
def free_profile(tmp_path_factory):
    """A small LLaMA-like model priced from its shape on a GPU preset (no --tflops)."""
    path = tmp_path_factory.mktemp("fw") / "free.json"
    analytic_profile(layers=8, hidden=1024, ffn=2816, heads=8, vocab=32000, seq=1024,
                     batch=1).save(path)
    return str(path)


def plan_json(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---- the profiles: defaults applied, each overridable -----------------------------------

EXPECTED = {  # framework: (dp overlap, tp overlap, what --fsdp-reshard auto means, states)
    "megatron": (True, "backward", "always", (2.0, 4.0, 12.0)),
    "torchtitan": (True, "off", "auto", (2.0, 2.0, 12.0)),
    "deepspeed": (False, "off", "always", (2.0, 6.0, 12.0)),
    "nemo": (True, "on", "always", (2.0, 4.0, 12.0)),
    "none": (True, "backward", "auto", None),
}


@pytest.mark.parametrize("name", F.FRAMEWORKS)
def test_defaults_applied(name):
    dp, tp, reshard, states = EXPECTED[name]
    s = F.settings(name)
    assert (s.dp_overlap, s.tp_overlap, s.fsdp_reshard, s.state_bytes) == (dp, tp, reshard,
                                                                             states)
    req, hw = F.apply(s, Request(gpus=8, gpu_memory=1e10, global_batch=8),
                      get_hardware("h100-sxm"))
    assert req.dp_overlap is dp and req.fsdp_reshard == reshard
    assert hw.tp_overlap is (tp != "off") and hw.tp_comm_overlap is (tp == "on")
    assert req.model_states() == (states or (2.0, 2.0, 12.0))
    assert s.given == ()


@pytest.mark.parametrize("name", F.FRAMEWORKS)
def test_each_default_overridable(name):
    dp, tp, _, states = EXPECTED[name]
    flip_tp = "on" if tp != "on" else "off"
    s = F.settings(name, dp_overlap="off" if dp else "on", tp_overlap=flip_tp,
                   fsdp_reshard="never", states=(None, None, 6.0))
    assert s.dp_overlap is not dp and s.tp_overlap == flip_tp and s.fsdp_reshard == "never"
    assert set(s.given) == {"--dp-overlap", "--tp-overlap", "--fsdp-reshard",
                            "--optimizer-bytes"}
    # the optimizer bytes given, the other states the framework's (none: the request's own)
    assert s.state_bytes == (None if states is None else (states[0], states[1], 6.0))
    assert F.settings(name, total_given=True).state_bytes is None  # --bytes-per-param wins


def test_deepspeed_accumulation_traffic_only_where_the_hardware_has_none():
    s = F.settings("deepspeed")
    _, hw = F.apply(s, Request(gpus=8, gpu_memory=1e10, global_batch=8),
                    get_hardware("a100-80gb"))
    assert hw.grad_accumulation_bytes == 18.0
    _, kept = F.apply(s, Request(gpus=8, gpu_memory=1e10, global_batch=8),
                      get_hardware("a100-80gb", grad_accumulation_bytes=6.0))
    assert kept.grad_accumulation_bytes == 6.0


def test_schedules_from_the_spec():
    dsp, mg, tt = (F.get_framework(n) for n in ("deepspeed", "megatron", "torchtitan"))
    assert dsp.runs_schedule("1f1b") and not dsp.runs_schedule("interleaved-1f1b")
    assert mg.runs_schedule("interleaved-1f1b") and not mg.runs_schedule("zbv")
    assert tt.runs_schedule("zbv") and not tt.runs_schedule("dualpipe")
    assert lookup("1f1b").deepspeed == "TrainSchedule"


@pytest.mark.parametrize("argv, words", [
    (["--framework", "jax"], "valid are megatron, torchtitan, deepspeed, nemo, none"),
    (["--tp-overlap", "yes"], "valid are off, backward, on"),
    (["--dp-overlap", "2"], "valid are on, off"),
])
def test_bad_choice_one_line_exit_2(free_profile, capsys, argv, words):
    rc = main(["plan", "--profile", free_profile, "--gpus", "8", "--gpu", "h100-sxm",
               "--global-batch", "8", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1 and argv[1] in err


# ---- the knobs the profiles set, by hand ----------------------------------------------------

def test_dp_overlap_off_exposes_the_whole_step_traffic():
    net = Network.flat(1e9, 0.0)
    on = Sync("ddp", net, n=2, grad_bytes=4)
    off = Sync("ddp", net, n=2, grad_bytes=4, overlap=False)
    # 4e8 parameters: one 40 M bucket is a tenth of each transfer; a 1 s pass hides the rest
    times = (0.001, 0.004)
    assert on.exposed(times, forward=1.0, backward=1.0, params=4e8) == pytest.approx(0.0005)
    assert off.exposed(times, forward=1.0, backward=1.0, params=4e8) == pytest.approx(0.005)


def test_tp_overlap_on_pipelines_the_forward_collectives():
    base = Network(8, (100e9, 0.0), (10e9, 0.0))
    on = Network(8, (100e9, 0.0), (10e9, 0.0), tp_comm_overlap=True)
    rs, ag = _sp_parts(1000, 1000, 4, base)  # 2 MB over 4 ranks: 1.5e-5 s each
    assert rs == ag == pytest.approx(1.5e-5)
    plain = block_tp_comm(1000, 1000, 4, base, sp=True)
    long_gemms = block_tp_comm(1000, 1000, 4, on, sp=True, fwd_gemms=(1.0,) * 4,
                               dgrad_rows=(1.0, 1.0))
    no_gemms = block_tp_comm(1000, 1000, 4, on, sp=True, fwd_gemms=(0.0,) * 4,
                             dgrad_rows=(0.0, 0.0))
    assert plain[0] == pytest.approx(4 * 1.5e-5)
    assert long_gemms[0] == pytest.approx(4 * 1.5e-5 / 4)  # one chunk of four shows
    assert no_gemms == pytest.approx(plain)  # nothing to hide behind: as without overlap
    # the backward: its two gradient all-gathers down to a chunk, the rest as before
    assert long_gemms[1] == pytest.approx(plain[1] - 2 * ag + 2 * ag / 4)
    # without sequence parallelism nothing changes (userbuffers and AsyncTP need it)
    assert block_tp_comm(1000, 1000, 4, on, fwd_gemms=(1.0,) * 4, dgrad_rows=(1.0, 1.0)) == \
        block_tp_comm(1000, 1000, 4, base)


# ---- what each framework runs, and the ranking ------------------------------------------------

SMALL = ["--gpus", "16", "--gpu", "h100-sxm", "--global-batch", "256", "--pp", "2",
         "--top", "3"]


DUALPIPE = ["--schedules", "1f1b,dualpipe"]


@pytest.fixture(scope="module")
def dualpipe_wins(free_profile):
    """The premise: without a framework DualPipe is the fastest plan here."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", "--profile", free_profile, *SMALL, *DUALPIPE, "--json"]) == 0
    first = json.loads(buf.getvalue())["plans"][0]
    assert lookup(first["schedule"]).chains == 2
    return first


@pytest.mark.parametrize("name", ["megatron", "torchtitan", "deepspeed", "nemo"])
def test_dualpipe_never_first_under_a_framework(free_profile, capsys, dualpipe_wins, name):
    out = plan_json(capsys, "--profile", free_profile, *SMALL, *DUALPIPE, "--framework", name)
    first = out["plans"][0]
    assert lookup(first["schedule"]).chains == 1 and first["not_runnable"] is None
    assert first["predicted_step_time"] > dualpipe_wins["predicted_step_time"]
    shown = [p for p in out["plans"] if lookup(p["schedule"]).chains == 2]
    assert shown and all(p["framework"] == name and p["not_runnable"] for p in shown)
    ok = [p["not_runnable"] is None for p in out["plans"]]
    assert ok == sorted(ok, reverse=True)  # the runnable ones first, the rest after


def test_megatron_fsdp_with_pp_marked_with_the_reason(free_profile, capsys):
    out = plan_json(capsys, "--profile", free_profile, *SMALL, "--framework", "megatron",
                    "--schedules", "1f1b", "--config", "pp=2,sharding=fsdp")
    why = out["config"]["not_runnable"]
    assert "Megatron-FSDP or torch FSDP2, neither of which pipelines" in why
    assert all(p["not_runnable"] is None for p in out["plans"][:3])
    main(["plan", "--profile", free_profile, *SMALL, "--framework", "megatron",
          "--schedules", "1f1b", "--config", "pp=2,sharding=fsdp"])
    text = " ".join(capsys.readouterr().out.split())  # wrapped at the terminal's width
    assert f"--config: not runnable in megatron: {why}" in text


@pytest.mark.parametrize("name", ["megatron", "deepspeed"])
def test_config_leaves_the_schedule_open_to_what_the_framework_runs(free_profile, capsys,
                                                                   dualpipe_wins, name):
    # --config fixes the degrees; the schedule it leaves open is searched, and under a
    # framework among what it runs: DualPipe (fastest without one) is not the config's pick
    cfg = "pp=2,sharding=zero1"
    free = plan_json(capsys, "--profile", free_profile, *SMALL, *DUALPIPE, "--config", cfg)
    assert lookup(free["config"]["schedule"]).chains == 2  # the premise
    out = plan_json(capsys, "--profile", free_profile, *SMALL, *DUALPIPE, "--config", cfg,
                    "--framework", name)["config"]
    assert out["not_runnable"] is None and lookup(out["schedule"]).chains == 1
    assert out["predicted_step_time"] > free["config"]["predicted_step_time"]
    # pinned, it is priced as asked and marked
    pinned = plan_json(capsys, "--profile", free_profile, *SMALL, *DUALPIPE, "--config",
                       cfg + ",schedule=dualpipe", "--framework", name)["config"]
    assert pinned["schedule"] == "dualpipe" and "dualpipe" in pinned["not_runnable"].lower()


def test_deepspeed_refuses_what_its_pipeline_engine_refuses(free_profile, capsys):
    out = plan_json(capsys, "--profile", free_profile, *SMALL, "--framework", "deepspeed",
                    "--schedules", "1f1b,interleaved-1f1b", "--sharding", "zero1,zero2",
                    "--top", "8")
    assert out["plans"][0]["not_runnable"] is None
    for p in out["plans"]:
        one_f_one_b = lookup(p["schedule"]).deepspeed is not None
        if p["not_runnable"] is None:
            assert one_f_one_b and p["sharding"] == "zero1"
        elif not one_f_one_b:
            assert "runs its TrainSchedule (1F1B, one stage a rank) only" in p["not_runnable"]
        else:
            assert p["sharding"] == "zero2"
            assert "incompatible with pipeline parallelism" in p["not_runnable"]


# ---- calibration -------------------------------------------------------------------------------

def test_calibration_note_printed(free_profile, capsys):
    main(["plan", "--profile", free_profile, *SMALL, "--schedules", "1f1b"])
    text = " ".join(capsys.readouterr().out.split())  # wrapped at the terminal's width
    assert "absolute times rest on efficiency 0.7, the h100-sxm preset's default" in text
    out = plan_json(capsys, "--profile", free_profile, *SMALL, "--schedules", "1f1b",
                    "--framework", "torchtitan")
    cal = F.calibration("h100-sxm", "torchtitan")
    if cal is not None:  # the published fit is used, and named
        assert out["calibration"]["source"] == "published"
        assert out["calibration"]["efficiency"] == pytest.approx(cal.efficiency)
        assert f"published fit for (h100-sxm, torchtitan) on {cal.fitted_on}" in \
            out["calibration"]["note"]
    given = plan_json(capsys, "--profile", free_profile, *SMALL, "--schedules", "1f1b",
                      "--framework", "torchtitan", "--efficiency", "0.5")
    assert given["calibration"]["source"] == "given"
    assert given["calibration"]["note"].startswith("absolute times rest on --efficiency 0.5")


def test_measured_step_note(free_profile, capsys):
    base = plan_json(capsys, "--profile", free_profile, *SMALL, "--schedules", "1f1b",
                     "--framework", "megatron", "--efficiency", "0.5", "--config",
                     "pp=2,dp=8,tp=1,cp=1,sharding=zero1,mbs=1")
    step = base["config"]["predicted_step_time"]
    out = plan_json(capsys, "--profile", free_profile, *SMALL, "--schedules", "1f1b",
                    "--framework", "megatron", "--config",
                    "pp=2,dp=8,tp=1,cp=1,sharding=zero1,mbs=1", "--measured-step", str(step))
    assert out["calibration"]["source"] == "measured"
    assert out["calibration"]["efficiency"] == pytest.approx(0.5, abs=1e-4)
    assert "fitted to your --measured-step" in out["calibration"]["note"]


def test_calibration_lookup_through_the_same_chip():
    for (gpu, fw), cal in F.CALIBRATIONS.items():
        assert F.calibration(gpu, fw) is cal
        assert 0 < cal.efficiency <= 1
    if ("a100-80gb", "megatron") in F.CALIBRATIONS:
        assert F.calibration("a100-40gb", "nemo") is F.CALIBRATIONS["a100-80gb", "megatron"]
    with pytest.raises(UserError):
        F.calibration("h100-sxm", "jax")


# ---- the pricing and pastes follow the settings ------------------------------------------------

def test_dp_overlap_off_in_a_plan(free_profile, capsys):
    cfg = ["--config", "tp=1,cp=1,pp=1,dp=16,sharding=ddp,mbs=1", "--efficiency", "0.5",
           "--pp", "1", "--tp", "1", "--cp", "1", "--sharding", "ddp", "--mbs", "1",
           "--recompute", "none"]
    on = plan_json(capsys, "--profile", free_profile, *SMALL[:-4], *cfg)["config"]
    off = plan_json(capsys, "--profile", free_profile, *SMALL[:-4], *cfg,
                    "--dp-overlap", "off")["config"]
    assert off["dp_exposed_time"] == pytest.approx(off["allreduce_time"])  # all of it shows
    assert on["dp_exposed_time"] < on["allreduce_time"]
    assert off["predicted_step_time"] == pytest.approx(
        on["predicted_step_time"] - on["dp_exposed_time"] + off["allreduce_time"])


def test_megatron_paste_follows_the_overlaps():
    from types import SimpleNamespace

    plan = SimpleNamespace(config=SimpleNamespace(sp=True, tp=2))
    flags = "--tensor-model-parallel-size 2 --overlap-grad-reduce --overlap-param-gather"
    on = F.megatron_flags(F.settings("megatron", tp_overlap="on"), plan, flags)
    assert on == flags + " --tp-comm-overlap"
    off = F.megatron_flags(F.settings("megatron", dp_overlap="off"), plan, flags)
    assert off == "--tensor-model-parallel-size 2"
    no_sp = SimpleNamespace(config=SimpleNamespace(sp=False, tp=2))
    assert F.megatron_flags(F.settings("nemo"), no_sp, flags) == flags  # needs SP
    assert F.megatron_flags(F.settings("megatron"), plan, None) is None


def test_narrowed_search_space():
    req = Request(gpus=8, gpu_memory=1e10, global_batch=8)
    dsp = F.narrowed("deepspeed", req)
    assert [lookup(n).deepspeed for n in dsp.schedules] == ["TrainSchedule"]
    assert dsp.cp == (1,) and "hsdp" not in dsp.shardings and "zero1" in dsp.shardings
    tt = F.narrowed("torchtitan", req)
    assert set(tt.shardings) == {"ddp", "fsdp", "hsdp"}
    assert all(lookup(n).chains == 1 for n in tt.schedules) and tt.cp is None
    assert F.narrowed("megatron", Request(gpus=8, gpu_memory=1e10, global_batch=8,
                                          schedules=("zb-h1",))) is None


# ---- what each profile runs: op-level SAC, sequence parallelism ---------------------------

def test_recompute_modes_and_sequence_parallelism_come_from_the_profiles():
    """Only torchtitan (and no framework) run op-level SAC; DeepSpeed's profile (the
    Megatron-DeepSpeed forks of its published runs) has no sequence parallelism and no
    selective recomputation, so its narrowed search keeps sp 0 and none / full, and a
    request that asks only for SP or only for ``op`` leaves it nothing."""
    assert [n for n in F.FRAMEWORKS if "op" in F.recompute_modes(n)] == ["torchtitan", "none"]
    assert F.recompute_modes("deepspeed") == ("none", "full")
    assert F.recompute_modes("megatron") == ("none", "selective", "full")
    assert [n for n in F.FRAMEWORKS if not F.get_framework(n).sequence_parallel] == [
        "deepspeed"]
    req = Request(gpus=8, gpu_memory=1e10, global_batch=8,
                  recompute=("selective", "full", "op"))
    assert F.narrowed("deepspeed", req).sp == (False,)
    assert F.narrowed("deepspeed", req).recompute == ("full",)
    assert F.narrowed("megatron", req).recompute == ("selective", "full")
    assert F.narrowed("torchtitan", req).recompute == ("selective", "full", "op")
    assert F.narrowed("megatron", req).sp is None
    assert F.narrowed("deepspeed", Request(gpus=8, gpu_memory=1e10, global_batch=8,
                                           sp=(True,))) is None
    assert F.narrowed("megatron", Request(gpus=8, gpu_memory=1e10, global_batch=8,
                                          recompute=("op",))) is None


def test_deepspeed_marks_a_sequence_parallel_plan_with_the_reason(free_profile, capsys):
    out = plan_json(capsys, "--profile", free_profile, *SMALL, "--framework", "deepspeed",
                    "--tp", "2", "--sp", "1", "--schedules", "1f1b", "--sharding", "zero1")
    assert out["plans"] and all("no Megatron-style sequence parallelism" in p["not_runnable"]
                                for p in out["plans"])
    out = plan_json(capsys, "--profile", free_profile, *SMALL, "--framework", "megatron",
                    "--tp", "2", "--sp", "1", "--schedules", "1f1b", "--sharding", "zero1")
    assert out["plans"][0]["not_runnable"] is None
