"""train_and_evaluate end to end on a tiny ListOps config: results, resume, SIGTERM, sharding."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import F32_EPS, REPO, child_xla_flags, tiny_config

from lra_jax import provenance
from lra_jax.config import task_defaults as base
from lra_jax.config.settings import from_config
from lra_jax.data import pipeline, tasks
from lra_jax.errors import ConfigError, TrainingDiverged
from lra_jax.training import checkpointing, distributed, initial_state, optimizer, step_metrics, steps, trainer


def last_params(config, workdir):
    """The parameters of the newest checkpoint in `workdir`, as numpy arrays."""
    _, _, like = initial_state.create_train_state(from_config(config), tasks.get_task(config.task), distributed.make_mesh())
    state = checkpointing.Checkpoints(os.path.join(workdir, "checkpoints")).restore_last(like)
    return int(state.step), [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_lra_schedule_is_linear_warmup_then_rsqrt_decay():
    schedule = optimizer.lra_schedule(0.05, warmup_steps=1000)
    assert float(schedule(0)) == 0.0
    # A few float32 operations (product, square root, quotient) against float64: 8 eps.
    np.testing.assert_allclose(schedule(500), 0.05 * 0.5 / np.sqrt(1000), rtol=8 * F32_EPS)
    np.testing.assert_allclose(schedule(1000), 0.05 / np.sqrt(1000), rtol=8 * F32_EPS)
    np.testing.assert_allclose(schedule(4000), 0.05 / np.sqrt(4000), rtol=8 * F32_EPS)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    schedule = optimizer.cosine_schedule(1e-3, warmup_steps=100, total_steps=1000)
    # float32 against the formula: 8 eps; the cosine's argument carries its own rounding, x 10.
    np.testing.assert_allclose(float(schedule(50)), 0.5e-3, rtol=8 * F32_EPS)
    np.testing.assert_allclose(float(schedule(100)), 1e-3, rtol=8 * F32_EPS)
    np.testing.assert_allclose(float(schedule(600)), 0.5e-3, rtol=80 * F32_EPS)  # half-way through the decay
    assert float(schedule(1100)) == pytest.approx(0.0, abs=1e-12)
    assert float(schedule(5000)) == pytest.approx(0.0, abs=1e-12)


def test_unknown_schedule_names_the_choices():
    config = base.get_config("listops,mini")
    config.optimizer.schedule = "linear"
    with pytest.raises(ConfigError, match="rsqrt, cosine"):
        optimizer.make_optimizer(from_config(config).optimizer)


def test_training_order_is_a_function_of_seed_and_epoch():
    tokens = np.arange(40, dtype=np.int32)[:, None]
    labels = np.arange(40, dtype=np.int32)
    stream = pipeline.train_batches(tokens, labels, batch_size=8, seed=3)
    first = [next(stream)["label"] for _ in range(12)]  # 2.4 epochs (5 batches each)
    resumed = pipeline.train_batches(tokens, labels, batch_size=8, seed=3, start_step=7)
    np.testing.assert_array_equal(next(resumed)["label"], first[7])
    assert sorted(np.concatenate(first[:5])) == list(range(40))  # an epoch sees each example once
    assert not np.array_equal(np.concatenate(first[:5]), np.concatenate(first[5:10]))  # reshuffled


def test_eval_batches_cover_every_example_once_with_zero_weight_padding():
    tokens = np.arange(10, dtype=np.int32)[:, None]
    batches = list(pipeline.eval_batches(tokens, np.arange(10, dtype=np.int32), batch_size=4))
    weights = np.concatenate([b["weight"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    assert weights.sum() == 10 and list(labels[weights > 0]) == list(range(10))


@pytest.mark.slow
def test_train_and_evaluate_writes_results_metrics_and_checkpoints(tmp_path, data_cache, monkeypatch):
    config = tiny_config(data_cache, "linformer", k=8)
    workdir = str(tmp_path / "run")
    # A run directory tracked by git (a committed run, run again) is changed by the run's own metrics:
    # the commit recorded is the checkout's as the run started.
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    monkeypatch.setattr(provenance, "source_commit",
                        lambda: "abc1234" + ("+changes" if os.path.exists(metrics_path) else ""))
    results = trainer.train_and_evaluate(from_config(config), workdir)
    assert results["versions"]["lra_jax_commit"] == "abc1234"
    with open(os.path.join(workdir, "results.json")) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    for key in ("test_accuracy", "val_accuracy", "steps_per_second", "examples_per_second",
                "peak_memory_bytes", "num_parameters", "versions", "config", "test_majority_class_rate"):
        assert results[key] is not None, key
    assert results["task"] == "listops" and results["variant"] == "linformer"
    assert results["attention"]["k"] == 8 and results["attention"]["share_kv"] is False  # given, and default
    # the kernel each attention layer ran: impl "auto" on this CPU is XLA, with no fallback to explain
    kernels_ran = {(e["platform"], e["train"], e["eval"], e["reason"]) for e in results["attention"]["kernels"]}
    assert kernels_ran == {("cpu", "xla", "xla", None)}
    assert 0.0 <= results["test_accuracy"] <= 1.0 and results["num_parameters"] > 1000
    assert results["examples_per_second"] == pytest.approx(results["steps_per_second"] * 16)
    lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [m["step"] for m in lines if "train/loss" in m] == [3, 6, 9, 12]
    assert [m["step"] for m in lines if "val/accuracy" in m] == [6, 12]
    assert any("test/accuracy" in m for m in lines)
    assert os.listdir(os.path.join(workdir, "tensorboard"))
    assert last_params(config, workdir)[0] == 12


@pytest.mark.slow
def test_the_progress_bars_best_val_is_the_best_validation_the_last_line_gives(tmp_path, data_cache, capsys):
    """The bar shows best_val after its step's validation: with one validation, at the last step, the
    bar ends on that figure (it showed the best before it, 0.000), the same as the run's last line."""
    config = tiny_config(data_cache, "linformer", k=8)
    config.eval_every = config.num_train_steps
    results = trainer.train_and_evaluate(from_config(config), str(tmp_path / "run"))
    out = capsys.readouterr()
    bar = re.findall(r"best_val=([-0-9.]+)", out.err)[-1]
    last_line = float(re.search(r"best validation ([0-9.]+) at step 12", out.out).group(1))
    assert last_line == pytest.approx(results["val_accuracy"], abs=1e-4) and results["val_accuracy"] > 0
    assert bar == f"{results['val_accuracy']:.3f}"


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_cache):
    """tiny_config's run trained to its end once, for the tests that compare with it or start from it
    (they read it, or copy it before they write): (config, workdir, the results it returned)."""
    config = tiny_config(data_cache)  # dropout on: a resumed run must reuse the same keys
    workdir = str(tmp_path_factory.mktemp("straight") / "run")
    return config, workdir, trainer.train_and_evaluate(from_config(config), workdir)


