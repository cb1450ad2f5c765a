"""Profile a HuggingFace LLaMA of 8 decoder layers, hidden 256 (target: under 30 s).

What a user runs for their own model: ``pipebubble profile --model hf:DIR`` (a local
config, random weights), timed end to end in this process: building the model from the
config, the adapter, the dry forward, FLOPs and saved-bytes counting, 2 warm-up and 5 timed
passes, one CPU thread. Baseline, timed in the same run: the built-in transformer of the same
shape (8 blocks, dim 256, same vocabulary and sequence) through the same command; the script
prints both times and their ratio, and each model's summed forward + backward per
microbatch as the profile measured it.

    python bench/bench_profile_hf.py [--seq 128] [--batch 4] [--vocab 32000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

from pipebubble.cli import main as cli


def timed_profile(argv: list[str]) -> tuple[float, dict]:
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = cli(["profile", *argv, "--json"])
    took = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"pipebubble profile {' '.join(argv)} exited {rc}")
    return took, json.loads(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    from transformers import LlamaConfig

    with tempfile.TemporaryDirectory() as d:
        LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
                    num_hidden_layers=a.layers, num_attention_heads=8, num_key_value_heads=8,
                    max_position_embeddings=max(a.seq, 128)).save_pretrained(d)
        common = ["--seq", str(a.seq), "--batch", str(a.batch)]
        hf_s, hf = timed_profile(["--model", f"hf:{Path(d)}", *common])
    base_s, base = timed_profile(["--model", "transformer", "--layers", str(a.layers), "--dim",
                                  str(a.hidden), "--heads", "8", "--vocab", str(a.vocab),
                                  *common])

    def step(prof: dict) -> float:
        return sum(x["forward"] + x["backward"] for x in prof["layers"])

    print(f"HF LLaMA, {a.layers} layers, hidden {a.hidden}, vocab {a.vocab}, seq {a.seq}, "
          f"batch {a.batch}: profiled in {hf_s:.2f} s (target < 30 s: "
          f"{'met' if hf_s < 30 else 'MISSED'}); {len(hf['layers'])} layers, "
          f"F+B {step(hf) * 1e3:.1f} ms per microbatch")
    print(f"built-in transformer, same shape: profiled in {base_s:.2f} s; "
          f"F+B {step(base) * 1e3:.1f} ms per microbatch")
    print(f"ratio HF / built-in: {hf_s / base_s:.2f}x wall time to profile, "
          f"{step(hf) / step(base):.2f}x measured compute")


if __name__ == "__main__":
    main()
