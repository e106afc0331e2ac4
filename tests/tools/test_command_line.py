"""One way to read a command line: every command of lra_jax/tools parses its flags with absl through
`lra_jax.tools.parse_command_line`; --help exits 0, a bad flag is one line and exit 2.
(The trainer stays on absl's app.run with ml_collections' config flags: tests/tools/test_cli.py.)
"""

import ast
import importlib
import os
import subprocess
import sys

import pytest
from absl import flags

from lra_jax.config import paths as config_paths
from lra_jax.tools import parse_command_line

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


TOOLS = os.path.join(config_paths.REPO_ROOT, "lra_jax", "tools")
COMMANDS = sorted(name[:-3] for name in os.listdir(TOOLS) if name.endswith(".py") and name != "__init__.py")


def source(command: str) -> str:
    with open(os.path.join(TOOLS, f"{command}.py"), encoding="utf-8") as f:
        return f.read()


def test_the_commands_are_found():
    assert {"bench", "compile", "fits", "kernel_bench", "lower", "sweep", "table2", "tiling_sweep"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_its_command_line_through_the_one_helper(command):
    tree = ast.parse(source(command))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "argparse" not in imported, f"{command} parses with argparse"
    text = ast.unparse(tree)
    assert "sys.argv" not in text, f"{command} reads sys.argv by hand (parse_command_line reads it when argv is None)"
    assert "flags.FLAGS" not in text and "app.run" not in text, f"{command} uses absl's global flags or app.run"
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "parse_command_line"]
    assert len(calls) == 1, f"{command} should parse its command line with parse_command_line once"
    assert ast.literal_eval(calls[0].args[0]) == f"lra_jax.tools.{command}", "the helper names the command it parses"
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    assert main.args.defaults and ast.unparse(main.args.defaults[-1]) == "None", f"{command}.main(argv=None)"


def run_main(command: str, argv: list[str]) -> int:
    """The exit status of `command`'s main(argv), in-process, whether it returns it or exits with it."""
    try:
        returned = importlib.import_module(f"lra_jax.tools.{command}").main(argv)
    except SystemExit as exit_:
        return exit_.code
    return returned if isinstance(returned, int) else 0


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_0_and_lists_the_flags(command, capsys):
    assert run_main(command, ["--help"]) == 0
    out = capsys.readouterr().out
    assert f"usage: python -m lra_jax.tools.{command} [flags]" in out and "--help" in out
    assert out.startswith(importlib.import_module(f"lra_jax.tools.{command}").__doc__.strip().splitlines()[0])


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_flag_is_one_line_and_a_nonzero_exit(command, capsys):
    assert run_main(command, ["--nonesuch_flag=1"]) == 2
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and "nonesuch_flag" in errors[0], captured.err


def test_a_bad_value_names_the_flag(capsys):
    assert run_main("kernel_bench", ["--batch=four"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: flag --batch=four: invalid literal for int()"), errors


def define_example(values: flags.FlagValues) -> None:
    flags.DEFINE_string("head-dims", "32,64", "head dims", flag_values=values)
    flags.DEFINE_float("dropout-rate", 0.1, "rate", flag_values=values)
    flags.DEFINE_string("targets", "h100", "targets", flag_values=values)
    flags.DEFINE_bool("summary", False, "one line per target", flag_values=values)


def test_the_helper_keeps_hyphenated_names_both_value_forms_and_positionals_in_any_order():
    args, rest = parse_command_line("example", "An example.", define_example,
                                    ["a.json", "--head-dims=64", "--targets", "tpu-v3:4x4", "b.json", "--summary",
                                     "--", "--config.seed=1"], positionals="[FILE ...]")
    assert (args["head-dims"].value, args["dropout-rate"].value, args.targets, args.summary) == \
        ("64", 0.1, "tpu-v3:4x4", True)
    assert rest == ["a.json", "b.json", "--config.seed=1"]
    again, _ = parse_command_line("example", "An example.", define_example, [])  # a fresh parse: the defaults
    assert (again["head-dims"].value, again.summary) == ("32,64", False)


def test_the_helper_refuses_what_the_command_does_not_take(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_command_line("example", "An example.", define_example, ["stray.json"])
    assert exit_.value.code == 2 and "unexpected arguments: stray.json" in capsys.readouterr().err
    args, rest = parse_command_line("example", "An example.", define_example, ["--config.seed=1", "--summary"],
                                    positionals="[--config.KEY=VALUE ...]", pass_unknown=True)
    assert rest == ["--config.seed=1"] and args.summary


def test_a_command_run_as_a_module_refuses_a_bad_flag_in_one_line():
    done = subprocess.run([sys.executable, "-m", "lra_jax.tools.table2", "--bogus"], cwd=config_paths.REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: Unknown command line flag 'bogus' (python -m lra_jax.tools.table2 --help lists the flags)"]
