"""``run --model`` over gloo, one process per rank: every worker builds the same model from
the same SPEC (a HuggingFace config here), and a model whose first call fails on one worker
ends the run on every rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ENTRY = [sys.executable, "-m", "pipebubble", "run"]


def test_hf_llama_two_ranks_split_backward_matches_the_unsplit_model(tmp_path):
    tf = pytest.importorskip("transformers")
    tf.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=5,
                   num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=32).save_pretrained(tmp_path)
    # ZB-V: 4 stages on 2 ranks; the first stage holds the embedding and a decoder layer.
    proc = subprocess.run([*ENTRY, "--model", f"hf:{tmp_path}", "--seq", "8", "--schedule",
                           "zbv", "-p", "2", "-m", "4", "--boundaries", "2,3,5", "--check",
                           "--json", "--warmup", "0", "--repeat", "1"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["grad_max_abs_diff"] < 1e-5  # float32, gradients summed in another order
    assert report["loss_abs_diff"] < 1e-5


def test_a_model_failing_its_first_call_on_one_rank_stops_every_rank(tmp_path):
    path = tmp_path / "picky.py"
    path.write_text(textwrap.dedent('''
        import os
        from torch import nn

        class Picky(nn.Linear):
            def forward(self, x):
                if os.environ.get("RANK") == "1":
                    raise RuntimeError("no accelerator on this rank")
                return super().forward(x)

        def build():
            return nn.Sequential(Picky(4, 4), Picky(4, 4))
    '''))
    t0 = time.monotonic()
    proc = subprocess.run([*ENTRY, "--model", f"{path}:build", "--input-shape", "4", "-p", "2",
                           "-m", "2", "--schedule", "1f1b", "--warmup", "0", "--repeat", "1"],
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("pipebubble: error: rank 1:")]
    assert len(errors) == 1 and "no accelerator on this rank" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 60
