"""step_timing: random batches of a task's shape, and `train --estimate` (a run's projected training time)."""

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import REPO

from lra_jax.config.settings import from_config
from lra_jax.data import tasks
from lra_jax.measure import step_timing, text_table, units


@pytest.mark.parametrize("task", ["listops", "retrieval"])
def test_random_batch_has_the_task_shape_ragged_lengths_and_no_ids_outside_the_vocabulary(task):
    spec = tasks.get_task(task)
    batch = step_timing.random_batch(spec, batch_size=64, max_len=40, seed=0)
    tokens = batch["inputs"]
    assert tokens.shape == ((64, 2, 40) if spec.dual else (64, 40)) and tokens.dtype == np.int32
    lengths = (tokens > 0).sum(-1)
    assert lengths.min() >= 20 and lengths.max() <= 40 and len(np.unique(lengths)) > 1
    assert np.all((tokens > 0).cumsum(-1)[..., -1] == lengths)  # padding only at the end
    assert tokens.max() < spec.vocab_size
    assert set(np.unique(batch["label"])) <= set(range(spec.num_classes))
    assert np.array_equal(tokens, step_timing.random_batch(spec, 64, 40, seed=0)["inputs"])


TINY_RETRIEVAL = ["--config=configs/transformer.py:retrieval,mini", "--config.model.emb_dim=16",
                  "--config.model.mlp_dim=16", "--config.model.num_heads=2", "--config.max_len=32",
                  "--config.batch_size=4", "--config.num_train_steps=5000", "--config.data.data_dir=/nonexistent"]


def estimate(*flags, workdir):
    """`train --estimate` of TINY_RETRIEVAL (no data is read), with `flags`."""
    return subprocess.run([sys.executable, "-m", "lra_jax.train", *TINY_RETRIEVAL, "--estimate", *flags,
                           f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_train_estimate_json_prints_a_projection_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    out = estimate("--json", workdir=workdir)
    assert out.returncode == 0, out.stderr
    estimate_ = json.loads(out.stdout.strip().splitlines()[-1])
    assert (estimate_["task"], estimate_["variant"], estimate_["max_len"], estimate_["num_train_steps"]) == (
        "retrieval", "softmax", 32, 5000)
    assert estimate_["seconds_per_step"] > 0 and estimate_["compile_seconds"] > 0
    assert estimate_["projected_train_seconds"] == pytest.approx(
        estimate_["compile_seconds"] + 5000 * estimate_["seconds_per_step"])
    assert not workdir.exists()


@pytest.mark.slow
def test_train_estimate_says_the_projection_in_a_sentence_and_a_table_of_units(tmp_path):
    out = estimate(workdir=tmp_path / "run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert re.fullmatch(r"softmax on retrieval \(mini scale\): about [0-9.,]+ (ms|s|min|h) of training on this cpu "
                        r"\(\d+ devices?\), 5,000 steps at [0-9.]+ (ms|s) a step after [0-9.]+ (ms|s|min) of "
                        r"compilation; evaluation and data preparation not included\.", lines[0]), lines[0]
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines[2:-2])
    assert rows["train steps"] == "5,000" and rows["sequence length"] == "32 tokens"
    assert re.fullmatch(r"[0-9.]+ (MiB|GiB) \(XLA's compiled estimate\)", rows["step memory"])
    assert lines[-1] == "(--json prints these figures as one JSON line)"
    assert "{" not in out.stdout


def test_durations_are_given_in_the_unit_a_reader_wants():
    assert [units.duration(s) for s in (0.0053, 0.41, 41.04, 150, 204915)] == [
        "5.3 ms", "410 ms", "41 s", "2.5 min", "56.9 h"]
    assert units.duration(None) == "-"


def test_text_tables_align_their_columns_and_let_a_short_rows_last_cell_run_on():
    rows = [("a", "0.500", "5,000"), ("bbbb", "41.000", "12"), ("c", "failed: out of memory")]
    assert text_table.table(("run", "s/step", "steps"), rows, align="lrr").splitlines() == [
        "run   s/step  steps",
        "a      0.500  5,000",
        "bbbb  41.000     12",
        "c     failed: out of memory"]


@pytest.mark.parametrize("keeps_freed", [True, False])
@pytest.mark.slow
def test_configs_timed_together_take_turns_in_alternating_rounds(monkeypatch, keeps_freed):
    """Two configs (dropout 0 and 0.1), three rounds: A B, B A, A B. Where malloc keeps freed memory, a
    step after a switch is an untimed one of the new config (the switch is never in a timed step);
    where it maps every step's memory afresh anyway, the step after a switch is timed."""
    from lra_jax.research.benchmarks import bench_cells
    from lra_jax.training import distributed

    calls = []

    class Recorded:  # a compiled step that notes each call under its config's name
        def __init__(self, compiled, name):
            self.compiled, self.name = compiled, name

        def __call__(self, *args):
            calls.append(self.name)
            return self.compiled(*args)

        def __getattr__(self, attribute):  # memory_analysis, cost_analysis
            return getattr(self.compiled, attribute)

    real = step_timing.make_train_step
    names = iter("AB")

    def recording(graphdef, tx, key):
        lower = real(graphdef, tx, key).lower
        name = next(names)
        compile_recorded = lambda lowered: lambda: Recorded(lowered.compile(), name)  # noqa: E731
        return SimpleNamespace(lower=lambda *args: SimpleNamespace(compile=compile_recorded(lower(*args))))

    monkeypatch.setattr(step_timing, "make_train_step", recording)
    monkeypatch.setattr(step_timing.host_memory, "keeps_freed", lambda: keeps_freed)
    tiny = {"batch_size": 2, "seed": 0, "num_layers": 1, "num_heads": 2, "emb_dim": 16, "mlp_dim": 16,
            "dtype": "float32", "scan_layers": False, "remat": False}
    configs = [from_config(bench_cells.bench_config("softmax", 16, tiny, rate)) for rate in (0.0, 0.1)]
    task = tasks.TaskSpec("text-bench", bench_cells.VOCAB_SIZE, bench_cells.NUM_CLASSES, False, load=None)
    timings = step_timing.time_train_steps(configs, task, distributed.make_mesh(), warmup=1, steps=3)
    warm_up = ["A", "B"]
    if keeps_freed:  # untimed, timed after each switch; none between B's rounds 1 and 2, A's 2 and 3
        assert calls == warm_up + ["A", "A", "B", "B"] + ["B", "A", "A"] + ["A", "B", "B"]
    else:
        assert calls == warm_up + ["A", "B"] + ["B", "A"] + ["A", "B"]
    assert [len(t["step_seconds"]) for t in timings] == [3, 3]
    assert [t["pairing"] for t in timings] == [
        {"round_order": "alternating", "untimed_step_after_switch": keeps_freed}] * 2
