"""The run's default cut (runtime/cut.py): balanced by the layers' cost, any layer count.

Checked against things a person can redo by hand: the brute-force best cut of the counted
FLOPs, the unsplit model's gradients in float64, the sleep model's stated seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json

import pytest
import torch
from torch import nn

from pipebubble.cli import main
from pipebubble.models import build_model
from pipebubble.runtime.cut import choose_cut, layer_flops

SMALL = ["--width", "8", "--warmup", "0", "--repeat", "1"]


def _run_json(capsys, *args: str) -> dict:
    assert main(["run", "--local", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("ranks, chunks, want", [(2, "1", [3]), (3, "1", [2, 5]),
                                                 (2, "2", [1, 3, 5])])
def test_seven_layers_run_on_any_stage_count_with_exact_gradients(capsys, ranks, chunks, want):
    # 7 equal MLP blocks: the slowest stage holds ceil(7 / S) blocks; float64 agrees with
    # the unsplit model to rounding
    schedule = "1f1b" if chunks == "1" else "interleaved-1f1b"
    out = _run_json(capsys, "--schedule", schedule, "-p", str(ranks), "-m", str(2 * ranks),
                    "--chunks", chunks, "--layers", "7", "--dtype", "float64", "--check",
                    *SMALL)
    assert out["boundaries"] == want and out["cut_by"] == "FLOPs"
    edges = [0, *want, 7]
    assert max(b - a for a, b in zip(edges, edges[1:], strict=False)) == -(-7 // len(edges[1:]))
    assert out["grad_max_abs_diff"] < 1e-12 and out["loss_abs_diff"] < 1e-12
    assert out["check"]["passed"]


def test_the_header_says_the_cut_and_boundaries_reproduce_it(capsys):
    args = ["--schedule", "gpipe", "-p", "2", "-m", "2", "--layers", "5", "--chart-width", "80",
            *SMALL]
    assert main(["run", "--local", *args]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the title wraps at the console's width
    assert "cut --boundaries 2 (balanced by FLOPs)" in text
    out = _run_json(capsys, *args[:-8], *SMALL, "--boundaries", "2")  # the same cut, given
    assert out["boundaries"] == [2] and out["cut_by"] == "given"
    out = _run_json(capsys, *args[:-8], *SMALL, "--boundaries", "4")  # given wins
    assert out["boundaries"] == [4]


def test_more_stages_than_layers_is_one_line(capsys):
    assert main(["run", "--local", "--schedule", "1f1b", "-p", "4", "-m", "4", "--layers", "2",
                 *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "the model has 2 layers, fewer than the 4 stages" in err and "at most 2" in err


def test_the_flop_cut_is_the_brute_force_best():
    # the transformer's head outweighs a block: every cut is tried by hand
    spec = build_model("transformer", layers=4, dim=16, heads=2, vocab=256, seq=8, seed=0)
    flops = layer_flops(spec.layers, spec.make_batch(2, torch.Generator().manual_seed(0))[0])
    assert flops[0] == 0 and flops[-1] > flops[1] > 0  # embedding: a lookup; head: a matmul
    n = len(flops)
    for S in (2, 3, 4):
        cut = choose_cut(spec.layers, S, make_batch=spec.make_batch)

        def worst(cuts):
            edges = [0, *cuts, n]
            return max(sum(flops[a:b]) for a, b in zip(edges, edges[1:], strict=False))

        best = min(worst(c) for c in itertools.combinations(range(1, n), S - 1))
        assert cut.by == "FLOPs" and worst(cut.boundaries) == best


def test_sleep_model_is_cut_by_its_stated_seconds():
    spec = build_model("sleep", layers=4, width=2, f=[0.03, 0.01, 0.01, 0.01],
                       b=[0.06, 0.02, 0.02, 0.02], w=0.0)
    assert choose_cut(spec.layers, 2).boundaries == [1]  # 0.09 | 0.09
    assert choose_cut(spec.layers, 2).by == "sleep times"


def test_counting_leaves_the_model_as_it_was():
    torch.manual_seed(1)
    layers = [nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 4)]
    x = torch.randn(3, 4)
    before = torch.random.get_rng_state()
    layer_flops(layers, x)
    assert torch.equal(torch.random.get_rng_state(), before)  # dropout drew nothing
    assert float(layers[1].running_mean.abs().max()) == 0.0  # no statistics updated
    assert all(m.training for m in layers)


def test_every_path_cuts_alike():
    # the distributed workers' own build (self-check, benchmarks) and the run's set-up
    from pipebubble.commands._run_setup import build_setup
    from pipebubble.runtime.dist.worker import DistConfig, build

    cfg = DistConfig("1f1b", 3, 3, model="transformer",
                     model_args={"layers": 5, "dim": 16, "heads": 2, "vocab": 64, "seq": 4})
    _, _, stages = build(cfg)
    args = argparse.Namespace(schedule="1f1b", ranks=3, microbatches=3, chunks=None,
                              model="transformer", layers=5, width=16, heads=2, vocab=64, seq=4,
                              batch=3, boundaries=None, seed=0, device="cpu")
    setup = build_setup(args)
    assert [len(s.layers) for s in stages] == [len(s.layers) for s in setup.stages]
    assert setup.cut_by == "FLOPs"
