import json

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.models import transformer
from pipebubble.plan.profile import (
    LayerProfile,
    Profile,
    ProfileError,
    profile_layers,
    resolve_timer,
)


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(16, 16), nn.GELU()), nn.Linear(16, 16))


def test_profile_counts_by_hand():
    model = tiny()
    prof = profile_layers(model, torch.randn(4, 16), warmup=0, repeats=3)
    first, second = prof.layers
    assert [x.name for x in prof.layers] == ["0", "1"]
    assert first.type == "Sequential" and second.type == "Linear"
    assert first.params == second.params == 16 * 16 + 16
    # Forward 2·4·16·16 = 2048 FLOPs per Linear. Backward: the weight gradient (2048), plus
    # the input gradient (2048) except for the first layer, whose input needs none.
    assert first.flops == 2048 + 2048
    assert second.flops == 2048 + 2048 + 2048
    # Saved for the backward: Linear keeps its input, GELU its input; 4 x 16 fp32 each.
    assert first.activation_bytes == 2 * 4 * 16 * 4
    assert second.activation_bytes == 4 * 16 * 4
    assert all(x.forward > 0 and x.backward > 0 for x in prof.layers)
    assert prof.metadata["batch_shape"] == [4, 16] and prof.metadata["repeats"] == 3
    assert all(p.grad is None for p in model.parameters())  # the profiler cleans up


def test_embedding_has_params_and_no_flops():
    spec = transformer(layers=1, dim=8, heads=2, vocab=32, seq=4)
    x, y = spec.make_batch(2, torch.Generator().manual_seed(0))
    prof = profile_layers(spec.layers, x, target=y, loss_fn=spec.loss_fn, warmup=0, repeats=1)
    emb, block, head = prof.layers
    assert emb.params == 32 * 8 + 4 * 8 and emb.flops == 0
    assert emb.activation_bytes == x.nbytes  # the token ids, kept to scatter the gradient
    assert block.flops > 0 and head.flops > 0
    # Head: Linear(8, 32) on 2 x 4 tokens: forward 2·8·8·32, backward twice that.
    assert head.flops == 3 * 2 * 8 * 8 * 32
    assert [x.type for x in prof.layers] == ["Embedding", "Block", "Head"]


def test_timer_choice():
    assert resolve_timer("wall", "cpu") == "wall"
    assert resolve_timer("auto", "cuda") == "wall"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert resolve_timer("auto", "cpu") == "cpu"
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ProfileError, match="unknown timer 'gpu'"):
        resolve_timer("gpu")


def test_json_round_trip(tmp_path):
    prof = profile_layers(tiny(), torch.randn(2, 16), warmup=0, repeats=1,
                          metadata={"note": "round trip"})
    path = tmp_path / "p.json"
    prof.save(path)
    back = Profile.load(path)
    assert back == prof
    assert back.metadata["note"] == "round trip" and back.metadata["device"] == "cpu"
    # Per-layer keys the format does not know are kept too.
    data = json.loads(path.read_text())
    data["layers"][0]["recompute"] = True
    again = Profile.from_dict(data)
    assert again.layers[0].extra == {"recompute": True}
    assert again.as_dict()["layers"][0]["recompute"] is True


GOOD = {"name": "a", "forward": 1e-3, "backward": 2e-3, "params": 10, "activation_bytes": 64,
        "flops": 100}


@pytest.mark.parametrize("data, needle", [
    ([GOOD], "a profile must be a JSON object with a 'layers' list, got list"),
    ({"layers": {}}, "'layers' must be a list, got dict"),
    ({"layers": []}, "profile has no layers"),
    ({"layers": [{**GOOD, "backward": -1}]},
     "layer 0 ('a'): backward must be a finite number >= 0 (seconds), got -1"),
    ({"layers": [{**GOOD, "flops": "many"}]}, "flops must be a finite number >= 0"),
    ({"layers": [{**GOOD, "params": 2.5}]}, "params must be a whole number, got 2.5"),
    ({"layers": [{**GOOD, "forward": float("nan")}]}, "forward must be a finite number"),
    ({"layers": [GOOD, {k: v for k, v in GOOD.items() if k not in ("params", "flops")}]},
     "layer 1 ('a') is missing 'params', 'flops'"),
    ({"layers": [GOOD, GOOD]}, "layer 1: name 'a' appears twice"),
    ({"layers": [{**GOOD, "name": ""}]}, "name must be a non-empty string"),
])
def test_bad_profiles_name_the_value(data, needle):
    with pytest.raises(ProfileError) as exc:
        Profile.from_dict(data)
    assert needle in str(exc.value)


def test_empty_layer_list_rejected_directly():
    with pytest.raises(ProfileError, match="no layers"):
        Profile([])
    with pytest.raises(ProfileError, match="no layers to profile"):
        profile_layers([], torch.randn(1, 1))


def test_load_errors(tmp_path):
    with pytest.raises(ProfileError, match="not found"):
        Profile.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        Profile.load(tmp_path / "x.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")  # not even text
    with pytest.raises(ProfileError, match=r"bin.json': not UTF-8 text \(byte 0xff at offset 0"):
        Profile.load(tmp_path / "bin.json")


def test_cli_profile_writes_a_loadable_file(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "mlp", "--layers", "3", "--width", "8", "--batch", "2",
                 "--warmup", "0", "--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MLPBlock" in text and "total" in text
    prof = Profile.load(out)
    assert len(prof) == 3 and prof.metadata["model"] == "mlp"
    assert prof.metadata["model_args"] == {"seed": 0, "layers": 3, "width": 8}
    assert [x.params for x in prof.layers] == [8 * 8 + 8] * 3
    assert main(["partition", "--profile", str(out), "-p", "3", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert all(len(p["stages"]) == 3 for p in plans)


@pytest.mark.parametrize("args, needle", [
    (["--model", "resnet"], "unknown model 'resnet'; valid are mlp, transformer"),
    (["--model", "mlp", "--vocab", "10"], "--vocab does not apply to model mlp"),
    (["--model", "mlp", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--model", "mlp", "--batch", "0"], "--batch must be >= 1, got 0"),
])
def test_cli_profile_bad_input(args, needle, run_cli):
    code, out, err = run_cli("profile", *args)
    assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_layer_time_is_forward_plus_backward():
    assert LayerProfile("x", 1.5, 2.5, 0, 0, 0).time == 4.0
