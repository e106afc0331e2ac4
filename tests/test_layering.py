"""The package's import contract: layers import only downwards, no circles, no hidden imports.

Layers, bottom up (a module may import its own layer and those below it, never above):

    errors, compat, provenance,    the base every layer may use (progress: progress bars)
    progress
    kernels                        Pallas kernels beside their references
    attention                      the variants (the attention contract)
    models                         encoder, heads, classifier
    data                           tasks, readers, generators (no model code: independent of the three above)
    config                         ConfigDict -> typed, validated settings
    training                       trainer, steps, optimizer, checkpoints, run directory
    measure                        step timing and profiles, FLOPs, peaks, compile targets, fit planning
    research                       the library under the commands, in sub-layers of its own (RESEARCH):
                                   benchmarks, compilation, sweeps, reports
    tools, train                   the commands: flags over a library module

The config layer is the boundary of a run's settings: `config.settings.from_config` reads a ConfigDict once
into typed, frozen Settings. The layers under the commands that build or compare configs (config,
research, tools, train) may hold a ConfigDict; every other layer takes Settings (or their typed parts)
and never names ConfigDict or imports ml_collections.

A function-local import hides an edge from this picture (it is how the old circles survived), so an
import inside a function or class is allowed only for a module outside the package that is an optional
heavy dependency, with a comment on its line or the line above saying so.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "lra_jax"
REPO = PACKAGE.parent
BASE = {"errors", "compat", "provenance", "progress", "__init__"}
LAYERS = ["kernels", "attention", "models", "data", "config", "training", "measure", "research", "tools"]
RANK = {name: rank for rank, name in enumerate(LAYERS)} | {"train": len(LAYERS) - 1}
INDEPENDENT = {"data": {"kernels", "attention", "models"}}  # data imports no model code
RESEARCH = ["benchmarks", "compilation", "sweeps", "reports"]  # research's sub-layers, bottom up


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """The lra_jax modules an import statement names (`from lra_jax import a` names lra_jax.a)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "lra_jax"]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing package
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "lra_jax":
        return []
    submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in KNOWN]
    # `from package import module` uses the module; a name that is no module is taken from `base` itself
    return submodules + ([base] if len(submodules) < len(node.names) else [])