@pytest.mark.slow
def test_finished_run_returns_its_results_without_training(straight, tmp_path, monkeypatch):
    config, finished, first = straight
    workdir = str(tmp_path / "run")
    shutil.copytree(finished, workdir)
    monkeypatch.setattr(steps, "make_train_step", lambda *a, **k: pytest.fail("trained again"))
    assert trainer.train_and_evaluate(from_config(config), workdir) == json.loads(json.dumps(first))


@pytest.mark.slow
def test_sigterm_saves_and_a_resumed_run_ends_where_an_uninterrupted_one_does(straight, tmp_path, monkeypatch):
    config, straight, _ = straight
    check_finite, signalled = step_metrics.check_finite, []

    def terminated_while_step_5_runs(step_metrics, step, *args):
        if step == 4 and not signalled:  # step 4's check runs once step 5 is dispatched
            signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        check_finite(step_metrics, step, *args)

    interrupted = str(tmp_path / "interrupted")
    monkeypatch.setattr(step_metrics, "check_finite", terminated_while_step_5_runs)
    assert trainer.train_and_evaluate(from_config(config), interrupted) is None
    stopped_at, _ = last_params(config, interrupted)
    assert stopped_at == 5 and config.log_every == 3  # in the middle of a log window
    monkeypatch.setattr(step_metrics, "check_finite", check_finite)
    resumed = trainer.train_and_evaluate(from_config(config), interrupted)

    step_a, params_a = last_params(config, straight)
    step_b, params_b = last_params(config, interrupted)
    assert step_a == step_b == config.num_train_steps
    for a, b in zip(params_a, params_b):
        # The same compiled step on the same batches from a bit-exact checkpoint: equal in practice;
        # a few eps allow a different fusion after restore, a lost optimizer state or key is O(lr).
        np.testing.assert_allclose(a, b, rtol=8 * F32_EPS, atol=8 * F32_EPS * np.abs(b).max())
    with open(os.path.join(straight, "results.json")) as f:
        assert resumed["test_accuracy"] == json.load(f)["test_accuracy"]
    # The log line after the stop averages the steps before it too, as the straight run's does.
    straight_lines, resumed_lines = metric_lines(straight), metric_lines(interrupted)
    assert [sorted(line) for line in resumed_lines] == [sorted(line) for line in straight_lines]
    for a, b in zip(straight_lines, resumed_lines):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)


