"""``run --data FILE``: a token file's windows in order, the loss it trains, and bad files.

What a person can check by hand: step k's batch is windows k*n .. k*n+n-1 of seq+1 tokens;
the loss of step 0 is the unsplit model's loss on the file's first windows; a model trained on
a file that repeats itself learns it (the loss falls far below ln(vocab), where random ids
keep it); every bad file is one line naming it, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from pipebubble.models import build_model, lm_loss
from pipebubble.runtime.data import TokenStream, read_tokens, use_data
from pipebubble.runtime.train import step_batch

TINY = ["--model", "transformer", "--layers", "2", "--dim", "16", "--heads", "2",
        "--vocab", "64", "--seq", "8", "--warmup", "0", "--repeat", "1"]


def tiny_model():
    return build_model("transformer", layers=2, dim=16, heads=2, vocab=64, seq=8, seed=0)


def repeating(path, period=45, copies=12, vocab=64, dtype=np.int32):
    """A file of one random stretch of ``period`` ids repeated: learnable data."""
    ids = np.tile(np.random.default_rng(0).integers(0, vocab, size=period), copies)
    np.save(path, ids.astype(dtype))
    return ids


def windows(ids, seq, first, n):
    """Windows first .. first+n-1 of seq+1 tokens, by hand (mod the whole windows)."""
    count = len(ids) // (seq + 1)
    rows = [ids[((first + i) % count) * (seq + 1):][: seq + 1] for i in range(n)]
    t = torch.tensor(np.array(rows), dtype=torch.long)
    return t[:, :-1], t[:, 1:]


# ---- the stream ----------------------------------------------------------------------------
def test_steps_read_consecutive_windows_and_wrap_around():
    ids = np.arange(100)  # 11 windows of 9 tokens; token 99 is left over
    s = TokenStream(ids, seq=8)
    assert s.windows == 11
    for step in range(5):  # 4 samples a step: steps 0, 1 are windows 0-7, step 2 wraps
        x, y = s.at_step(step, 4)
        ex, ey = windows(ids, 8, step * 4, 4)
        assert torch.equal(x, ex) and torch.equal(y, ey)
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert s.at_step(2, 4)[0][:, 0].tolist() == [72, 81, 90, 0]
    x0, _ = s(4, torch.Generator().manual_seed(123))  # as make_batch: step 0, any generator
    assert torch.equal(x0, s.at_step(0, 4)[0])
    # step_batch (every executor's batch of step k) asks the stream for step k
    assert torch.equal(step_batch(s, 4, seed=7, step=3)[0], s.at_step(3, 4)[0])


def test_replicas_slice_one_global_batch():
    """With --dp 2 a step's global batch is 2 x B windows; replica r takes rows r*B..: the two
    replicas read different, consecutive windows (worker.set_batch slices it so)."""
    ids = np.arange(400)
    s = TokenStream(ids, seq=8)
    x, _ = s.at_step(1, 2 * 4)  # step 1, B = 4, dp = 2
    first_tokens = x[:, 0].tolist()
    assert first_tokens[:4] == [72, 81, 90, 99] and first_tokens[4:] == [108, 117, 126, 135]


def test_bin_npy_and_dtypes(tmp_path):
    ids = np.array([5, 0, 65535, 7], dtype=np.uint16)
    (tmp_path / "a.bin").write_bytes(ids.tobytes())
    assert read_tokens(tmp_path / "a.bin").tolist() == ids.tolist()
    (tmp_path / "b.bin").write_bytes(np.array([1, 70000], dtype="<u4").tobytes())
    assert read_tokens(tmp_path / "b.bin", "uint32").tolist() == [1, 70000]
    np.save(tmp_path / "c.npy", np.array([[1, 2], [3, 4]], dtype=np.int64))
    assert read_tokens(tmp_path / "c.npy").tolist() == [1, 2, 3, 4]  # any shape, C order


def test_a_modelspec_lm_without_an_embedding_must_say_its_vocab(tmp_path):
    from torch import nn

    from pipebubble import ModelSpec
    from pipebubble.runtime.data import DataError

    def make_batch(n, gen):
        idx = torch.randint(0, 10, (n, 5), generator=gen)
        return idx, idx

    spec = ModelSpec("lm", [nn.Identity()], make_batch, lm_loss)
    np.save(tmp_path / "t.npy", np.arange(60) % 10)
    with pytest.raises(DataError, match="cannot tell the vocabulary.*metadata"):
        use_data(spec, str(tmp_path / "t.npy"), 2)
    spec.metadata = {"vocab": 10}
    with pytest.raises(DataError, match=r"60 tokens, too few for one step: 12 samples "
                       r"\(batch 6 x dp 2\) x \(seq 5 \+ 1\) = 72 tokens are needed"):
        use_data(spec, str(tmp_path / "t.npy"), 6, dp=2)
    x, y = use_data(spec, str(tmp_path / "t.npy"), 2).make_batch(2, None)
    assert x.tolist() == [[0, 1, 2, 3, 4], [6, 7, 8, 9, 0]]


# ---- the run -------------------------------------------------------------------------------
def run_json(run_cli, *args):
    rc, out, err = run_cli("run", "--local", *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_step_losses_are_the_unsplit_models_on_the_files_windows(run_cli, tmp_path):
    ids = repeating(tmp_path / "t.npy")
    out = run_json(run_cli, *TINY, "--schedule", "1f1b", "-p", "2", "-m", "2", "--batch", "4",
                   "--data", tmp_path / "t.npy", "--steps", "3", "--optimizer", "sgd",
                   "--lr", "0", "--check")
    model = torch.nn.Sequential(*tiny_model().layers)
    with torch.no_grad():  # lr 0: the weights stay; step k reads windows 4k .. 4k+3
        by_hand = [float(lm_loss(model(x), y)) for x, y in
                   (windows(ids, 8, 4 * k, 4) for k in range(3))]
    assert out["losses"] == pytest.approx(by_hand, abs=1e-5)
    assert out["reference_losses"] == pytest.approx(by_hand, abs=1e-5)
    assert len(set(np.round(by_hand, 4))) == 3  # three different batches


@pytest.mark.slow
def test_the_loss_falls_on_repeated_data_and_not_on_random_ids(run_cli, tmp_path):
    repeating(tmp_path / "t.npy")
    common = [*TINY, "--schedule", "1f1b", "-p", "2", "-m", "2", "--batch", "8",
              "--steps", "20", "--lr", "0.01"]
    data = run_json(run_cli, *common, "--data", tmp_path / "t.npy")["losses"]
    rand = run_json(run_cli, *common)["losses"]
    assert data[0] > 3.5 and rand[0] > 3.5  # ~ln(64) = 4.16 at the start, both
    assert data[-1] < 0.5 * data[0]  # measured: 4.43 -> 0.92
    assert min(rand) > 3.5  # random ids: nothing to learn


@pytest.mark.slow
def test_hf_model_on_text_with_its_own_tokenizer(run_cli, tmp_path):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    words = "the quick brown fox jumps over a lazy dog".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", *words])},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "llama"
    LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    text = " ".join(words * 30)
    (tmp_path / "story.txt").write_text(text)
    ids = read_tokens(tmp_path / "story.txt", tokenizer_dir=folder)
    assert ids[:9].tolist() == list(range(1, 10)) and len(ids) == 270
    out = run_json(run_cli, "--model", f"hf:{folder}", "--seq", "8", "--batch", "4",
                   "--schedule", "1f1b", "-p", "2", "-m", "2", "--data", tmp_path / "story.txt",
                   "--steps", "12", "--lr", "0.01", "--warmup", "0", "--repeat", "1")
    assert out["losses"][-1] < 0.5 * out["losses"][0]


@pytest.mark.slow
@pytest.mark.distributed
def test_every_rank_and_replica_reads_the_global_batch_over_gloo(tmp_path):
    """Over processes with --dp 2: the pipeline's losses are the unsplit model's on the
    global batch of each step (2 x 4 windows), so each replica read its own half of it."""
    ids = repeating(tmp_path / "t.npy")
    proc = subprocess.run(
        [sys.executable, "-m", "pipebubble", "run", *TINY, "--schedule", "1f1b", "-p", "2",
         "-m", "2", "--dp", "2", "--batch", "4", "--data", str(tmp_path / "t.npy"),
         "--steps", "2", "--optimizer", "sgd", "--lr", "0", "--check", "--json"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    model = torch.nn.Sequential(*tiny_model().layers)
    with torch.no_grad():
        by_hand = [float(lm_loss(model(x), y)) for x, y in
                   (windows(ids, 8, 8 * k, 8) for k in range(2))]
        half = float(lm_loss(model(windows(ids, 8, 0, 4)[0]), windows(ids, 8, 0, 4)[1]))
    assert out["losses"] == pytest.approx(by_hand, abs=1e-5)
    assert abs(half - by_hand[0]) > 1e-3  # one replica's half alone is not the step's loss


# ---- bad input -----------------------------------------------------------------------------
def _bad(run_cli, tmp_path, name, content, *extra, model=TINY):
    path = tmp_path / name
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif content is not None:
        path.write_bytes(content)
    rc, out, err = run_cli("run", "--local", *model, "--schedule", "1f1b", "-p", "2", "-m",
                           "2", "--batch", "4", "--data", path, *extra)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert name in lines[0]
    return lines[0]


def test_bad_files_are_one_line_naming_the_file(run_cli, tmp_path):
    assert "empty" in _bad(run_cli, tmp_path, "e.npy", b"")
    assert "empty" in _bad(run_cli, tmp_path, "e0.npy", np.zeros(0, dtype=np.int64))
    assert "empty" in _bad(run_cli, tmp_path, "e.bin", b"")
    msg = _bad(run_cli, tmp_path, "short.npy", np.arange(35))  # 4 x 9 = 36 needed
    assert "35 tokens, too few for one step" in msg and "36 tokens are needed" in msg
    msg = _bad(run_cli, tmp_path, "f.npy", np.zeros(100, dtype=np.float32))
    assert "float32" in msg and "integers" in msg
    msg = _bad(run_cli, tmp_path, "big.npy", np.array([3] * 50 + [64, 70] + [1] * 50))
    assert "largest token id, 70," in msg and "vocabulary of 64" in msg and "0..63" in msg
    assert "negative" in _bad(run_cli, tmp_path, "neg.npy", np.array([-1] + [0] * 50))
    msg = _bad(run_cli, tmp_path, "odd.bin", b"\x01\x00\x02")
    assert "not a whole number of uint16 tokens" in msg and "--data-dtype" in msg
    assert "not a .npy array" in _bad(run_cli, tmp_path, "junk.npy", b"not numpy at all")
    assert "tokenizer" in _bad(run_cli, tmp_path, "t.txt", b"some text, no tokenizer")
    (tmp_path / "dir.npy").mkdir()
    assert "is a directory" in _bad(run_cli, tmp_path, "dir.npy", None)
    assert "cannot read" in _bad(run_cli, tmp_path, "missing.npy", None)
    os.mkfifo(tmp_path / "fifo.bin")
    assert "not a regular file" in _bad(run_cli, tmp_path, "fifo.bin", None)
    msg = _bad(run_cli, tmp_path, "ok.npy", np.arange(100) % 8, model=["--width", "8"])
    assert "causal LM" in msg and "mlp" in msg


def test_a_resumed_run_reads_on_from_the_checkpoints_step(run_cli, tmp_path):
    """3 steps in one run, or 2 saved and 1 resumed: the same third batch and loss."""
    repeating(tmp_path / "t.npy")
    common = [*TINY, "--schedule", "1f1b", "-p", "2", "-m", "2", "--batch", "4",
              "--data", tmp_path / "t.npy", "--optimizer", "sgd", "--lr", "0.05"]
    whole = run_json(run_cli, *common, "--steps", "3")["losses"]
    first = run_json(run_cli, *common, "--steps", "2", "--save", tmp_path / "ck")["losses"]
    rest = run_json(run_cli, *common, "--steps", "1", "--resume", tmp_path / "ck")["losses"]
    assert first + rest == pytest.approx(whole, abs=1e-5)
    assert len(set(np.round(whole, 4))) == 3


def test_dualpipe_two_chains_read_one_batch_as_the_unsplit_model(run_cli, tmp_path):
    repeating(tmp_path / "t.npy")
    out = run_json(run_cli, *TINY, "--schedule", "dualpipe", "-p", "2", "-m", "4",
                   "--batch", "8", "--data", tmp_path / "t.npy", "--steps", "2", "--check")
    assert out["losses"] == pytest.approx(out["reference_losses"], abs=1e-5)
