"""The layering: kernels -> attention -> models -> trainer -> train and tools.

Nothing in attention/, kernels/, models/ or data/ imports the trainer, `train` or a command;
data/ imports no model code; a reader never imports its generator. Checked on the source with
`ast`, so an import inside a function counts as much as one at the top. Also: every console
script in pyproject.toml names a function its module defines and runs as `python -m`.
"""

import ast
import os
import re
import subprocess
import sys
import tomllib

import pytest

from lra_jax.config import paths as config_paths

PACKAGE = os.path.join(config_paths.REPO_ROOT, "lra_jax")
LOWER_LAYERS = ("attention", "kernels", "models", "data")
ABOVE = ("lra_jax.training.trainer", "lra_jax.train", "lra_jax.tools")
MODEL_CODE = ("lra_jax.models", "lra_jax.attention", "lra_jax.kernels")


def imported_modules(source: str, module: str) -> set[str]:
    """Every module `source` (the code of `module`, dotted) imports, anywhere in it; for
    `from a import b`, both a and a.b (b may be a module)."""
    found = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules_of(layer: str) -> dict[str, str]:
    """dotted module name -> source, for every .py file under lra_jax/<layer>/."""
    out = {}
    for root, _, files in os.walk(os.path.join(PACKAGE, layer)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                dotted = os.path.relpath(path[:-3], config_paths.REPO_ROOT).replace(os.sep, ".")
                with open(path, encoding="utf-8") as f:
                    out[dotted.removesuffix(".__init__")] = f.read()
    return out


def test_the_import_scan_sees_lazy_relative_and_from_imports():
    source = ("def f():\n    from lra_jax import trainer\n"
              "def g():\n    import lra_jax.tools.sweep\n"
              "from ..tools import bench\n")
    found = imported_modules(source, "lra_jax.data.x")
    assert {"lra_jax.training.trainer", "lra_jax.tools.sweep", "lra_jax.tools.bench"} <= found
    assert all(is_under(n, ABOVE) for n in ("lra_jax.training.trainer", "lra_jax.tools.sweep"))
    assert not is_under("lra_jax.training_data", ABOVE)


@pytest.mark.parametrize("layer", LOWER_LAYERS)
def test_lower_layers_import_neither_the_trainer_nor_a_command(layer):
    modules = modules_of(layer)
    assert modules, layer
    bad = {m: sorted(n for n in imported_modules(src, m) if is_under(n, ABOVE)) for m, src in modules.items()}
    assert {m: names for m, names in bad.items() if names} == {}


def test_data_imports_no_model_code_and_no_reader_imports_its_generator():
    modules = modules_of("data")
    for module, source in modules.items():
        names = imported_modules(source, module)
        assert not [n for n in names if is_under(n, MODEL_CODE)], module
        generator = f"{module}_generator"
        if generator in modules:
            assert generator not in names, f"{module} imports {generator}: tasks decides generate-or-read"


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


def test_a_console_script_entry_runs_the_command(tmp_path):
    code = ("import sys; sys.argv = ['lra-sweep', '--variants=nonesuch', '--dry_run'];"
            "from lra_jax.tools.sweep import cli; cli()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [config_paths.REPO_ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "error: unknown variant nonesuch" in done.stderr, done.stderr[-2000:]