def metric_lines(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_diverging_run_stops_at_its_first_non_finite_step_and_saves_nothing_after_it(tmp_path, data_cache):
    config = tiny_config(data_cache, "linformer", k=8)
    config.optimizer.learning_rate = 1e6  # gradient norm inf at step 4 (measured), loss nan after
    config.update(checkpoint_every=1, log_every=1, eval_every=1)
    workdir = str(tmp_path / "run")
    expected = r"training diverged at step \d+ .*the last good checkpoint is step"
    with pytest.raises(TrainingDiverged, match=expected) as caught:
        trainer.train_and_evaluate(from_config(config), workdir)
    step = caught.value.step
    saved, params = last_params(config, workdir)
    assert saved == caught.value.last_checkpoint == step - 1
    assert all(np.isfinite(p).all() for p in params)
    with open(os.path.join(workdir, "results.json")) as f:
        record = json.load(f)
    assert record["status"] == "diverged" and record["diverged_at_step"] == step
    assert not any("accuracy" in key for key in record)  # nothing that reads as a result
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        logged = [json.loads(line, parse_constant=pytest.fail) for line in f]  # strict JSON: no NaN
    assert max(line["step"] for line in logged) == step - 1


@pytest.mark.slow
def test_non_finite_updates_are_skipped_up_to_the_limit(data_cache):
    config = tiny_config(data_cache)
    config.optimizer.skip_nonfinite_updates = 2
    task = tasks.get_task(config.task)
    graphdef, tx, state = initial_state.create_train_state(from_config(config), task, distributed.make_mesh(jax.devices()[:1]))
    leaves, treedef = jax.tree.flatten(state.params)
    leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(np.nan)  # every gradient is NaN from now on
    state = state.replace(params=jax.tree.unflatten(treedef, leaves))
    poisoned = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    step = steps.make_train_step(graphdef, tx, initial_state.run_key(from_config(config), "dropout"), skipped_updates=2)
    batch = {"inputs": np.ones((config.batch_size, config.max_len), np.int32),
             "label": np.zeros(config.batch_size, np.int32)}
    flags = []
    for _ in range(3):
        state, metrics = step(state, batch)
        flags.append((bool(metrics["skipped"]), bool(metrics["finite"])))
        if flags[-1][0]:  # a skipped update leaves the parameters as they were
            for a, b in zip(poisoned, jax.tree.leaves(state.params)):
                np.testing.assert_array_equal(a, np.asarray(b))
    assert flags == [(True, True), (True, True), (False, False)]


@pytest.mark.slow
def test_resuming_with_a_different_model_is_refused(straight, tmp_path):
    trained, finished, _ = straight
    workdir = str(tmp_path / "run")
    shutil.copytree(finished, workdir)
    config = trained.copy_and_resolve_references()
    config.num_train_steps *= 2  # unfinished: this command resumes it
    config.model.emb_dim = 32
    with pytest.raises(ConfigError, match="model.emb_dim"):
        trainer.train_and_evaluate(from_config(config), workdir)


SHARDED_VS_SINGLE = r"""
import jax, numpy as np
from helpers import assert_close, reassociation_tol, tiny_config
from lra_jax.config.settings import from_config
from lra_jax.data import pipeline, tasks
from lra_jax.training import distributed, initial_state, steps
assert jax.device_count() == 4, jax.devices()
config = from_config(tiny_config("/unused"))
task = tasks.get_task("listops")
rng = np.random.default_rng(0)
batches = [{"inputs": rng.integers(0, task.vocab_size, (16, 32)).astype(np.int32),
            "label": rng.integers(0, 10, 16).astype(np.int32)} for _ in range(3)]
runs = []
for mesh in (distributed.make_mesh(jax.devices()[:1]), distributed.make_mesh()):
    graphdef, tx, state = initial_state.create_train_state(config, task, mesh)
    step = steps.make_train_step(graphdef, tx, initial_state.run_key(config, "dropout"))
    losses = []
    for batch in batches:
        state, metrics = step(state, jax.device_put(batch, pipeline.data_sharding(mesh)))
        losses.append(float(metrics["loss"]))
    assert len(state.params["encoder"]["embed"]["embedding"].sharding.device_set) == mesh.size
    runs.append((np.array(losses), [np.asarray(x) for x in jax.tree.leaves(state.params)]))
(loss_1, params_1), (loss_4, params_4) = runs
# The loss is a mean over 16 examples, summed per device and then across: another order of
# float32 sums of <= 32 terms in a few reductions. Parameters move by Adam's m / sqrt(v), which
# for a gradient entry near zero turns its rounding into up to lr: 1e-4 (measured 7e-5).
assert_close(loss_4, loss_1, reassociation_tol(32, depth=4))
worst = max(float(np.abs(a - b).max()) for a, b in zip(params_1, params_4))
assert worst < 1e-4, worst
print("max parameter difference", worst)
"""


@pytest.mark.slow
def test_sharded_step_on_four_devices_matches_one_device():
    env = dict(os.environ, XLA_FLAGS=child_xla_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", SHARDED_VS_SINGLE], cwd=os.path.join(REPO, "tests"),
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "max parameter difference" in done.stdout


def small_task_config(task: str, tmp_path):
    """A few steps of `task` with a one-layer, 16-wide model."""
    config = base.get_config(f"{task},mini")
    config.data.cache_dir = str(tmp_path / "cache")
    config.model.update(num_layers=1, num_heads=2, emb_dim=16, mlp_dim=32)
    config.batch_size = 8
    config.num_train_steps = 4
    config.eval_every = config.checkpoint_every = config.log_every = 2
    return config


@pytest.mark.slow
def test_retrieval_trains_end_to_end_through_the_dual_encoder(tmp_path):
    data_dir = tmp_path / "tsv_data"
    data_dir.mkdir()
    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("eval", 8), ("test", 8)):
        rows = [f"{i % 2}\tid{i}a\tid{i}b\t{'x' * rng.integers(5, 40)} paper {i}\tcited {'y' * i}" for i in range(count)]
        (data_dir / f"new_aan_pairs.{split}.tsv").write_text("\n".join(rows) + "\n")
    config = small_task_config("retrieval", tmp_path)
    config.max_len = 48
    config.data.data_dir = str(data_dir)
    results = trainer.train_and_evaluate(from_config(config), str(tmp_path / "run"))
    assert results["task"] == "retrieval" and 0.0 <= results["test_accuracy"] <= 1.0
    assert results["test_majority_class_rate"] == 0.5


@pytest.mark.slow
def test_pathfinder_trains_end_to_end_on_generated_images(tmp_path):
    config = small_task_config("pathfinder", tmp_path)
    config.data.generator.update(num_examples=80)
    results = trainer.train_and_evaluate(from_config(config), str(tmp_path / "run"))
    assert results["task"] == "pathfinder" and results["max_len"] == 16 * 16
    assert 0.0 <= results["test_accuracy"] <= 1.0


@pytest.mark.slow
def test_a_last_checkpoint_of_the_state_alone_still_resumes(tmp_path):
    """lra_jax used to save `last` as one unnamed item, without the unlogged metrics."""
    state = {"step": jax.numpy.array(5), "params": {"w": jax.numpy.arange(3.0)}}
    with ocp.CheckpointManager(tmp_path / "checkpoints" / "last") as old:
        old.save(5, args=ocp.args.StandardSave(state))
    checkpoints = checkpointing.Checkpoints(tmp_path / "checkpoints")
    restored = checkpoints.restore_last(jax.tree.map(jax.numpy.zeros_like, state))
    assert int(restored["step"]) == 5 and restored["params"]["w"].tolist() == [0.0, 1.0, 2.0]
    assert checkpoints.unlogged_metrics() == []
    checkpoints.save_last(7, state, [{"loss": 0.5}])
    assert checkpoints.unlogged_metrics() == [{"loss": 0.5}]
    checkpoints.close()
