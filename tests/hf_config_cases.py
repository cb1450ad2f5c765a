"""Generated HuggingFace configs for the one-line rule (used by tests/test_hf_config_checks.py).

Each case takes a small valid config (llama, qwen2, mistral, gpt2) and mutates one key to one
of :data:`MUTATIONS`; :func:`run_case` runs ``profile --analytic --hf-config`` or
``run --local --model hf:DIR`` on it in this process and :func:`verdict` checks the rule
"exit 0 with output, or exit 2 with one line and no traceback", and that a size key made
non-positive, non-integer or huge is refused rather than run.

``python tests/hf_config_cases.py [analytic|run|both]`` prints the count of cases and of
violations, with the first violations (each case has a time limit, so a hang is counted
rather than waited for).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
from pathlib import Path

BASES: dict[str, dict] = {
    "llama": {"model_type": "llama", "vocab_size": 40, "hidden_size": 16,
              "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "head_dim": 4,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "hidden_act": "silu"},
    "qwen2": {"model_type": "qwen2", "vocab_size": 40, "hidden_size": 16,
              "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64,
              "sliding_window": 8, "use_sliding_window": False, "max_window_layers": 1,
              "attention_dropout": 0.0, "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "vocab_size": 40, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 1, "max_position_embeddings": 64, "sliding_window": 3},
    "gpt2": {"model_type": "gpt2", "vocab_size": 40, "n_embd": 16, "n_layer": 2, "n_head": 4,
             "n_positions": 64, "n_inner": 32, "layer_norm_epsilon": 1e-5,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
             "activation_function": "gelu_new", "tie_word_embeddings": True},
}

DROP = object()
MUTATIONS: dict[str, object] = {"missing": DROP, "-1": -1, "0": 0, "huge": 10**12,
                                "string": "x", "null": None, "nested": {"a": [1]},
                                "float": 2.5, "bool": True}

# Keys whose value is a size: any of these mutations must be refused (exit 2), on both paths.
SIZE_KEYS = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
             "head_dim", "n_embd", "n_layer", "n_head", "n_positions", "n_inner"}
MUST_REFUSE = {"-1", "0", "huge", "string", "nested", "float", "bool"}

SEQ = 8
TIME_LIMIT_S = int(os.environ.get("HF_CASES_TIME_LIMIT", "60"))


def cases() -> list[tuple[str, str, str, dict]]:
    """(base, key, mutation, config) for every key of every base and every mutation."""
    out = []
    for base, config in BASES.items():
        for key in config:
            if key == "model_type":
                continue
            for name, value in MUTATIONS.items():
                mutated = {k: v for k, v in config.items() if k != key}
                if value is not DROP:
                    mutated[key] = value
                out.append((base, key, name, mutated))
    # A few more sizes from the issue: 10^7 layers, hidden 10^9, vocab 10^12.
    for base, key, value in (("llama", "num_hidden_layers", 10**7), ("gpt2", "n_layer", 10**7),
                             ("llama", "hidden_size", 10**9), ("llama", "vocab_size", 10**12),
                             ("gpt2", "n_embd", 10**9)):
        out.append((base, key, f"={value:.0e}", {**BASES[base], key: value}))
    return out


def command(kind: str, folder: Path) -> list[str]:
    if kind == "analytic":
        return ["profile", "--analytic", "--hf-config", str(folder / "config.json"),
                "--seq", str(SEQ), "--json"]
    return ["run", "--local", "--model", f"hf:{folder}", "--schedule", "gpipe", "-p", "1",
            "-m", "1", "--seq", str(SEQ), "--batch", "1", "--warmup", "0", "--repeat", "1",
            "--json"]


class _Timeout(Exception):
    pass


_PARSER: list = []
"""``cli.build_parser()``, built once: building it is most of a failed call's time (20 ms),
and one parser parses any number of command lines."""


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def run_case(kind: str, config: dict | None, folder: Path,
             limit_s: int = TIME_LIMIT_S) -> tuple[int | None, str, str, str | None]:
    """(exit code, stdout, stderr, escaped exception or None) of one in-process call on
    ``folder`` (its config.json written from ``config`` unless that is None); a call that
    runs past ``limit_s`` seconds is a hang."""
    from pipebubble import cli

    if config is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(limit_s)
    escaped = None
    rc = None
    if not _PARSER:
        _PARSER.append(cli.build_parser())
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _patched(cli, "build_parser", lambda: _PARSER[0]):
            rc = cli.main(command(kind, folder))
    except _Timeout:
        escaped = "hang"
    except MemoryError:
        escaped = "MemoryError"
    except BaseException as exc:  # noqa: BLE001 - the rule is what is being checked
        escaped = f"{type(exc).__name__}: {str(exc)[:100]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, out.getvalue(), err.getvalue(), escaped


def verdict(key: str, mutation: str, rc, out: str, err: str, escaped) -> str | None:
    """None when the rule holds, else what broke it."""
    if escaped is not None:
        return f"traceback/{escaped}" if escaped != "hang" else "hang"
    lines = err.strip().splitlines()
    if rc == 2:
        if "Traceback" in err:
            return "traceback in stderr"
        if len(lines) != 1 or not lines[0].startswith("pipebubble: error: "):
            return f"{len(lines)}-line error: {err.strip()[:160]!r}"
        return None
    if rc == 0:
        if not out.strip():
            return "exit 0 without output"
        if "Traceback" in err:
            return "traceback in stderr"
        if key in SIZE_KEYS and (mutation in MUST_REFUSE or mutation.startswith("=")):
            return "silently accepted"
        return None
    return f"exit {rc}"


def main(kinds: list[str]) -> int:
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:  # a blow-up is an error here, not the end of the machine
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, resource.RLIM_INFINITY))
    except (ImportError, ValueError, OSError):
        pass
    all_cases = cases()
    bad: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            # imports (torch, transformers) and a first model take tens of seconds on a
            # busy machine: not a case's time
            run_case(kind, BASES["llama"], Path(tmp) / f"{kind}-warm", limit_s=600)
            for i, (base, key, mutation, config) in enumerate(all_cases):
                folder = Path(tmp) / f"{kind}{i}"
                rc, out, err, escaped = run_case(kind, config, folder)
                v = verdict(key, mutation, rc, out, err, escaped)
                if v is not None:
                    bad.append(f"{kind} {base} {key}={mutation}: {v}")
                    print(bad[-1], flush=True)
    print(f"{len(all_cases) * len(kinds)} cases, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(["analytic", "run"] if len(sys.argv) < 2 or sys.argv[1] == "both"
                  else [sys.argv[1]]))
