"""Every shell command shown in README.md and docs/ still works.

Each command in a ```bash block is checked: the module of every `python -m <module>` exists and takes
every flag the command gives (absl's `--helpfull`), every repository path it names exists, and every pip
extra it installs is defined. Commands that can run here at tiny scale do: sweeps as `--dry_run`, mini
training runs with a few steps on a few examples, the checks (`chart --check`, `docs --check`), the
strict docs build and pytest's collection. What needs data, an accelerator or hours stays at the flag check.
"""

import functools
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest
from helpers import REPO

# What the documents say does not depend on the jax version: CI checks it once (tests/conftest.py).
pytestmark = pytest.mark.one_stack("oldest")

DOCUMENTS = ["README.md", *sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"),
                                                                              recursive=True))]
TINY = ["--config.num_train_steps=4", "--config.eval_every=2", "--config.checkpoint_every=2", "--config.log_every=2",
        "--config.max_len=48", "--config.data.generator.num_train=64", "--config.data.generator.num_val=16",
        "--config.data.generator.num_test=16", "--config.data.generator.max_length=48"]


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for every logical line of every ```bash block (indented ones too), with
    backslash continuations joined and comments dropped."""
    out = []
    for document in DOCUMENTS:
        text = open(os.path.join(REPO, document), encoding="utf-8").read()
        for indent, block in re.findall(r"^([ \t]*)```bash\n(.*?)^[ \t]*```", text, re.S | re.M):
            lines = [line[len(indent):] if line.startswith(indent) else line for line in block.splitlines()]
            joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
            for line in joined.splitlines():
                command = re.sub(r"(^|\s)#.*$", "", line).strip()
                if command:
                    out.append((document, command))
    return out


COMMANDS = documented_commands()


def python_invocations(command: str) -> list[tuple[str, list[str]]]:
    """(module, arguments) of each `python -m <module> ...` in a command line, up to a shell operator."""
    words = shlex.split(command.replace(";", " ; ").replace("&", " & ").replace("|", " | "), posix=True)
    found = []
    for i, word in enumerate(words):
        if word in ("python", "python3") and words[i + 1:i + 2] == ["-m"]:
            args = []
            for arg in words[i + 3:]:
                if arg in (";", "&", "|", ">", ">>") or arg.startswith(">"):
                    break
                args.append(arg)
            found.append((words[i + 2], args))
    return found


@functools.cache
def module_flags(module: str) -> frozenset[str]:
    """The flags a module's help lists: absl's `--helpfull` (boolean ones also as --no<name>): the trainer's
    from absl's app, every tool's from `lra_jax.tools.parse_command_line` (which takes --help, --helpshort
    and --helpfull alike); `--help` where a module has no --helpfull."""
    for option in ("--helpfull", "--help"):
        result = subprocess.run([sys.executable, "-m", module, option], cwd=REPO, capture_output=True, text=True,
                                timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        # absl exits 0 or 1 after printing its help, depending on how the module runs its app
        if result.returncode in (0, 1) and option in result.stdout:
            break
    else:
        raise AssertionError(f"python -m {module} --help printed no help: {result.stderr[-1500:]}")
    names = set()
    for negatable, name in re.findall(r"^\s+(?:-\w, )?--(\[no\])?([\w.-]+)", result.stdout, re.M):
        names.add(name)
        if negatable:
            names.add("no" + name)
    assert names, f"python -m {module} {option} lists no flags: {result.stdout[-1500:]}"
    return frozenset(names)


def test_the_documents_show_commands():
    """The extraction finds the README's commands and those of several docs pages (a check that cannot
    find anything would pass vacuously)."""
    documents = {document for document, _ in COMMANDS}
    assert "README.md" in documents and len(documents) >= 6, documents
    assert any(c.startswith("python -m lra_jax.train") for _, c in COMMANDS)


# A command that starts a module is checked against its `--help`, a process of its own: the slow tier.
@pytest.mark.parametrize("document,command", [
    pytest.param(d, c, marks=pytest.mark.slow) if any(m != "pytest" for m, _ in python_invocations(c)) else (d, c)
    for d, c in COMMANDS], ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_command_names_what_exists(document, command):
    """Modules, flags, repository paths and pip extras named by the command exist."""
    for module, args in python_invocations(command):
        if module == "pytest":
            continue
        flags = module_flags(module)
        for i, arg in enumerate(args):
            if arg == "--":  # what follows goes to the runs: config overrides only
                assert all(a.startswith("--config.") for a in args[i + 1:]), \
                    f"{document}: `{command}`: after `--` only --config.* overrides are passed on"
                break
            if arg.startswith("--"):
                name = arg[2:].split("=", 1)[0]
                assert name.startswith("config.") or name in flags, \
                    f"{document}: `{command}`: python -m {module} has no flag --{name}"
    for path in re.findall(r"(?<![\w/.-])((?:configs|scripts|\.ci|lra_jax|tests)/[\w./-]+)", command):
        assert os.path.exists(os.path.join(REPO, path.split(":")[0])), f"{document}: `{command}`: {path} does not exist"
    extras = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["optional-dependencies"]
    for group in re.findall(r'pip install -e "?\.\[([\w,]+)\]', command):
        assert set(group.split(",")) <= set(extras), f"{document}: `{command}`: unknown extra in [{group}]"


def run(args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


FIRST_SHOWN = {command: document for document, command in reversed(COMMANDS)}  # each command once, where first shown
RUNNABLE = [(d, c, module, args) for c, d in FIRST_SHOWN.items() for module, args in python_invocations(c)
            if (module == "lra_jax.tools.sweep" and "--estimate" not in args and "--emit" not in args)
            or (module == "lra_jax.train" and any(a.startswith("--config=") and a.endswith(",mini") for a in args)
                and "--distributed" not in args)
            or (module in ("lra_jax.tools.chart", "lra_jax.tools.docs") and args == ["--check"])]


def test_some_commands_run():
    assert {m for _, _, m, _ in RUNNABLE} >= {"lra_jax.train", "lra_jax.tools.sweep", "lra_jax.tools.docs"}


@pytest.mark.parametrize("document,command,module,args", RUNNABLE, ids=[f"{d}:{c[:60]}" for d, c, _, _ in RUNNABLE])
@pytest.mark.slow
def test_command_runs_at_tiny_scale(document, command, module, args, tmp_path):
    """Sweeps print their plan (`--dry_run`, under a fresh root); mini training runs train a few steps on a
    few generated examples in a fresh workdir; the checks run as documented."""
    args = [a for a in args if not a.startswith(("--root=", "--workdir=", "--parallel="))]
    if module == "lra_jax.tools.sweep":
        args += ["--dry_run", f"--root={tmp_path}"]
    elif module == "lra_jax.train":
        args += [*TINY, f"--workdir={tmp_path / 'run'}"]
    # docs --check draws every variant's dependence map again: about two minutes of one core, more on a busy one
    result = run([sys.executable, "-m", module, *args], timeout=900 if module == "lra_jax.tools.docs" else 240)
    assert result.returncode == 0, f"{document}: `{command}` exited {result.returncode}: {result.stderr[-2000:]}"


@pytest.mark.slow
def test_pytest_commands_collect():
    """Every documented pytest invocation's options are pytest's (it collects one test file), once per set of
    options however many documents show it."""
    shown: dict[tuple[str, ...], tuple[str, str]] = {}
    for document, command in COMMANDS:
        if re.search(r"(^|\s)(python -m )?pytest\b", command):
            shown.setdefault(tuple(shlex.split(command.split("pytest", 1)[1])), (document, command))
    assert shown, "no document shows a pytest command"
    for options, (document, command) in shown.items():
        result = run([sys.executable, "-m", "pytest", *options, "--collect-only", "-q", "-p", "no:cacheprovider",
                      "tests/test_layering.py"], timeout=120)
        assert result.returncode == 0, f"{document}: `{command}`: {result.stdout[-1500:]}{result.stderr[-800:]}"


# The strict docs build as shown: mkdocs-material prints a notice about its own future on every build unless
# NO_MKDOCS_2_WARNING is set, so the documents show the command with it.
DOCS_BUILD = re.compile(r"^(NO_MKDOCS_2_WARNING=1 )?mkdocs build --strict$")


@pytest.mark.skipif(shutil.which("mkdocs") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "mkdocs")),
                    reason="mkdocs is not installed (pip install -e \".[docs]\")")
def test_the_docs_build_strictly(tmp_path):
    """The docs build as the documents show it: the site builds with --strict (broken links, pages missing
    from nav fail) and prints mkdocs' own log lines only, no notice from the theme."""
    shown = sorted({command for _, command in COMMANDS if DOCS_BUILD.match(command)})
    assert shown, "no document shows the strict docs build"
    bin_dir = os.path.dirname(shutil.which("mkdocs") or os.path.join(os.path.dirname(sys.executable), "mkdocs"))
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    for command in shown:
        result = subprocess.run(["bash", "-c", f"{command} --site-dir {shlex.quote(str(tmp_path / 'site'))}"],
                                cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, f"`{command}`: {result.stderr[-2000:]}"
        noise = [line for line in (result.stdout + result.stderr).splitlines()
                 if line.strip() and not re.match(r"^(INFO|WARNING|DEBUG)\b", line)]
        assert not noise, f"`{command}` prints more than mkdocs' log: {noise[:12]}"


@pytest.mark.slow
def test_the_flag_check_tells_real_flags_from_others():
    """The flag lists the checks read hold a module's flags and not others (as `parse_command_line` lists them)."""
    sweep, fits = module_flags("lra_jax.tools.sweep"), module_flags("lra_jax.tools.fits")
    assert {"dry_run", "estimate", "root", "noemit"} <= sweep and "summary" not in sweep
    assert "summary" in fits and "dry_run" not in fits
