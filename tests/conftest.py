"""Shared test set-up: one torch thread, hypothesis profiles, and ``run_cli``.

``auto``'s search is bounded by a ledger of counted work and reads no clock unless a
deadline is asked for (``schedules/auto/budget.py``), so no test's result depends on how
loaded the machine is (CI: two cores, ``pytest -n 2``) without any setting here.

Markers (registered in pyproject.toml, ``--strict-markers``): ``slow`` (a test that takes
seconds: a real process, a launch, a real model step) and ``distributed`` (launches several
processes over torch.distributed). ``make test`` runs the tests with neither marker,
``make test-heavy`` the rest, and CI (``.ci/run``) both::

    .venv/bin/python -m pytest -m "not slow and not distributed"   # what make test runs
"""

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from pipebubble.cli import main

# CI has 2 cores: keep torch to one thread per process, and hypothesis quick but thorough.
torch.set_num_threads(1)
settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# No test writes into the checkout: a command that writes where it runs (plan's torch CSVs,
# profile's --out default) runs in tmp_path (monkeypatch.chdir). The session compares the
# repository root before and after (the tools' caches aside) and fails naming what appeared.
ROOT = Path(__file__).resolve().parent.parent
TOOL_CACHES = {".pytest_cache", ".hypothesis", "__pycache__", ".ruff_cache", ".coverage"}
_root_before: set[str] = set()


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # (the controller, or a run without -n)
        _root_before.update(os.listdir(ROOT))


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or not _root_before:
        return
    stray = sorted(set(os.listdir(ROOT)) - _root_before - TOOL_CACHES)
    if stray:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"tests wrote into the checkout's root: {', '.join(stray)} "
                                "(run the command in tmp_path: monkeypatch.chdir)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def run_cli(capsys):
    """Run ``pipebubble ARGS...`` in this process: ``run_cli(*args) -> (rc, out, err)``.

    The command runs through :func:`pipebubble.cli.main` exactly as the installed entry point
    does, without a new interpreter (each one would import torch again, seconds apiece). A
    bug raising inside the command propagates and fails the test with its traceback; only
    user errors come back as ``rc == 2``.
    """

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()  # drop what the test printed before
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run
