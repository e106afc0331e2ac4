"""The console scripts: every one in pyproject.toml names a function its module defines, that takes no
arguments and that `python -m` runs too; one entry point run as the installed script would run it.
(The import layering is tests/test_layering.py.)
"""

import ast
import os
import re
import subprocess
import sys
import tomllib

import pytest

from lra_jax.config import paths as config_paths


def test_console_scripts_name_the_commands():
    with open(os.path.join(config_paths.REPO_ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert {"lra-train", "lra-bench", "lra-sweep", "lra-chart"} <= set(scripts)
    for script, target in scripts.items():
        module, function = target.split(":")
        path = os.path.join(config_paths.REPO_ROOT, *module.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        defined = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function]
        assert len(defined) == 1, f"{script}: {module} should define {function} once, not {len(defined)} times"
        assert not defined[0].args.args, f"{script}: {module}.{function} must take no arguments"
        main_block = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
        assert main_block and re.search(rf"\b{function}\(\)", ast.unparse(main_block[0])), \
            f"{script}: `python -m {module}` should run {function}() too"


@pytest.mark.slow
def test_a_console_script_entry_runs_the_command(tmp_path):
    code = ("import sys; sys.argv = ['lra-sweep', '--variants=nonesuch', '--dry_run'];"
            "from lra_jax.tools.sweep import cli; cli()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [config_paths.REPO_ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "error: unknown variant nonesuch" in done.stderr, done.stderr[-2000:]


def test_every_command_has_a_short_name_and_the_readme_lists_it():
    """Every module of lra_jax/tools (and the trainer, the data preparation) is a console script, and
    the README's command table names each module beside its script: "every command is a module, also
    installed under a short name" stays true as commands are added."""
    with open(os.path.join(config_paths.REPO_ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    modules = {target.split(":")[0]: script for script, target in scripts.items()}
    tools = os.path.join(config_paths.REPO_ROOT, "lra_jax", "tools")
    commands = {"lra_jax.train", "lra_jax.data.prepare"} | {
        f"lra_jax.tools.{name[:-3]}" for name in os.listdir(tools) if name.endswith(".py") and name != "__init__.py"}
    assert commands - set(modules) == set(), f"commands without a console script: {sorted(commands - set(modules))}"
    with open(os.path.join(config_paths.REPO_ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for module, script in modules.items():
        assert f"| `python -m {module}` | `{script}` |" in readme, f"README's command table lacks {module} ({script})"
