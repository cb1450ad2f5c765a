"""Every ``pipebubble ...`` command in README.md's shell blocks runs and exits 0.

The commands are read from the README itself (continuation lines joined, comments dropped),
so an example that stops working fails here. They run in this process through
``pipebubble.cli.main``, in order, in one temporary directory (later examples read the files
earlier ones write: ``zbv.csv``, ``profile.json``), each under an alarm so that none can run
away. The files a README command reads but no README command writes (``timeline.json``, a
measured run) are made first by the fixture.

Distributed runs (``run`` without ``--local``) start one process per rank with the command
line of a real ``pipebubble`` process, which an in-process call cannot be; they are skipped
here with that reason, and ``tests/test_distributed.py`` runs the same code paths.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
from pathlib import Path

import pytest

from pipebubble.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
LIMIT_S = 300  # per command; a runaway example fails instead of hanging the suite


def readme_commands(text: str) -> list[str]:
    """``pipebubble ...`` lines of shell code blocks (sh, bash, console or unmarked),
    continuation backslashes joined, in order."""
    out, inside, lang, pending = [], False, "", ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            inside, lang = (False, "") if inside else (True, s[3:].strip())
            continue
        if not inside or lang not in ("sh", "bash", "console", "shell", ""):
            continue
        if pending:
            s = pending + " " + s
            pending = ""
        elif not s.startswith("pipebubble "):
            continue
        if s.endswith("\\"):
            pending = s[:-1].strip()
            continue
        out.append(s)
    return out


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_commands():
    assert len(COMMANDS) >= 20
    assert any("--boundaries" in c for c in COMMANDS)


def _argv(command: str) -> list[str]:
    return shlex.split(command, comments=True)[1:]


def _distributed(argv: list[str]) -> bool:
    return argv[:1] == ["run"] and "--local" not in argv


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
        out = io.StringIO()  # a measured 4-stage run of a 14-layer transformer: timeline.json
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(["run", "--local", "--schedule", "1f1b", "-p", "4", "-m", "8",
                         "--model", "transformer", "--layers", "12", "--boundaries", "2,7,12",
                         "--repeat", "1", "--json"]) == 0
        Path("timeline.json").write_text(out.getvalue())
        _write_readme_model_files()
        yield d
    finally:
        os.chdir(old)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(_argv(c))[:60])
def test_readme_command_runs(command, workdir, monkeypatch, capsys):
    argv = _argv(command)
    if argv[:1] == ["explore"]:
        pytest.skip("explore serves pages until stopped; tests/ for the explorer run it")
    if _distributed(argv):
        pytest.skip("distributed run: one process per rank over gloo (seconds each); "
                    "tests/test_distributed.py runs such launches")
    if any(a.startswith("hf:") for a in argv) and not Path("tiny-llama").is_dir():
        pytest.skip("HuggingFace examples need transformers (pip install 'pipebubble[hf]')")
    if argv[:1] == ["plan"] and "--validate" in argv:
        pytest.skip("plan --validate runs each plan over gloo (tens of seconds); "
                    "tests/test_plan_cli.py::test_validate_runs_the_top_plan runs it")
    monkeypatch.setenv("COLUMNS", "100")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        rc = main(argv)
    except SystemExit as exc:  # --help
        rc = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    captured = capsys.readouterr()
    assert rc in (0, None), captured.err
    assert "Traceback" not in captured.err
    for flag in ("--png", "--svg", "--trace", "--out"):
        if flag in argv:
            path = argv[argv.index(flag) + 1]
            assert Path(path).stat().st_size > 0, path
            assert f"wrote {path}" in captured.err or f"wrote {path}" in captured.out


# ---- the README's Python snippets -----------------------------------------------------------

def python_blocks(text: str) -> list[str]:
    """The ``python`` code blocks of the README, in order."""
    out, inside, lang, lines = [], False, "", []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            if inside and lang == "python":
                out.append("\n".join(lines) + "\n")
            inside, lang, lines = (False, "", []) if inside else (True, s[3:].strip(), [])
            continue
        if inside:
            lines.append(line)
    return out


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def _write_readme_model_files() -> None:
    """The files the "Your own model" commands read, made by the README's own snippets:
    ``my_model.py`` (the block that starts with that name) and the ``tiny-llama`` config (the
    block that saves it; skipped without transformers, and the commands with it)."""
    for block in BLOCKS:
        if block.startswith("# my_model.py"):
            Path("my_model.py").write_text(block)
        elif "save_pretrained(" in block:
            try:
                exec(compile(block, "README.md", "exec"), {})
            except ImportError:
                pass


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
