"""``profile --analytic --hf-config``: an MoE config's ``max_position_embeddings`` bounds
``--seq`` as a dense config's does.

Found by the generated fuzz (tests/fuzz_cases.py, the hf surface): ``--seq 65`` on a mixtral
or qwen2_moe config with 64 positions was profiled (exit 0), while llama refused it.
"""

from __future__ import annotations

import json

import pytest

MOE = {
    "mixtral": {"model_type": "mixtral", "vocab_size": 40, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 64,
                "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"model_type": "qwen2_moe", "vocab_size": 40, "hidden_size": 16,
                  "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "max_position_embeddings": 64, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                  "shared_expert_intermediate_size": 16},
}


@pytest.mark.parametrize("family", sorted(MOE))
def test_seq_beyond_the_positions_is_refused(run_cli, tmp_path, family):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MOE[family]))
    argv = ["profile", "--analytic", "--hf-config", str(path), "--json", "--seq"]
    rc, out, err = run_cli(*argv, "65")
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"pipebubble: error: --seq 65 is longer than the model's max_position_embeddings 64 "
        f"(--hf-config {path}); use --seq 1..64"]
    rc, out, err = run_cli(*argv, "64")
    assert rc == 0, err
    assert json.loads(out)["hf_config"]["keys"]["max_position_embeddings"] == 64
