"""HuggingFace configs (``profile --analytic --hf-config`` and ``--model hf:PATH``) through the
checked reader, every size bounded and every value range-checked before anything is built,
transformers' own errors as one line, library warnings held until after the result."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from hf_config_cases import (
    BASES,
    MUST_REFUSE,
    SIZE_KEYS,
    TIME_LIMIT_S,
    cases,
    command,
    run_case,
    verdict,
)
from pipebubble import libwarnings
from pipebubble.cli import main
from pipebubble.plan.hfconfig import MAX_HF_LAYERS, check_hf_config, shape_from_hf

LLAMA = BASES["llama"]


def write(folder, config) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else
                                        json.dumps(config))
    return str(folder)


def one_line_error(kind: str, folder) -> str:
    """Run ``kind`` (analytic or run) on ``folder``; it must exit 2 with one line."""
    rc, out, err, escaped = run_case(kind, None, folder)
    assert escaped is None, escaped
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("pipebubble: error: "), err
    assert out == ""
    return lines[0]


def run_on(kind: str, folder, config) -> str:
    write(folder, config)
    return one_line_error(kind, folder)


@pytest.fixture(params=["analytic", "run"])
def kind(request):
    if request.param == "run":
        pytest.importorskip("transformers")
    return request.param


# ---- 1. the checked reader ---------------------------------------------------------------

def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path, kind):
    os.mkfifo(tmp_path / "config.json")
    line = one_line_error(kind, tmp_path)
    assert "not a regular file" in line and "config.json" in line


def test_dev_zero_is_refused_not_read(tmp_path, kind):
    argv = command(kind, tmp_path)
    at = argv.index("--hf-config" if kind == "analytic" else "--model") + 1
    argv[at] = "/dev/zero" if kind == "analytic" else "hf:/dev/zero"
    rc, out, err, escaped = _main(argv)
    assert escaped is None and rc == 2 and err.count("\n") == 1
    assert "'/dev/zero'" in err and "not a regular file" in err


def test_deep_nesting_and_a_5000_digit_integer_are_one_line(tmp_path, kind):
    deep = json.dumps(LLAMA)[:-1] + ', "extra": ' + "[" * 5000 + "]" * 5000 + "}"
    assert "nests 5001 levels deep" in run_on(kind, tmp_path / "deep", deep)
    big = json.dumps(LLAMA)[:-1] + ', "vocab_size": ' + "9" * 5000 + "}"
    assert "an integer with 5000 digits" in run_on(kind, tmp_path / "big", big)
    assert "is not valid JSON" in run_on(kind, tmp_path / "bad", '{"model_type": "llama",')
    assert "must hold a JSON object" in run_on(kind, tmp_path / "list", "[1, 2]")


def _main(argv):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue(), None


# ---- 2. sizes bounded before anything is allocated, values range-checked -----------------

@pytest.mark.parametrize("base, key, value, message", [
    ("llama", "num_hidden_layers", 10**7, f"'num_hidden_layers' must be an integer in "
     f"1..{MAX_HF_LAYERS:,}, got 10000000"),
    ("gpt2", "n_layer", 10**7, "'n_layer' must be an integer in 1..99,998"),
    ("llama", "hidden_size", 10**9, "'hidden_size' must be an integer in 1..262,144"),
    ("llama", "vocab_size", 10**12, "'vocab_size' must be an integer in 1..4,194,304"),
    ("gpt2", "n_positions", 10**9, "'n_positions' must be an integer in 1..16,777,216"),
    ("llama", "num_hidden_layers", -1, "'num_hidden_layers' must be an integer in 1..99,998, "
     "got -1"),
    ("llama", "num_hidden_layers", 0, "got 0"),
    ("llama", "max_position_embeddings", 0, "'max_position_embeddings' must be an integer in "
     "1..16,777,216, got 0"),
    ("llama", "num_attention_heads", "4", "'num_attention_heads' must be an integer in "
     "1..16,384, got '4'"),
    ("llama", "intermediate_size", True, "'intermediate_size' must be an integer"),
    ("llama", "intermediate_size", 24.0, "got 24.0"),
    ("mistral", "sliding_window", 0, "'sliding_window' must be an integer in 1..16,777,216, "
     "got 0 (or null: no sliding window)"),
    ("qwen2", "use_sliding_window", 1, "'use_sliding_window' must be true or false, got 1"),
    ("llama", "rms_norm_eps", 0, "'rms_norm_eps' must be a number in (0, 1], got 0"),
    ("gpt2", "resid_pdrop", 1.5, "'resid_pdrop' must be a number in [0, 1], got 1.5"),
    ("llama", "hidden_size", 18, "hidden_size 18 is not a multiple of num_attention_heads 4"),
    ("llama", "num_key_value_heads", 3, "num_key_value_heads 3 must divide "
     "num_attention_heads 4"),
    ("gpt2", "n_head", 5, "n_embd 16 is not a multiple of n_head 5"),
    ("llama", "pad_token_id", 40, "'pad_token_id' must be null or a token id in 0..39"),
])
def test_bad_values_are_refused_by_name_on_both_paths(tmp_path, kind, base, key, value,
                                                       message):
    config = {**BASES[base], key: value}
    if key == "hidden_size":
        config.pop("head_dim", None)  # else head_dim is the head size and 18 is fine
    line = run_on(kind, tmp_path, config)
    assert message in line, line
    assert ("hf:" if kind == "run" else "--hf-config ") + str(tmp_path) in line


def test_a_missing_size_key_is_named_and_a_null_window_is_no_window(tmp_path, kind):
    config = {k: v for k, v in LLAMA.items() if k != "num_hidden_layers"}
    assert "missing key 'num_hidden_layers'" in run_on(kind, tmp_path / "a", config)
    write(tmp_path / "b", {**BASES["mistral"], "sliding_window": None})
    rc, out, err, escaped = run_case(kind, None, tmp_path / "b")
    assert (rc, escaped) == (0, None) and out.strip(), err


def test_a_model_over_the_free_memory_is_refused_before_it_is_built(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import transformers

    from pipebubble import limits

    def never(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", never)
    monkeypatch.setattr(limits, "free_memory_bytes", lambda: 2**30)  # 1 GiB free
    # Every key within its own bound, but 2,048 layers of hidden 4,096: 413 B parameters.
    config = {**LLAMA, "num_hidden_layers": 2048, "hidden_size": 4096, "head_dim": None,
              "intermediate_size": 11008, "num_attention_heads": 32,
              "num_key_value_heads": 32}
    line = run_on("run", tmp_path, config)
    params = shape_from_hf(config)[0].total_params()
    assert f"{params:,} parameters need about {params * 16 / 2**30:,.1f} GiB" in line
    assert "more than the 1.0 GiB free here" in line


@pytest.mark.parametrize("base", ["llama", "gpt2"])
def test_the_parameter_count_checked_is_torchs_count_of_the_built_model(base):
    tf = pytest.importorskip("transformers")
    from pipebubble.models.hf import check_build

    fields = {k: v for k, v in BASES[base].items() if k != "model_type"}
    model = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.for_model(base, **fields))
    # parameters() counts a tied head once, as the shape does
    assert check_build(BASES[base], "hf:x") == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("base", ["llama", "qwen2", "mistral", "gpt2"])
def test_configs_transformers_saves_pass_the_checks(tmp_path, base):
    """What ``save_pretrained`` writes (every default key, floats as floats) is accepted."""
    tf = pytest.importorskip("transformers")
    fields = {k: v for k, v in BASES[base].items() if k != "model_type"}
    tf.AutoConfig.for_model(base, **fields).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert check_hf_config(saved, "hf:x")["model_type"] == base
    shape, _ = shape_from_hf(saved)
    assert shape.layers == 2 and shape.vocab == 40


# ---- 3. transformers' own errors: one line naming the config -----------------------------

@pytest.mark.parametrize("extra, message", [
    ({"layer_types": ["full_attention"]}, "transformers refuses the config "
     "(StrictDataclassClassValidationError: Class validation error for validator "
     "'validate_layer_type': ValueError: `num_hidden_layers` (2) must be equal to the number "
     "of `layer_types` (1))"),
    ({"id2label": {"a": 1}}, "transformers refuses the config (ValueError: invalid literal"),
    ({"rope_scaling": {"type": "linear", "factor": "x"}}, "cannot build the model "
     "(TypeError: unsupported operand"),
    ({"rope_parameters": {"rope_type": "bogus"}}, "rope_parameters.rope_type 'bogus' is not "
     "one transformers knows; valid are default, linear"),
    ({"hidden_act": "bogus"}, "'hidden_act' 'bogus' is not an activation transformers knows"),
])
def test_transformers_errors_are_one_line_naming_the_config(tmp_path, extra, message):
    pytest.importorskip("transformers")
    line = run_on("run", tmp_path, {**LLAMA, **extra})
    assert line.startswith(f"pipebubble: error: hf:{tmp_path}: ") and message in line, line


def test_model_arg_overrides_are_checked_like_the_file(tmp_path):
    pytest.importorskip("transformers")
    write(tmp_path, LLAMA)
    argv = command("run", tmp_path) + ["--model-arg", "num_hidden_layers=-1"]
    rc, out, err, _ = _main(argv)
    assert rc == 2 and err.count("\n") == 1
    assert f"hf:{tmp_path} with --model-arg: 'num_hidden_layers' must be an integer" in err
    rc, out, err, _ = _main(command("run", tmp_path) + ["--model-arg", "model_type=gpt2"])
    assert rc == 2 and "--model-arg model_type: the model type is the config's own" in err


# ---- 4. the keys line and library warnings come after the result -------------------------

def test_hf_config_names_its_keys_after_the_result_and_errors_are_one_line(tmp_path):
    write(tmp_path, LLAMA)
    cfg = str(tmp_path / "config.json")
    rc, out, err, _ = _main(["profile", "--analytic", "--hf-config", cfg, "--seq", "8"])
    assert rc == 0 and "TransformerBlock" in out
    assert err == (f"from {cfg}: model_type=llama, num_attention_heads=4, hidden_size=16, "
                   "num_key_value_heads=2, head_dim=4, max_position_embeddings=64, "
                   "num_hidden_layers=2, intermediate_size=24, vocab_size=40, "
                   "tie_word_embeddings=False\n")
    rc, out, err, _ = _main(["profile", "--analytic", "--hf-config", cfg, "--seq", "65"])
    assert rc == 2 and err == (f"pipebubble: error: --seq 65 is longer than the model's "
                               f"max_position_embeddings 64 (--hf-config {cfg}); use "
                               "--seq 1..64\n")


def test_transformers_warnings_come_after_the_result_and_never_before_an_error(tmp_path):
    pytest.importorskip("transformers")
    rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "zzz": 1}}
    write(tmp_path / "ok", {**LLAMA, **rope})
    rc, out, err, _ = _main(command("run", tmp_path / "ok"))
    assert rc == 0 and json.loads(out)["ranks"] == 1
    assert err == ("pipebubble: warning: (transformers) Unrecognized keys in "
                   "`rope_parameters` for 'rope_type'='default': {'zzz'}\n")
    # The same warning, then an error: the error alone.
    write(tmp_path / "bad", {**LLAMA, **rope, "layer_types": ["full_attention"]})
    rc, out, err, _ = _main(command("run", tmp_path / "bad"))
    assert rc == 2 and err.count("\n") == 1 and "layer_types" in err


def test_held_keeps_library_warnings_and_reissues_pipebubbles_own():
    import logging

    logger = logging.getLogger("transformers")
    before = (logger.handlers[:], logger.propagate)
    with pytest.warns(UserWarning, match="our own"):
        with libwarnings.held() as kept:
            warnings.warn_explicit("zero-element", UserWarning, "/v/torch/nn/init.py", 3)
            warnings.warn_explicit("our own", libwarnings.PipebubbleWarning,
                                   "/v/pipebubble/x.py", 3)
            # torch's stacklevel=2 names the caller: the user's file, or pipebubble's
            warnings.warn_explicit("target size", UserWarning, "/home/u/fz.py", 90)
            warnings.warn_explicit("via a mode", UserWarning, "/v/pipebubble/runtime/cut.py", 9)
            logging.getLogger("transformers.models.x").warning("a\nrecord")
    assert sorted(kept.lines()) == ["(cut.py) UserWarning: via a mode",
                                    "(fz.py) UserWarning: target size",
                                    "(torch) UserWarning: zero-element",
                                    "(transformers) a record"]
    assert (logger.handlers, logger.propagate) == before  # put back as it was


# ---- the generated configs: every mutation of every key, on both paths -------------------

def _violations(kinds, pick=lambda key, mutation: True, tmp=None) -> tuple[int, list[str]]:
    bad, n = [], 0
    for kind in kinds:
        for i, (base, key, mutation, config) in enumerate(cases()):
            if not pick(key, mutation):
                continue
            n += 1  # the first call also imports torch and transformers: a longer limit
            rc, out, err, escaped = run_case(kind, config, tmp / f"{kind}{i}",
                                             limit_s=600 if n == 1 else TIME_LIMIT_S)
            v = verdict(key, mutation, rc, out, err, escaped)
            if v is not None:
                bad.append(f"{kind} {base} {key}={mutation}: {v}")
    return n, bad


def test_generated_configs_analytic(tmp_path):
    n, bad = _violations(["analytic"], tmp=tmp_path)
    assert n == len(cases()) > 350
    assert bad == []


def test_generated_size_refusals_hf_model(tmp_path):
    """The mutations that must be refused: refused before a model is built (fast)."""
    pytest.importorskip("transformers")
    n, bad = _violations(["run"], lambda key, m: key in SIZE_KEYS and (
        m in MUST_REFUSE or m.startswith("=")), tmp=tmp_path)
    assert n > 150 and bad == []


@pytest.mark.slow
def test_generated_configs_hf_model(tmp_path):
    pytest.importorskip("transformers")
    n, bad = _violations(["run"], tmp=tmp_path)
    assert n == len(cases()) and bad == []
