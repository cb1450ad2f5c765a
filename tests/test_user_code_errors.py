"""The model's own code kept in its box: the ModelSpec contract checked up front, a failure of
the builder, a layer, ``make_batch`` or the loss at any step one line naming where (exit 2),
the model's ``print()`` on stderr while ``--json`` owns stdout, the pre-flight check bounded,
and flags that do not apply to the model refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pipebubble.errors import UserError
from pipebubble.models.loader import load_model
from pipebubble.usercode import UserCodeError, describe, user_code

MODELS = '''
import sys
import time

import torch
from torch import nn
from pipebubble import ModelSpec


def _batch(n, g):
    return torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)


def _spec(name, layers, make_batch=_batch, loss=nn.functional.mse_loss):
    return ModelSpec(name, layers, make_batch, loss)


def good():
    return _spec("good", [nn.Linear(4, 4), nn.Linear(4, 4)])


def pair_as_list():
    return _spec("pl", [nn.Linear(4, 4), nn.Linear(4, 4)], lambda n, g: list(_batch(n, g)))


def triple():
    return _spec("tr", [nn.Linear(4, 4), nn.Linear(4, 4)], lambda n, g: (*_batch(n, g), None))


def not_tensors():
    return _spec("nt", [nn.Linear(4, 4), nn.Linear(4, 4)], lambda n, g: ([0.0] * n, [0.0] * n))


def wrong_rows():
    return _spec("wr", [nn.Linear(4, 4), nn.Linear(4, 4)], lambda n, g: (torch.randn(n + 1, 4),
                                                        torch.randn(n + 1, 4)))


def detached_loss():
    return _spec("dl", [nn.Linear(4, 4), nn.Linear(4, 4)],
                 loss=lambda o, t: nn.functional.mse_loss(o, t).detach())


def vector_loss():
    return _spec("vl", [nn.Linear(4, 4), nn.Linear(4, 4)], loss=lambda o, t: (o - t).pow(2))


def not_a_module():
    return _spec("nm", [nn.Linear(4, 4), torch.tanh])


def all_frozen():
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    a.requires_grad_(False)
    b.requires_grad_(False)
    return _spec("af", [a, b])


def frozen_first():
    a = nn.Linear(4, 4)
    a.requires_grad_(False)
    return _spec("ff", [a, nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)])


def exits():
    sys.exit()


def exits3():
    sys.exit(3)


class Boom(nn.Module):
    """Raises an exception without a message on its ``at``-th forward call."""

    def __init__(self, at, exit=False):
        super().__init__()
        self.lin, self.at, self.calls, self.exit = nn.Linear(4, 4), at, 0, exit

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            if self.exit:
                sys.exit(5)
            raise RuntimeError()
        return self.lin(x)


def boom(at: int = 4, exit: bool = False):
    return _spec("boom", [nn.Linear(4, 4), Boom(at, exit)])


class _Fails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise ArithmeticError("no gradient today")


class FailsBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return _Fails.apply(self.lin(x))


def fails_backward():
    return _spec("fb", [nn.Linear(4, 4), FailsBackward()])


def batch_fails_later():
    def make_batch(n, g):
        if g.initial_seed() > 1:  # the check's seed is 0, step 0's is seed + 1 = 1
            raise ValueError("the data ran out")
        return _batch(n, g)
    return _spec("bf", [nn.Linear(4, 4), nn.Linear(4, 4)], make_batch)


def loss_fails():
    calls = [0]

    def loss(o, t):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyError("label")
        return nn.functional.mse_loss(o, t)
    return _spec("lf", [nn.Linear(4, 4), nn.Linear(4, 4)], loss=loss)


class Talks(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        print("hello from forward")
        return self.lin(x)


def talks():
    print("hello from the builder")

    def make_batch(n, g):
        print("hello from make_batch")
        return _batch(n, g)
    return _spec("talks", [nn.Linear(4, 4), Talks()], make_batch)


class Hangs(nn.Module):
    def forward(self, x):
        while True:
            time.sleep(0.05)


def hangs():
    return _spec("hangs", [nn.Linear(4, 4), Hangs()])


def seq():
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
'''

LOCAL = ["run", "--local", "--schedule", "1f1b", "-p", "2", "-m", "2", "--warmup", "0",
         "--repeat", "1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("usercode") / "models.py"
    path.write_text(textwrap.dedent(MODELS))
    return path


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("pipebubble: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---- 1. the contract, up front ---------------------------------------------------------------
@pytest.mark.parametrize(("name", "words"), [
    ("triple", "make_batch(2, generator) returned a tuple of 3; it must return (inputs, "
     "targets)"),
    ("not_tensors", "returned inputs of type list; they must be a torch.Tensor"),
    ("wrong_rows", "returned inputs of shape (3, 4); dimension 0 must be the 2 samples"),
    ("detached_loss", "loss_fn returned a loss without a gradient"),
    ("vector_loss", "loss_fn must return one number (a 1-element tensor), got a tensor of "
     "shape (2, 4)"),
    ("not_a_module", "layer 1 is a builtin_function_or_method, not an nn.Module"),
    ("all_frozen", "has no trainable parameter"),
])
def test_a_broken_contract_is_one_line_before_any_step(run_cli, models, name, words):
    rc, out, err = run_cli(*LOCAL, "--model", f"{models}:{name}")
    assert rc == 2 and out == ""
    assert words in one_error_line(err)


def test_a_pair_given_as_a_list_is_a_pair(models):
    spec = load_model(f"{models}:pair_as_list")
    x, y = spec.make_batch(3, torch.Generator().manual_seed(0))
    assert x.shape == (3, 4) and y.shape == (3, 4)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_a_first_stage_without_trainable_parameters_trains_like_the_unsplit_model(
        run_cli, models, schedule):
    """Allowed: its backward has nothing to do (no graph: the input needs no gradient and no
    weight is trained); the pipeline still matches the unsplit model after 2 steps."""
    rc, out, err = run_cli("run", "--local", "--schedule", schedule, "-p", "2", "-m", "2",
                           "--warmup", "0", "--repeat", "1", "--model", f"{models}:frozen_first",
                           "--boundaries", "1", "--steps", "2", "--check", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["grad_max_abs_diff"] < 1e-6 and got["param_max_abs_diff"] < 1e-6
    assert all(v == v for v in got["losses"])


# ---- 2. a failure at any step: one line naming where ----------------------------------------
@pytest.mark.parametrize(("name", "code"), [("exits", 0), ("exits3", 3)])
def test_sys_exit_in_the_builder_is_an_error_not_a_silent_success(run_cli, models, name, code):
    rc, out, err = run_cli(*LOCAL, "--model", f"{models}:{name}", "--json")
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert f"the model builder {models}:{name} raised SystemExit (exit code {code})" in line


def test_a_layer_failing_at_a_later_step_names_layer_stage_rank_and_step(run_cli, models):
    # Boom's forward calls: 1 in the up-front check, then 2 per step (2 microbatches): the
    # 4th is step 1's first microbatch. Its RuntimeError has no message: the cause is its type.
    rc, out, err = run_cli(*LOCAL, "--model", f"{models}:boom", "--steps", "3", "--json")
    assert rc == 2 and out == ""
    assert one_error_line(err) == (
        "pipebubble: error: model 'boom': layer 1 ('1', Boom) raised RuntimeError during the "
        "forward of microbatch 0 (stage 1, rank 1, step 1)")


def test_sys_exit_in_a_forward_is_an_error(run_cli, models):
    rc, _, err = run_cli(*LOCAL, "--model", f"{models}:boom", "--model-arg", "at=2",
                         "--model-arg", "exit=true")
    assert rc == 2
    assert "layer 1 ('1', Boom) raised SystemExit (exit code 5)" in one_error_line(err)
    assert "(stage 1, rank 1, step 0)" in err


def test_a_failing_backward_names_the_stage_and_the_phase(run_cli, models):
    rc, _, err = run_cli(*LOCAL, "--model", f"{models}:fails_backward")
    assert rc == 2
    line = one_error_line(err)
    assert "raised ArithmeticError: no gradient today during the backward of microbatch" in line
    assert "(stage 1, rank 1, step 0)" in line


def test_make_batch_failing_at_a_later_step_names_the_step(run_cli, models):
    rc, _, err = run_cli(*LOCAL, "--model", f"{models}:batch_fails_later", "--steps", "2")
    assert rc == 2
    assert one_error_line(err) == (
        "pipebubble: error: model 'bf': make_batch(16, generator) raised ValueError: the data "
        "ran out (step 1)")


def test_a_failing_loss_names_the_last_stage(run_cli, models):
    # loss calls: 1 in the check, then one per microbatch: the 3rd is step 0's second one
    rc, _, err = run_cli(*LOCAL, "--model", f"{models}:loss_fails")
    assert rc == 2
    assert one_error_line(err) == (
        "pipebubble: error: model 'lf': loss_fn raised KeyError: 'label' during the loss "
        "(stage 1, rank 1, step 0)")


def test_the_cause_is_never_empty():
    assert describe(RuntimeError()) == "RuntimeError"
    assert describe(RuntimeError("  ")) == "RuntimeError"
    assert describe(SystemExit("bye\nnow")) == "SystemExit: bye now"
    with pytest.raises(UserCodeError, match=r"^the builder raised OSError \(step 3\)$"):
        with user_code("the builder", step=3):
            raise OSError()
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C is never the model's error
        with user_code("the builder"):
            raise KeyboardInterrupt


def test_a_bug_of_ours_is_not_blamed_on_the_model():
    """An exception from pipebubble's own code keeps its type and traceback (a bug): here a
    backward run before its forward fails inside the interpreter, not inside the model."""
    from pipebubble.ir.schedule import Action, Kind
    from pipebubble.runtime.clock import VirtualClock
    from pipebubble.runtime.interpreter import StageInterpreter
    from pipebubble.runtime.transport import LocalTransport
    from pipebubble.usercode import is_ours

    interp = StageInterpreter(rank=0, modules={0: torch.nn.Linear(4, 4)}, num_stages=1,
                              stage_to_rank=[0], transport=LocalTransport(),
                              clock=VirtualClock(1), loss_fn=torch.nn.functional.mse_loss,
                              loss_weights=[1.0], num_microbatches=1)
    with pytest.raises(KeyError) as info:
        interp.run(Action(0, Kind.B, 0))
    assert is_ours(info.value)
    try:
        torch.zeros(2) @ torch.zeros(3)  # torch's error, raised for the model's code
    except RuntimeError as exc:
        assert not is_ours(exc)


# ---- 3. the model's print() goes to stderr ---------------------------------------------------
def test_the_models_prints_go_to_stderr_and_json_owns_stdout(run_cli, models):
    rc, out, err = run_cli(*LOCAL, "--model", f"{models}:talks", "--json")
    assert rc == 0, err
    assert json.loads(out)["schedule"] == "1f1b"
    for who in ("the builder", "make_batch", "forward"):
        assert f"hello from {who}" in err


# ---- 5. flags that do not apply are refused --------------------------------------------------
@pytest.mark.parametrize("flag", [["--input-shape", "4"], ["--input-dtype", "float32"]])
def test_input_flags_are_refused_for_a_model_that_makes_its_own_batches(run_cli, models, flag):
    rc, _, err = run_cli(*LOCAL, "--model", f"{models}:good", *flag)
    assert rc == 2
    assert f"{flag[0]} applies to an nn.Sequential model only" in one_error_line(err)
    assert "is a ModelSpec" in err
    rc, _, err = run_cli(*LOCAL, "--model", "hf:/no/such/config.json", *flag)
    assert rc == 2 and "is a HuggingFace model" in one_error_line(err)


def test_the_input_flags_still_describe_an_nn_sequential(models):
    spec = load_model(f"{models}:seq", input_shape="4", input_dtype="float32")
    assert spec.make_batch(3, torch.Generator())[0].shape == (3, 4)


def test_too_large_an_input_shape_is_one_line_before_allocating(run_cli, models):
    rc, _, err = run_cli(*LOCAL, "--model", f"{models}:seq", "--input-shape", "100000,100000")
    assert rc == 2
    assert one_error_line(err).endswith(
        "--input-shape 100000,100000 is 10,000,000,000 elements per sample, over the limit "
        "of 16,777,216; use a smaller shape")
    with pytest.raises(UserError, match="over 10\\^30"):
        load_model(f"{models}:seq", input_shape=",".join(["9" * 40] * 2))


@pytest.mark.parametrize("spec", ["/tmp/{long}.py:build", "hf:/tmp/{long}"])
def test_a_path_name_over_name_max_is_one_line(run_cli, spec):
    rc, _, err = run_cli(*LOCAL, "--model", spec.format(long="a" * 300))
    assert rc == 2
    assert "name too long for the file system" in one_error_line(err)


# ---- distributed: the same lines from real processes ------------------------------------------
DIST = [sys.executable, "-m", "pipebubble", "run", "--schedule", "1f1b", "-p", "2", "-m", "2",
        "--warmup", "0", "--repeat", "1"]


def _launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*DIST, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("engine", ["pipebubble", "torch"])
def test_a_layer_failing_in_a_worker_is_one_line_from_one_rank(models, engine):
    # Each rank builds and checks its own copy: Boom's 4th call is step 1's first forward
    # (torch's runtime runs one forward more, to learn the stage's output shape: step 0).
    proc = _launch("--model", f"{models}:boom", "--steps", "3", "--json", "--engine", engine)
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_error_line(proc.stderr)
    step = 1 if engine == "pipebubble" else 0
    assert line.startswith("pipebubble: error: model 'boom': layer 1 ('1', Boom) raised "
                           "RuntimeError during the forward of microbatch ")
    assert line.endswith(f"(stage 1, rank 1, step {step})")


@pytest.mark.slow
@pytest.mark.distributed
def test_the_workers_prints_go_to_stderr(models):
    proc = _launch("--model", f"{models}:talks", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["world_size"] == 2
    assert "hello from forward" in proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_the_preflight_check_of_a_forward_that_never_returns_ends_in_one_line(models):
    proc = _launch("--model", f"{models}:hangs", "--action-timeout", "1", timeout=60)
    assert proc.returncode == 2
    assert "did not finish its pre-flight check in the launcher" in one_error_line(proc.stderr)
    assert "within 1 s (--action-timeout)" in proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_sys_exit_in_the_builder_of_a_distributed_run(models):
    proc = _launch("--model", f"{models}:exits")
    assert proc.returncode == 2
    assert "raised SystemExit (exit code 0)" in one_error_line(proc.stderr)
