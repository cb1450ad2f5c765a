"""Every ``pipebubble ...`` command and every Python snippet of README.md runs, in order.

The README is read as a fresh clone's user reads it: the shell blocks' ``pipebubble`` lines
(continuation lines joined, comments dropped) and the ``python`` blocks, interleaved in the
order they appear, run one after another in one temporary directory, so a later step finds
only the files earlier steps wrote (``zbv.csv``, ``profile.json``, ``timeline.json``,
``my_model.py``, ``tiny-llama``); nothing is made for them first. A block whose first line is
``# NAME.py`` is that file: it is written, as a user would save it. Commands run in this
process through ``pipebubble.cli.main`` (``> FILE`` writes the command's standard output
there), each under an alarm so that none can run away; snippets are ``exec``-uted.

The heavy kinds run once each in their smallest form, or are skipped with the reason and the
test that covers them:

- distributed runs (``run`` without ``--local``) start one process per rank: the one with
  the fewest processes runs for real (``python -m pipebubble`` in the same directory, marked
  ``distributed``); the others are skipped (``tests/test_distributed.py`` runs them);
- ``explore --port 0 --no-browser`` serves for real in a subprocess until the page and one
  API answer have come back; plain ``explore`` (a fixed port, a browser) is skipped;
- ``plan --validate`` runs each plan over gloo and exits 1 when the loaded machine misses its
  prediction: skipped, run by ``tests/test_plan_cli.py::test_validate_runs_the_top_plan`` and
  judged by ``tests/test_validate_verdict.py``;
- the torchrun script under "torch's engine": skipped, launched on 2 ranks by
  ``tests/test_torch_engine.py::test_readme_example_runs_and_trains_like_the_unsplit_model``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipebubble.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
LIMIT_S = 300  # per command; a runaway example fails instead of hanging the suite
SHELL = ("sh", "bash", "console", "shell", "")


def readme_steps(text: str) -> list[tuple[str, str]]:
    """``("sh", command)`` for every ``pipebubble ...`` line of a shell block (continuation
    backslashes joined) and ``("python", code)`` for every python block, in README order."""
    out: list[tuple[str, str]] = []
    inside, lang, pending, lines = False, "", "", []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            if inside and lang == "python":
                out.append(("python", "\n".join(lines) + "\n"))
            inside, lang, lines = (False, "", []) if inside else (True, s[3:].strip(), [])
            continue
        if not inside:
            continue
        if lang == "python":
            lines.append(line)
            continue
        if lang not in SHELL:
            continue
        if pending:
            s = pending + " " + s
            pending = ""
        elif not s.startswith("pipebubble "):
            continue
        if s.endswith("\\"):
            pending = s[:-1].strip()
            continue
        out.append(("sh", s))
    return out


STEPS = readme_steps(README.read_text(encoding="utf-8"))
COMMANDS = [c for kind, c in STEPS if kind == "sh"]
BLOCKS = [c for kind, c in STEPS if kind == "python"]


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 20
    assert any("--boundaries" in c for c in COMMANDS)


def _argv(command: str) -> list[str]:
    return shlex.split(command, comments=True)[1:]


def _distributed(argv: list[str]) -> bool:
    return argv[:1] == ["run"] and "--local" not in argv


def _processes(argv: list[str]) -> int:
    def flag(*names: str, default: int = 1) -> int:
        for n in names:
            if n in argv:
                return int(argv[argv.index(n) + 1])
        return default

    return flag("--ranks", "-p", default=4) * flag("--dp")


# the one distributed run that runs for real: the fewest processes, the first of those
_DIST = [c for c in COMMANDS if _distributed(_argv(c))]
DISTRIBUTED_RUN = min(_DIST, key=lambda c: _processes(_argv(c))) if _DIST else None


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"over {LIMIT_S} s")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    old = os.getcwd()
    os.chdir(d)
    try:
        yield d
    finally:
        os.chdir(old)


def _param(kind: str, text: str):
    first = text.strip().splitlines()[0] if text.strip() else ""
    name = (" ".join(_argv(text))[:60] if kind == "sh" else "python: " + first[:50])
    marks = [pytest.mark.distributed] if kind == "sh" and text == DISTRIBUTED_RUN else []
    return pytest.param(kind, text, id=name, marks=marks)


@contextlib.contextmanager
def _limit():
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind,text", [_param(k, t) for k, t in STEPS])
def test_readme_step_runs(kind, text, workdir, monkeypatch, capsys):
    if kind == "python":
        run_snippet(text)
    else:
        run_command(text, monkeypatch, capsys)


def run_snippet(code: str) -> None:
    first = code.strip().splitlines()[0]
    if first.startswith("# ") and first[2:].strip().endswith(".py"):
        Path(first[2:].strip()).write_text(code)  # a file the user saves
        return
    if "init_process_group" in code:
        pytest.skip("a torchrun script (one process per rank); tests/test_torch_engine.py::"
                    "test_readme_example_runs_and_trains_like_the_unsplit_model launches it")
    if "transformers" in code:
        pytest.importorskip("transformers")
    with _limit(), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


def run_command(command: str, monkeypatch, capsys) -> None:
    argv = _argv(command)
    if argv[:1] == ["explore"]:
        if "--no-browser" not in argv or "--port" not in argv:
            pytest.skip("explore on its fixed port opens a browser; the same server runs in "
                        "the README's `explore --port 0 --no-browser` step")
        return run_explore(argv)
    if any(a.startswith("hf:") for a in argv) and not all(
            Path(a[3:]).exists() for a in argv if a.startswith("hf:")):
        pytest.skip("HuggingFace examples need transformers (pip install 'pipebubble[hf]')")
    if argv[:1] == ["plan"] and "--validate" in argv:
        pytest.skip("plan --validate runs each plan over gloo and exits 1 when this loaded "
                    "machine misses a prediction; tests/test_plan_cli.py::"
                    "test_validate_runs_the_top_plan runs one, tests/test_validate_verdict.py "
                    "judges the verdicts")
    if _distributed(argv):
        if command != DISTRIBUTED_RUN:
            pytest.skip("distributed run: one process per rank over gloo (seconds each); the "
                        "README's smallest one ran, tests/test_distributed.py runs such "
                        "launches")
        return run_subprocess(argv)
    target = None
    if ">" in argv:  # a shell redirect: the command's standard output into the file
        k = argv.index(">")
        argv, target = argv[:k], argv[k + 1]
    monkeypatch.setenv("COLUMNS", "100")
    with _limit():
        try:
            rc = main(argv)
        except SystemExit as exc:  # --help
            rc = exc.code
    captured = capsys.readouterr()
    assert rc in (0, None), captured.err
    assert "Traceback" not in captured.err
    if target is not None:
        Path(target).write_text(captured.out)
        assert Path(target).stat().st_size > 0, target
    for flag in ("--png", "--svg", "--trace", "--out"):
        if flag in argv:
            path = argv[argv.index(flag) + 1]
            assert Path(path).stat().st_size > 0, path
            assert f"wrote {path}" in captured.err or f"wrote {path}" in captured.out


def _env() -> dict:
    src = str(Path(__file__).resolve().parent.parent / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1"}


def run_subprocess(argv: list[str]) -> None:
    """A distributed run as the user starts it: ``pipebubble`` is its own launcher."""
    proc = subprocess.run([sys.executable, "-m", "pipebubble", *argv], capture_output=True,
                          text=True, timeout=LIMIT_S, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def run_explore(argv: list[str]) -> None:
    """Serve until the page and one simulation have come back, then stop the server."""
    import json
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "pipebubble", *argv], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline().strip()
        assert first.startswith("serving http://127.0.0.1:"), first + proc.stderr.read()
        url = first.split()[1]
        with urllib.request.urlopen(url, timeout=60) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
        query = "api/simulate?schedule=1f1b&ranks=2&microbatches=4&f=1&b=2"
        with urllib.request.urlopen(url + query, timeout=60) as r:
            assert json.loads(r.read())["step_time"] == 15.0  # (m + p - 1)(f + b)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---- the README's Python snippets -----------------------------------------------------------

def snippet_imports(block: str) -> list[tuple[str, str | None]]:
    """(module, name) for every ``from M import a, b`` and ``import M`` of a snippet."""
    import ast

    out = []
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
    return out


def test_the_readme_has_python_snippets():
    assert len(BLOCKS) >= 4
    assert any(m == "pipebubble" and n == "ModelSpec" for b in BLOCKS
               for m, n in snippet_imports(b))


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.strip().splitlines()[0][:50])
def test_every_name_a_readme_snippet_imports_exists(block):
    import importlib

    for module, name in snippet_imports(block):
        if module.split(".")[0] == "transformers":
            pytest.importorskip("transformers")
        mod = importlib.import_module(module)
        if name is not None:
            assert hasattr(mod, name), f"README imports {name} from {module}, which has none"


def _resolves(dotted: str) -> bool:
    """Whether ``pipebubble.a.b.c`` names a module, or an attribute chain from one."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_dotted_name_the_readme_mentions_exists():
    import re

    text = README.read_text(encoding="utf-8")
    names = set(re.findall(r"`(pipebubble(?:\.[A-Za-z_]\w*)+)", text))
    names -= {n for n in names if n.endswith((".json", ".csv"))}  # file names, not modules
    names |= set(re.findall(r"python -m (pipebubble(?:\.\w+)+)", text))
    assert len(names) >= 5
    missing = sorted(n for n in names if not _resolves(n))
    assert missing == [], f"README names {missing}, which do not exist"
