"""The train step's gradient accumulation: k micro-batches give the update of one k-times-larger batch."""

import jax
import numpy as np
import optax
import pytest
from helpers import assert_close, reassociation_tol, tiny_config

from lra_jax.config.settings import from_config
from lra_jax.data import tasks
from lra_jax.errors import ConfigError
from lra_jax.training import distributed, evaluation, initial_state, steps, trainer


def _step_once(config, tx, batch, accum_steps):
    task = tasks.get_task("listops")
    graphdef, _, state = initial_state.create_train_state(from_config(config), task, distributed.make_mesh())
    state = state.replace(opt_state=tx.init(state.params))
    before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    step = steps.make_train_step(graphdef, tx, initial_state.run_key(from_config(config), "dropout"), accum_steps=accum_steps)
    state, metrics = step(state, batch)
    after = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    return [b - a for a, b in zip(after, before)], metrics


@pytest.mark.parametrize("accum_steps", [2, 4])
@pytest.mark.slow
def test_accumulated_micro_batches_give_the_update_of_the_whole_batch(accum_steps):
    config = tiny_config("/unused")
    config.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)  # dropout keys differ per micro-batch
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(1, 16, (16, 32)).astype(np.int32), "label": rng.integers(0, 10, 16).astype(np.int32)}
    # SGD, so that the update is the gradient itself (Adam's g / sqrt(v) would amplify the rounding
    # of entries near zero into whole learning rates).
    tx = optax.sgd(1.0)
    whole, whole_metrics = _step_once(config, tx, batch, 1)
    accumulated, metrics = _step_once(config, tx, batch, accum_steps)
    # The same per-example gradients, summed as k partial means of 16/k then averaged instead of
    # one mean of 16: another order of a float32 sum of 16 terms, after a backward pass of a few
    # chained reductions (attention, layer norm, mean pooling of 32 positions). Compared on the
    # scale of the whole gradient: some entries are zero in exact arithmetic (the key projection's
    # bias, which softmax cancels) and hold only rounding noise of that scale.
    tol = reassociation_tol(32, depth=4)
    assert_close(metrics["loss"], whole_metrics["loss"], tol)
    assert float(metrics["accuracy"]) == pytest.approx(float(whole_metrics["accuracy"]))
    assert_close(np.concatenate([g.ravel() for g in accumulated]), np.concatenate([w.ravel() for w in whole]), tol)
    assert max(float(np.abs(w).max()) for w in whole) > 1e-3  # the step did move the parameters


def test_micro_batches_are_strided_so_each_stays_on_the_devices_of_its_rows():
    batch = {"label": np.arange(8), "inputs": np.arange(16).reshape(8, 2)}
    micro = steps.micro_batches(batch, 4)
    assert micro["label"].shape == (4, 2) and micro["inputs"].shape == (4, 2, 2)
    np.testing.assert_array_equal(micro["label"][1], [1, 5])
    np.testing.assert_array_equal(micro["inputs"][1], [[2, 3], [10, 11]])
    with pytest.raises(ConfigError, match="not divisible by grad_accum_steps 3"):
        steps.micro_batches(batch, 3)


def test_trainer_refuses_a_batch_the_devices_and_accumulation_cannot_split(tmp_path):
    config = tiny_config(tmp_path)
    config.grad_accum_steps = 3  # the batch must split over the devices and then into 3 micro-batches
    with pytest.raises(ConfigError, match=f"multiple of {3 * jax.device_count()}"):
        trainer.train_and_evaluate(from_config(config), str(tmp_path / "run"))


@pytest.mark.slow
def test_a_run_trains_with_accumulation_and_evaluates_in_its_micro_batches(tmp_path, monkeypatch):
    """Accumulation is what a batch that does not fit gets (`compile`'s plan), so evaluating the whole
    batch at once would not fit either: validation and test run in micro-batches."""
    config = tiny_config(tmp_path)
    config.grad_accum_steps = 2
    config.num_train_steps = 6
    evaluated = []
    evaluate = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda *a: evaluated.append(a[3]) or evaluate(*a))
    results = trainer.train_and_evaluate(from_config(config), str(tmp_path / "run"))
    assert results["status"] == "complete" and np.isfinite(results["test_loss"])
    assert results["config"]["grad_accum_steps"] == 2
    assert evaluated and set(evaluated) == {config.batch_size // 2}


def test_the_compiled_eval_step_takes_the_micro_batch():
    from lra_jax.research.compilation import lowering

    config = tiny_config("/nonexistent")
    config.grad_accum_steps = 2
    (_, (_, train_batch)), (_, (_, eval_batch)) = lowering.abstract_steps(config, "cpu")[0]
    assert train_batch["label"].shape == (config.batch_size,)
    assert eval_batch["label"].shape == eval_batch["weight"].shape == (config.batch_size // 2,)
