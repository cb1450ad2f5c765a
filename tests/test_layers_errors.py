"""Library errors speak the library's words: no command-line flag in a library error message.

Library code names a parameter by its library name, marked (``pipebubble.errors.param``),
and only the command line writes the flag (``commands/_flags.py``). This test reads the
source (ast) of every module outside ``commands/`` and ``cli.py`` and fails on any error
built with a flag in its text: a ``raise`` whose exception's arguments hold a string with
``--name`` in it, or a call of an exception class (``UserError``, ``ParamError``, any class
named ``...Error``) that does, wherever it stands (``self.error = CheckpointError(...)``).
Text built elsewhere and passed in (``where = ...``) is not seen: review catches those.
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

import pipebubble
from pipebubble.commands._flags import FLAGS, flag
from pipebubble.errors import ParamError, UserError, marked, param
from pipebubble.params import PARAMS

ROOT = Path(pipebubble.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

ALLOWED: dict[str, str] = {
    # module (under src/pipebubble) -> why its error messages may still name flags
}


def _library_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("commands/") or rel == "cli.py":
            continue
        out.append((rel, path))
    return out


def _is_error_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name.endswith("Error") or name in ("Deadlock", "TooLarge", "NoPlanFits",
                                              "LimitTooSmall")


def _flags_in(node: ast.AST) -> list[str]:
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            found += FLAG.findall(n.value)
    return found


def flagged_errors(source: str) -> list[tuple[int, list[str]]]:
    """(line, flags) of every error built with a flag in its text, in ``source``."""
    hits = {}
    for node in ast.walk(ast.parse(source)):
        exc = node.exc if isinstance(node, ast.Raise) else node if _is_error_call(node) else None
        if isinstance(exc, ast.Call):
            flags = _flags_in(exc)
            if flags:
                hits[exc.lineno] = sorted(set(flags))
    return sorted(hits.items())


def test_the_detector_sees_a_flag_in_an_error_and_nothing_else():
    bad = ('def f(n):\n'
           '    if n < 1:\n'
           '        raise UserError(f"--steps must be >= 1, got {n}")\n'
           '    e = CheckpointError("give a folder written by run --save")\n'
           '    return "python -m x --help"  # not an error\n')
    assert flagged_errors(bad) == [(3, ["--steps"]), (4, ["--save"])]
    good = 'raise ParamError(f"{param(\'steps\')} must be >= 1, got -1 (a --- rule)")\n'
    assert flagged_errors(good) == []


def test_no_library_module_writes_a_flag_into_an_error():
    found = []
    for rel, path in _library_modules():
        if any(rel.startswith(prefix) for prefix in ALLOWED):
            continue
        found += [f"{rel}:{line}: {' '.join(flags)}"
                  for line, flags in flagged_errors(path.read_text(encoding="utf-8"))]
    assert not found, ("library errors name parameters (errors.param), not flags; "
                       "commands/_flags.py writes the flag:\n" + "\n".join(found))


TEXT_ALLOWED: dict[str, str] = {  # module -> why a module-level text there holds flags
    "params.py": "PARAMS is the explorer's parameter table: each parameter's flag, by design",
    "plan/settings.py": "torchtitan's own flags (--job.config_file), another tool's command line",
}


def flagged_texts(source: str) -> list[tuple[int, list[str]]]:
    """(line, flags) of every module-level assignment (a string, a table of them) and every
    function default holding a flag: text that an error is later built from (``what =
    "--hf-config"``, ``_FLAGS = {...}``), which :func:`flagged_errors` cannot see."""
    tree = ast.parse(source)
    values = [n.value for n in tree.body
              if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None]
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            values += n.args.defaults + [d for d in n.args.kw_defaults if d is not None]
    return sorted((v.lineno, sorted(set(f))) for v in values if (f := _flags_in(v)))


def test_the_text_detector_sees_a_flag_table_and_a_flag_default():
    bad = ('_FLAGS = {"memory": ("--gpu-memory", 1.0)}\n'
           'def read(path, what="--hf-config"):\n'
           '    """Read it (as --hf-config does)."""\n'
           '    note = "--inside a body is not seen"\n')
    assert flagged_texts(bad) == [(1, ["--gpu-memory"]), (2, ["--hf-config"])]
    good = ('"""The module doc may show --gpu."""\n_RANGES = {"memory": ("gpu_memory", 1.0)}\n'
            'def read(path, what=param("hf_config")):\n    pass\n')
    assert flagged_texts(good) == []


def test_no_library_module_keeps_flags_in_its_tables_or_defaults():
    found = [f"{rel}:{line}: {' '.join(flags)}" for rel, path in _library_modules()
             if rel not in TEXT_ALLOWED
             for line, flags in flagged_texts(path.read_text(encoding="utf-8"))]
    assert not found, ("library text an error is built from names parameters "
                       "(errors.param), not flags:\n" + "\n".join(found))
    for rel in TEXT_ALLOWED:  # the list only shrinks
        assert flagged_texts((ROOT / rel).read_text(encoding="utf-8")), rel


def test_the_allow_list_is_still_needed():
    """An entry whose modules no longer name flags in errors goes (the list only shrinks)."""
    for prefix in ALLOWED:
        hits = [rel for rel, path in _library_modules() if rel.startswith(prefix)
                and flagged_errors(path.read_text(encoding="utf-8"))]
        assert hits, f"{prefix} names no flag in an error any more: drop it from ALLOWED"


def test_params_has_no_argparse():
    tree = ast.parse((ROOT / "params.py").read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "argparse" not in imported


def test_a_marked_name_reads_as_the_name_and_renders_as_the_flag():
    exc = ParamError(f"{param('model_args')} depth: not a parameter; give {param('steps')}")
    assert str(exc) == "model_args depth: not a parameter; give steps"
    assert exc.params == ("model_args", "steps")
    assert exc.render(flag) == "--model-arg depth: not a parameter; give --steps"
    # a value in the message is never taken for a name: !r escapes the mark
    sneaky = UserError(f"{param('data')} {chr(0) + 'x' + chr(0)!r}: empty")
    assert sneaky.params == ("data",) and "--x" not in sneaky.render(flag)
    # a flag passed by older code stays as it is; a message without marks is unchanged
    assert UserError(f"{param('--gpu')} h100").render(flag) == "--gpu h100"
    assert UserError("plain").render(flag) == str(UserError("plain")) == "plain"
    assert marked(exc).count("\0") == 4


def test_the_flag_table_agrees_with_the_parameter_table():
    """The explorer writes a parameter as PARAMS gives its flag, the CLI as FLAGS or the
    default rule does: one spelling for each name."""
    for key, p in PARAMS.items():
        assert flag(key) == p.flag, key
    for name, f in FLAGS.items():
        assert f != "--" + name.replace("_", "-"), f"{name}: the default rule gives {f} already"


def _options(parser: argparse.ArgumentParser, out: set[str]) -> set[str]:
    for action in parser._actions:
        out.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _options(sub, out)
    return out


def test_every_name_a_library_error_marks_is_some_command_flag():
    """A name marked with ``param("...")`` in library code is written by the CLI as a flag
    that exists (``hardware`` -> ``--gpu``, ``grad_bytes`` -> ``--grad-wire-bytes``): a
    missing entry in the flag table would print a flag no command takes."""
    from pipebubble.cli import build_parser

    options = _options(build_parser(), set())
    missing = []
    for rel, path in _library_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and (getattr(node.func, "id", None) == "param"
                         or getattr(node.func, "attr", None) == "param")
                    and flag(node.args[0].value) not in options):
                missing.append(f"{rel}:{node.lineno}: {node.args[0].value} -> "
                               f"{flag(node.args[0].value)}")
    assert not missing, "no command has these flags:\n" + "\n".join(missing)


def _refusal(call) -> UserError:
    with pytest.raises(UserError) as info:
        call()
    return info.value


def test_the_planner_library_names_its_parameters_and_the_cli_its_flags():
    """A caller of the planner's functions reads the names it passed; the CLI reads flags."""
    from pipebubble.plan.analytic import profile_rate
    from pipebubble.plan.axes import splits
    from pipebubble.plan.config import parse_config
    from pipebubble.plan.fit import fit_efficiency
    from pipebubble.plan.hardware import get_hardware
    from pipebubble.plan.hfconfig import read_hf_config
    from pipebubble.plan.layercosts import ProfileSet
    from pipebubble.plan.memory import model_states
    from pipebubble.plan.plans import Request
    from pipebubble.plan.sharding import check_reshard
    from pipebubble.plan.shardings import Sharding

    def req(**kw):
        return Request(gpus=8, gpu_memory=2**34, global_batch=8, **kw).check()

    cases = [  # (call, the library's message, the CLI's message)
        (lambda: parse_config("tp=2,pp=4", 12),
         "config tp=2 x pp=4 = 8 GPUs does not divide gpus 12; tp x cp x pp x dp must "
         "equal gpus",
         "--config tp=2 x pp=4 = 8 GPUs does not divide --gpus 12; tp x cp x pp x dp must "
         "equal --gpus"),
        (lambda: req(grad_bytes=-1.0), "grad_bytes must be >= 0, got -1.0",
         "--grad-wire-bytes must be >= 0, got -1.0"),
        (lambda: req(dp_overlap="yes"), "dp_overlap must be on or off, got 'yes'",
         "--dp-overlap must be on or off, got 'yes'"),
        (lambda: req(max_chunks=10**9), "max_chunks must be", "--max-chunks must be"),
        (lambda: get_hardware("h1000"), "unknown gpu 'h1000'; valid are",
         "unknown --gpu 'h1000'; valid are"),
        (lambda: ProfileSet([]), "profiles: give at least one profile",
         "--profile: give at least one profile"),
        (lambda: fit_efficiency(lambda e: 1 / e, -1.0),
         "measured must be a finite number of seconds > 0, got -1.0",
         "--measured-step must be a finite number of seconds > 0, got -1.0"),
        (lambda: check_reshard("sometimes"), "unknown fsdp_reshard 'sometimes'",
         "unknown --fsdp-reshard 'sometimes'"),
        (lambda: profile_rate(0, 1, None, None, "bf16", "flash"),
         "seq must be an integer >= 1, got 0", "--seq must be an integer >= 1, got 0"),
        (lambda: replace(get_hardware("h100-sxm"), nics_per_node=0).check(),
         "nics_per_node must be an integer >= 1", "--nics-per-node must be an integer >= 1"),
        (lambda: replace(get_hardware("h100-sxm"), memory=0.5).check(),
         "gpu_memory must be a number in [1, 1e+18] bytes",
         "--gpu-memory must be a number in [1, 1e+18] bytes"),
        (lambda: replace(get_hardware("h100-sxm"), peak_flops=1.0).check(),
         "peak_tflops must be a number in", "--peak-tflops must be a number in"),
        (lambda: model_states(2.0, 0.0), "gradient_bytes must be a finite number of bytes > 0",
         "--grad-bytes must be a finite number of bytes > 0"),
        (lambda: model_states(2.0, 2.0, -1.0), "optimizer_bytes must be a finite number",
         "--optimizer-bytes must be a finite number"),
        (lambda: Sharding.of("zero4"), "unknown sharding 'zero4'", "unknown --sharding 'zero4'"),
        (lambda: read_hf_config("/nonexistent/config.json"), "cannot read hf_config",
         "cannot read --hf-config"),
        (lambda: splits(Request(gpus=12, gpu_memory=1, global_batch=8, tp=(8,)), (8,), (1,)),
         "tp 8 does not divide gpus 12; tp x cp x pp x dp must equal gpus",
         "--tp 8 does not divide --gpus 12; tp x cp x pp x dp must equal --gpus"),
    ]
    for call, library, cli in cases:
        exc = _refusal(call)
        assert str(exc).startswith(library), (str(exc), library)
        assert "--" not in str(exc), str(exc)
        assert exc.render(flag).startswith(cli), (exc.render(flag), cli)
