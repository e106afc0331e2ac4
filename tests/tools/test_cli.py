"""The command line: bad input gets one line naming the problem and the fix, and a non-zero exit."""

import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, child_xla_flags

# Messages and exit codes are this package's Python, not the jax version's: CI checks them once.
pytestmark = pytest.mark.one_stack("oldest")


def train(*flags, tmp_path):
    env = dict(os.environ, LRA_JAX_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu",
               XLA_FLAGS=child_xla_flags())
    return subprocess.run([sys.executable, "-m", "lra_jax.train", *flags, f"--workdir={tmp_path / 'run'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags,expected", [
    (["--config=configs/linformer.py:listops,mini", "--config.attention.name=flsh"],
     "unknown attention variant 'flsh'.*known variants: .*linformer.*softmax"),
    (["--config=configs/linformer.py:listops,mini", "--config.model.num_layer=2"],
     "unknown config key --config.model.num_layer; did you mean --config.model.num_layers"),
    (["--config=configs/linformer.py:listops,mini", "--config.attention.kk=2"],
     "unknown config key --config.attention.kk; did you mean --config.attention.k"),
    (["--config=configs/linformer.py:listops,huge"], "expected 'TASK\\[,SCALE\\]'"),
    (["--config=configs/linformr.py"], "config file 'configs/linformr.py' not found.*configs/linformer.py"),
    (["--config=configs/linformer.py:listops,mini", "--config.data.data_dir=/nonexistent/listops"],
     "missing ListOps files: /nonexistent/listops/basic_train.tsv.*lra_release.gz"),
    (["--config=configs/linformer.py:listops,mini", "--json"], "--json goes with --estimate"),
])
@pytest.mark.slow
def test_bad_input_gets_one_clear_line_and_a_nonzero_exit(flags, expected, tmp_path):
    done = train(*flags, tmp_path=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.search(expected, errors[0]), done.stderr[-2000:]


@pytest.mark.slow
def test_a_config_path_given_from_another_directory_names_the_repository_file(tmp_path):
    env = dict(os.environ, LRA_JAX_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "lra_jax.train", "--config=configs/linformer.py:listops,mini"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    expected = f"--config={os.path.join(REPO, 'configs', 'linformer.py')}"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], done.stderr[-2000:]


def test_ci_runs_the_readme_install_and_test_commands():
    """CI installs with the README's CPU install command and runs its test command; the two stacks of
    docs/install.md's table are the two CI installs."""
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()

    def commands(section: str) -> list[str]:
        text = readme.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
        return [line.split("#", 1)[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
                for line in block.splitlines() if line.strip()]

    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    install, quick_start = commands("Install"), commands("Quick start")
    assert install[0].startswith("python3 -m venv") and "-m venv" in ci, install  # a fresh virtualenv, as CI makes
    assert install[1] == 'pip install -e ".[test]"' and install[1] in ci, install
    assert len(quick_start) == 3 and quick_start[0].startswith("python -m lra_jax.train"), quick_start
    assert quick_start[1] == 'pytest -q -m "not slow"', quick_start  # the fast tier, the everyday check
    assert quick_start[2] == "pytest -q" and "pytest -q)" in ci, quick_start  # the full suite, as CI runs it
    install_page = open(os.path.join(REPO, "docs", "install.md"), encoding="utf-8").read()
    stacks = install_page.split("## Supported stacks", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in stacks.splitlines() if line.startswith("|"))
    installs = re.findall(r"`(pip install [^`]*)`", table)  # the install column of the stacks table
    assert len(installs) == 2 and all(install in ci for install in installs), installs

SMALL = ["--config=configs/linformer.py:listops,mini", "--config.num_train_steps=8", "--config.eval_every=4",
         "--config.checkpoint_every=4", "--config.log_every=4", "--config.max_len=48",
         "--config.data.generator.num_train=128", "--config.data.generator.num_val=32",
         "--config.data.generator.num_test=32", "--config.data.generator.max_length=48"]


def test_every_console_script_is_in_the_readme_command_table():
    """Each `[project.scripts]` entry appears in the README as `| python -m <module> | <name> |`."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    missing = [name for name, entry in scripts.items()
               if f"| `python -m {entry.split(':')[0]}` | `{name}` |" not in readme]
    assert not missing, f"console scripts missing from the README's command table: {missing}"


@pytest.mark.slow
def test_a_short_run_exits_zero_and_a_rerun_finishes_at_once(tmp_path):
    """Exit status 0 after training and after the rerun that finds the run finished."""
    first = train(*SMALL, tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "test accuracy" in first.stdout and (tmp_path / "run" / "results.json").exists()
    assert "sized for a GPU or TPU" not in first.stderr  # mini scale: no advice
    again = train(*SMALL, tmp_path=tmp_path)
    assert again.returncode == 0 and "finished at step 8" in again.stdout


# Full-scale Linformer ListOps (the scale of `configs/linformer.py` with no argument), shrunk to seconds.
FULL_SCALE_SHRUNK = [
    "--config=configs/linformer.py", "--config.num_train_steps=6", "--config.eval_every=6", "--config.log_every=6",
    "--config.checkpoint_every=6", "--config.max_len=48", "--config.batch_size=4", "--config.attention.k=8",
    "--config.model.num_layers=1", "--config.model.num_heads=2", "--config.model.emb_dim=16",
    "--config.model.mlp_dim=16", "--config.data.generator.num_train=64", "--config.data.generator.num_val=16",
    "--config.data.generator.num_test=16", "--config.data.generator.min_length=10",
    "--config.data.generator.max_length=48"]


@pytest.mark.slow
def test_full_scale_on_a_cpu_warns_before_the_data_and_once_more_with_the_projected_time(tmp_path):
    """Not refused: one warning naming the alternatives before the ListOps trees are generated, and one
    with the time the steps left take once the first steps are timed."""
    done = train(*FULL_SCALE_SHRUNK, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = re.split(r"[\r\n]+", done.stderr)
    advice = [i for i, line in enumerate(lines) if "is a full-scale config, sized for a GPU or TPU" in line]
    projected = [line for line in lines if line.startswith("warning: at ")]
    assert len(advice) == 1 and len(projected) == 1, done.stderr[-3000:]
    assert advice[0] < next(i for i, line in enumerate(lines) if line.startswith("ListOps:"))  # the generator's bar
    for alternative in ("--config=configs/linformer.py:listops,mini", "--estimate", "docs/will-it-fit.md"):
        assert alternative in lines[advice[0]], lines[advice[0]]
    assert re.match(r"warning: at .+ a step on this CPU, the 3 steps left take about ", projected[0]), projected
    assert "test accuracy" in done.stdout


@pytest.mark.slow
def test_a_diverging_run_exits_3_with_one_line_naming_the_step(tmp_path):
    done = train(*SMALL, "--config.optimizer.learning_rate=1e6", tmp_path=tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.match(r"error: training diverged at step \d+ \(loss ", errors[0]), errors
    assert "Traceback" not in done.stderr


def test_the_gpu_check_benches_every_variant_with_a_triton_kernel():
    """`.ci/gpu-check`'s default bench list is the variants with a Triton path (`kernel_names["triton"]`)."""
    import lra_jax.attention  # noqa: F401  (registers the variants)
    from lra_jax.attention import registry

    script = open(os.path.join(REPO, ".ci", "gpu-check"), encoding="utf-8").read()
    listed = re.search(r"kernel_variants=\$\{GPU_CHECK_VARIANTS:-([\w,]+)\}", script).group(1).split(",")
    with_triton = {name for name in registry.names() if "triton" in registry.get(name).kernel_backends()}
    assert sorted(listed) == sorted(with_triton)


@pytest.mark.parametrize("override, says", [
    ("--config.seed=-1", "--config.seed=-1 is out of range: it must be an integer from 0 to 2**32 - 1"),
    ("--config.seed=18446744073709551617", "it must be an integer from 0 to 2**32 - 1"),
    ("--config.model.num_heads=3", "--config.model.num_heads=3 is out of range: it must be a divisor of "
                                   "model.emb_dim=64"),
])
@pytest.mark.slow
def test_a_bad_seed_or_head_count_is_one_line_naming_the_key(override, says, tmp_path):
    done = train(*SMALL, override, tmp_path=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and says in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_an_empty_test_split_is_refused_before_training(tmp_path):
    data = tmp_path / "listops"
    data.mkdir()
    row = "( [MAX 2 9 ] )\t9\n"
    for split, rows in (("train", 40), ("val", 4), ("test", 0)):  # the test file: its header alone
        (data / f"basic_{split}.tsv").write_text("Source\tTarget\n" + row * rows, encoding="utf-8")
    done = train(*SMALL, f"--config.data.data_dir={data}", tmp_path=tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "no examples in its test split" in errors[0] and str(data) in errors[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "found before any training"
