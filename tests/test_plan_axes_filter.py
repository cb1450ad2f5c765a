"""The planner's four degrees chosen together (pipebubble.plan.axes.splits): with one or two of
tp, cp, pp, dp given (as flags or in ``--config``), the other axes' default lists are what
``--gpus`` and the given axes leave. Generated over (gpus, given axes, values) and checked
against a brute force over every (tp, cp, pp, dp): a request some split satisfies plans, and
its plans keep the given degrees; one none satisfies is one line, exit 2, naming only flags
that were given (``--gpus 2 --tp 1`` used to fail with "--tp 1 x --cp 4 = 4 does not divide
--gpus 2", a --cp nobody asked for)."""

import itertools
import json
import re

import pytest

from pipebubble.cli import main

# 8 attention heads, 4 K/V heads, sequence 512: tp and cp may each be 1, 2, 4 or 8 (an H100
# node has 8 GPUs); 4 blocks + embedding + head = 6 layers, so pp <= 6 with 1F1B.
LLAMA_TINY = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 4,
              "vocab_size": 1000}
LAYERS = 6
AXES = ("tp", "cp", "pp", "dp")
BASE = ["--global-batch", "16", "--gpu", "h100-sxm", "--schedules", "1f1b", "--mbs", "1",
        "--sharding", "ddp", "--recompute", "none", "--top", "1", "--json"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("axes_filter")
    cfg = d / "config.json"
    cfg.write_text(json.dumps(LLAMA_TINY))
    out = d / "tiny.json"
    assert main(["profile", "--analytic", "--hf-config", str(cfg), "--seq", "512", "--out",
                 str(out), "--json"]) == 0
    return str(out)


def feasible(gpus: int, given: dict) -> bool:
    """Brute force: some (tp, cp, pp, dp) from the given or default lists multiplies to
    ``gpus`` with a pipeline no deeper than the layers (global batch 16, dp <= 16, splits)."""
    every = [d for d in range(1, gpus + 1) if gpus % d == 0]
    lists = {a: given.get(a, (1, 2, 4, 8) if a in ("tp", "cp") else every) for a in AXES}
    return any(tp * cp * pp * dp == gpus and pp <= LAYERS
               for tp, cp, pp, dp in itertools.product(*(lists[a] for a in AXES)))


def cases():
    for gpus in (2, 4, 8):
        for k in (1, 2):
            for axes in itertools.combinations(AXES, k):
                for values in itertools.product((1, 2, 4), repeat=k):
                    yield gpus, dict(zip(axes, values, strict=True))


def check(capsys, profile: str, gpus: int, given: dict, config: bool) -> bool:
    """Run one case; True if it planned (else it was refused as the rule says)."""
    if config:
        flags = ["--config", ",".join(f"{a}={v}" for a, v in given.items())]
    else:
        flags = [x for a, v in given.items() for x in (f"--{a}", str(v))]
    argv = ["plan", "--profile", profile, "--gpus", str(gpus), *BASE, *flags]
    rc = main(argv)
    out, err = capsys.readouterr()
    if feasible(gpus, {a: (v,) for a, v in given.items()}):
        assert rc == 0, (argv, err)
        res = json.loads(out)
        plans = [res["config"]] if config else res["plans"]
        for p in plans:
            assert p["tp"] * p["cp"] * p["pp"] * p["dp"] == gpus
            assert all(p[a] == v for a, v in given.items()), (argv, p)
        return True
    assert rc == 2, argv
    assert err.startswith("pipebubble: error: ") and err.count("\n") == 1, (argv, err)
    named = set(re.findall(r"--(tp|cp|pp|dp|config)\b", err))
    assert named <= ({"config"} if config else set(given)), (argv, err)
    assert named, (argv, err)  # it names what was asked for
    return False


@pytest.mark.parametrize("config", [False, True], ids=["flags", "config"])
@pytest.mark.parametrize("gpus", [2, pytest.param(4, marks=pytest.mark.slow),
                                  pytest.param(8, marks=pytest.mark.slow)])
def test_given_axes_filter_the_others(tiny, capsys, gpus, config):
    done = [check(capsys, tiny, g, given, config) for g, given in cases() if g == gpus]
    assert any(done) and not all(done)  # both kinds occur at every size


@pytest.mark.parametrize("argv, message", [
    # the cases of the issue: one axis given, the others' defaults filtered by --gpus
    (["--gpus", "2", "--tp", "1"], None),
    (["--gpus", "2", "--config", "tp=1"], None),
    (["--gpus", "4", "--cp", "4"], None),
    # lists: values no split uses are left out, as for --pp and --dp
    (["--gpus", "2", "--tp", "1,2,4,8"], None),
    (["--gpus", "2", "--tp", "1", "--pp", "4"],
     "--tp 1 x --pp 4 = 4 GPUs does not divide --gpus 2"),
    (["--gpus", "4", "--pp", "3"], "--pp 3 does not divide --gpus 4"),
    (["--gpus", "8", "--tp", "4,8", "--pp", "4"], "no --tp 4,8 x --pp 4 divides --gpus 8"),
    # pp and dp given leave 16 GPUs for tp x cp; the largest tp x cp of the defaults is 64
    (["--gpus", "16", "--pp", "1", "--dp", "1"], None),
    (["--gpus", "128", "--pp", "1", "--dp", "1"],
     "--pp 1 x --dp 1 leave 128 of --gpus 128 for tp x cp"),
    (["--gpus", "16", "--tp", "2", "--pp", "1", "--dp", "1"], None),  # cp 8
    (["--gpus", "32", "--tp", "2", "--pp", "1", "--dp", "1"],
     "leave 16 of --gpus 32 for cp, which the model's degrees (cp 1,2,4,8) cannot make"),
    (["--gpus", "8", "--pp", "8"], "passes --pp 8: pp x chunks stages must be at most the "
     "profile's 6 layers"),
    (["--gpus", "2", "--config", "tp=4"], "--config tp=4 = 4 GPUs does not divide --gpus 2"),
    (["--gpus", "16", "--config", "tp=16"], "--config tp=16 does not divide the model's 8 "
     "attention heads"),
    (["--gpus", "1", "--sharding", "zero1"], "every split of --gpus 1 has one"),
    (["--gpus", "1", "--sp", "1"], "--sp 1 needs tp > 1, but --gpus 1 leaves only tp 1"),
    (["--gpus", "4", "--sp", "1", "--pp", "4"], "--gpus 4, --pp 4 leave only tp 1"),
    (["--gpus", "4", "--sp", "1"], None),  # tp 2 and 4 with sequence parallelism
])
def test_examples(tiny, capsys, argv, message):
    rc = main(["plan", "--profile", tiny, *BASE, *argv])
    out, err = capsys.readouterr()
    if message is None:
        assert rc == 0, err
        got = json.loads(out)
        assert got["plans"] or ("--config" in argv and got["config"]["fits"])
        return
    assert rc == 2 and err.count("\n") == 1 and message in err, err
