"""The published runs are data files beside the bench (bench/published/, one per source):
every file is read, names its source, and gives the steps plan/published.py prices."""

import shutil
import tomllib

import pytest

from pipebubble.plan import published as P


def test_every_file_is_read_and_names_its_source():
    files = {p.stem for p in P.DATA.glob("*.toml")}
    assert files == {*P.RUN_FILES, P.TABLE1_FILE}  # none left unread
    for name in files:
        with open(P.DATA / f"{name}.toml", "rb") as f:
            assert tomllib.load(f)["reference"].strip()
    runs = P.published_runs()
    assert all(r.source and r.name for r in runs)
    assert len({(r.source, r.name) for r in runs}) == len(runs)
    assert [r.name for r in P.TABLE1][3] == "18.4B" and len(P.TABLE1) == 10


def test_steps_follow_the_metric_by_hand():
    runs = {r.name: r for r in P.published_runs()}
    t1 = runs["8B FSDP 8"]  # tokens/s per GPU: 16 x 8192 tokens over 5,762 x 8
    assert t1.step == pytest.approx(16 * 8192 / (5762 * 8))
    assert runs["530B 2240"].step == 60.1  # the published iteration time itself
    neox = runs["20B"]  # gpt-neox's get_flops of 2022 at 117 TFLOP/s on 96 GPUs
    h, L, s, N = 6144, 44, 2048, 20_556_201_984
    assert neox.step == pytest.approx(1536 * s * (6 * N + 60 * s * h * L) / (96 * 117e12))


def test_an_unknown_step_rule_is_named(tmp_path):
    for name in P.RUN_FILES:
        shutil.copy(P.DATA / f"{name}.toml", tmp_path / f"{name}.toml")
    path = tmp_path / "bloom_176b.toml"
    path.write_text(path.read_text().replace('step_from = "seconds"', 'step_from = "guess"'))
    with pytest.raises(ValueError, match="run '176B': unknown step_from 'guess'"):
        P.load_runs(tmp_path)
    with pytest.raises(FileNotFoundError, match="bench/published"):
        P.load_table1(tmp_path)