def edges(known: set[str]) -> dict[str, set[str]]:
    """Module -> the lra_jax modules it imports (names that are not modules, such as functions, dropped)."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= {t for t in imported(node, name, path.name == "__init__.py") if t in known and t != name}
        graph[name] = targets
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


KNOWN = {module_name(p) for p in PACKAGE.rglob("*.py")}
GRAPH = edges(KNOWN)


def test_the_package_root_holds_at_most_eight_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 8, f"lra_jax/ holds {len(root)} modules: {root}; put new ones in a sub-package"


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({layer(m) for m in KNOWN} - BASE - set(RANK))
    assert not unknown, f"modules outside the layers of this test: {unknown}; add them to LAYERS in its docstring order"


def test_imports_go_only_downwards():
    upward = []
    for importer, targets in GRAPH.items():
        for target in targets:
            source, dest = layer(importer), layer(target)
            if dest in BASE or source == dest:
                continue
            if source in BASE:
                upward.append(f"{importer} -> {target} (the base imports no layer)")
            elif RANK[dest] > RANK[source] or dest in INDEPENDENT.get(source, ()) \
                    or source in INDEPENDENT.get(dest, ()):
                upward.append(f"{importer} -> {target}")
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))


def test_research_sub_packages_import_only_downwards():
    """Within research: a sub-package imports only those below it in RESEARCH, and research's own shared
    modules (`choices`, `progress`); the shared modules import no sub-package."""
    def sub(module):
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "research" else None  # lra_jax.research.<sub>.<module>

    upward = [f"{importer} -> {target}" for importer, targets in GRAPH.items() if layer(importer) == "research"
              for target in targets if layer(target) == "research" and sub(target) and (
                  sub(importer) is None or RESEARCH.index(sub(target)) > RESEARCH.index(sub(importer)))]
    assert {m.split(".")[2] for m in KNOWN if sub(m)} == set(RESEARCH)
    assert not upward, "research imports against its sub-layers:\n" + "\n".join(sorted(upward))


def test_no_module_name_in_two_places():
    """A name means one thing among the commands and their library: no module of tools/ and research/ shares
    its file name with another (a command's library is named for what it holds, not like the command). The
    kernels' sub-packages share a layout on purpose (api, reference, pallas_gpu, ...)."""
    seen = {}
    for path in sorted([*(PACKAGE / "tools").rglob("*.py"), *(PACKAGE / "research").rglob("*.py")]):
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(str(path.relative_to(REPO)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"module names used twice (rename one): {twice}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module (the import circles)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle():
    circles = strongly_connected(GRAPH)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_function_local_import_of_the_package_or_without_a_reason():
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(scope):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
                if getattr(node, "level", 0) or any(n.split(".")[0] == "lra_jax" for n in names):
                    hidden.append(f"{where}: {', '.join(names)} (import it at the top of the module)")
                elif not any("#" in lines[i] for i in (node.lineno - 2, node.lineno - 1) if i >= 0):
                    hidden.append(f"{where}: {', '.join(names)} (say which optional dependency it is, in a comment)")
    assert not hidden, "function-local imports:\n" + "\n".join(sorted(set(hidden)))


CONFIG_HOLDERS = {"config", "research", "tools"}  # and train, the command


@pytest.mark.parametrize("name", [n for n in LAYERS if n not in CONFIG_HOLDERS])
def test_below_the_config_boundary_nothing_takes_a_config_dict(name):
    """Such a layer's functions take Settings: it never imports ml_collections nor names a ConfigDict."""
    found = []
    for path in sorted((PACKAGE / name).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(m.split(".")[0] == "ml_collections" for m in modules) or (
                    isinstance(node, (ast.Name, ast.Attribute)) and "ConfigDict" in (
                        getattr(node, "id", None), getattr(node, "attr", None))):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"the {name} layer takes a ConfigDict (read it with config.settings.from_config above): {found}"


def _functions_calling(name: str) -> list[str]:
    """module:function (Class.method) of every function of the package that calls `name` (a bare name or an
    attribute), the defining module's own definition aside."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for scope in ast.walk(tree):
            if isinstance(scope, ast.ClassDef):
                methods = [(f"{scope.name}.{f.name}", f) for f in scope.body if isinstance(f, ast.FunctionDef)]
            elif isinstance(scope, ast.Module):
                methods = [(f.name, f) for f in scope.body if isinstance(f, ast.FunctionDef)]
            else:
                continue
            for qualified, function in methods:
                calls = [c for c in ast.walk(function) if isinstance(c, ast.Call) and name in (
                    getattr(c.func, "id", None), getattr(c.func, "attr", None))]
                if calls:
                    found.append(f"{module_name(path)}:{qualified}")
    return found


def test_one_training_loop():
    """Training happens in one loop: a single function saves the last checkpoint (`save_last`, the loop's
    periodic save), in the trainer, and every stage (fine-tuning, self-pretraining) goes through the one
    function that builds the train step for it; elsewhere a train step is only compiled (timing,
    throughput, lowering), never looped with checkpoints."""
    assert _functions_calling("save_last") == ["lra_jax.training.trainer:_Loop._save"]
    stages = [f for f in _functions_calling("make_train_step") if f.startswith("lra_jax.training.")]
    assert stages == ["lra_jax.training.trainer:_train_stage"], stages
    assert sorted(_functions_calling("_train_stage")) == ["lra_jax.training.trainer:_pretrain",
                                                         "lra_jax.training.trainer:_train_and_evaluate"]


def test_no_reader_imports_its_generator():
    """`data/tasks.py` decides generate-or-read; a generator may import its reader, never the reverse."""
    readers = {m for m in KNOWN if layer(m) == "data" and f"{m}_generator" in KNOWN}
    assert readers, "the data layer has readers with generators"
    assert not [r for r in readers if f"{r}_generator" in GRAPH[r]]


@pytest.mark.parametrize("folder", ["lra_jax", "tests", "configs", "scripts"])
def test_no_python_file_over_600_lines(folder):
    long = {str(p.relative_to(REPO)): n for p in sorted((REPO / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these by idea: {long}"


def test_the_contract_sees_real_edges():
    """The walker itself: it finds edges that exist, so an empty list of violations means something."""
    assert "lra_jax.attention.registry" in GRAPH["lra_jax.models.encoder"]
    assert any(layer(t) == "kernels" for t in GRAPH["lra_jax.attention.softmax"])
    cycle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(cycle) == [["a", "b", "c"]]
