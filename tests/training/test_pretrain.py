"""Self-pretraining (`lra_jax.training.pretrain`): the masking, the stage in the trainer, its resume,
its records, the fine-tuning from its encoder, and that it reads the training split alone."""

import dataclasses
import json
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import F32_EPS, tiny_config

from lra_jax.config import settings as config_settings
from lra_jax.config.settings import from_config
from lra_jax.data import tasks
from lra_jax.errors import ConfigError
from lra_jax.models.pretraining import mask_id
from lra_jax.training import checkpointing, distributed, initial_state, pretrain, step_metrics, trainer

VOCAB = 20


def pretraining_config(cache):
    config = tiny_config(cache)  # dropout on: a resumed stage must reuse the same keys
    config.pretrain.update(objective="masked", num_steps=6, mask_rate=0.3, learning_rate=0.01, warmup_steps=2)
    config.num_train_steps = 6
    return config


def test_masking_follows_bert_and_never_touches_padding():
    lengths = np.array([300, 1000, 0, 517])
    tokens = np.where(np.arange(1000)[None] < lengths[:, None],
                      np.random.default_rng(0).integers(1, VOCAB, (4, 1000)), 0).astype(np.int32)
    corrupted, chosen = map(np.asarray, pretrain.mask_tokens(jax.random.key(0), jnp.asarray(tokens), 0.3, VOCAB))
    real = tokens != 0
    assert not chosen[~real].any() and (corrupted[~real] == 0).all()  # padding stays padding, unpredicted
    assert (corrupted[~chosen] == tokens[~chosen]).all()
    assert abs(chosen.sum() / real.sum() - 0.3) < 0.03
    share = lambda where: where[chosen].mean()  # noqa: E731
    masked, kept = corrupted == mask_id(VOCAB), corrupted == tokens
    assert abs(share(masked) - 0.8) < 0.04 and abs(share(kept) - 0.1 - 0.1 / (VOCAB - 1)) < 0.03
    assert ((corrupted >= 1) & (corrupted <= VOCAB)).all(where=chosen)  # random tokens are real ids
    again, _ = pretrain.mask_tokens(jax.random.key(0), jnp.asarray(tokens), 0.3, VOCAB)
    np.testing.assert_array_equal(np.asarray(again), corrupted)  # a function of the key


def test_token_loss_weighs_the_chosen_positions_only():
    logits = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, 7)), jnp.float32)
    targets = jnp.asarray([[1, 2, 3, 0, 0], [4, 5, 6, 1, 2]])
    weight = targets > 2
    loss, accuracy = pretrain.token_loss(logits, targets, weight)
    picked = -jax.nn.log_softmax(logits)[np.asarray(weight)]
    assert float(loss) == pytest.approx(float(picked[np.arange(4), np.asarray(targets)[np.asarray(weight)]].mean()),
                                        rel=1e-6)
    assert 0 <= float(accuracy) <= 1


@pytest.mark.parametrize("change, message", [
    (dict(objective="bert"), "pretrain.objective"),
    (dict(objective="masked", num_steps=0), "pretrain.num_steps"),
    (dict(mask_rate=1.0), "pretrain.mask_rate"),
    (dict(objective="causal", num_steps=3), "causal needs a causal layer"),
])
def test_bad_pretraining_values_are_one_clear_line(change, message):
    config = tiny_config("")
    config.pretrain.update(change)
    with pytest.raises(ConfigError, match=message):
        config_settings.from_config(config)


@pytest.mark.slow
def test_fine_tuning_starts_from_the_pretrained_encoder_with_a_new_head(data_cache):
    config = pretraining_config(data_cache)
    task, mesh = tasks.get_task(config.task), distributed.make_mesh()
    _, _, pretrained = initial_state.create_train_state(from_config(config), task, mesh, pretraining=True)
    _, _, fresh = initial_state.create_train_state(from_config(config), task, mesh)
    fresh_head = [np.asarray(x) for x in jax.tree.leaves(fresh.params["head"])]
    state = pretrain.transfer_encoder(pretrained, fresh)
    for a, b in zip(jax.tree.leaves(state.params["encoder"]), jax.tree.leaves(pretrained.params["encoder"]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(state.params["head"]), fresh_head, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert int(state.step) == 0
    assert not np.array_equal(np.asarray(pretrained.params["encoder"]["embed"]["embedding"][...]),
                              np.asarray(initial_state.create_train_state(from_config(config), task, mesh)[2].params["encoder"]
                                         ["embed"]["embedding"][...]))  # the transfer is not a no-op


class SplitRead(Exception):
    pass


class Untouchable:
    """A split that raises on any read."""

    def __getattr__(self, name):
        raise SplitRead(name)

    def __iter__(self):
        raise SplitRead("iter")

    def __getitem__(self, index):
        raise SplitRead("getitem")

    def __len__(self):
        raise SplitRead("len")


@pytest.mark.slow
def test_pretraining_never_reads_validation_or_test(data_cache, tmp_path, monkeypatch):
    config = pretraining_config(data_cache)
    task = tasks.get_task(config.task)

    def load(*args):
        splits = task.load(*args)
        return {"train": splits["train"], "val": Untouchable(), "test": Untouchable()}

    monkeypatch.setattr(tasks, "get_task", lambda name: dataclasses.replace(task, load=load))
    workdir = str(tmp_path / "run")
    with pytest.raises(SplitRead):  # fine-tuning validates: the first read of those splits
        trainer.train_and_evaluate(from_config(config), workdir)
    with open(os.path.join(workdir, "pretrain", pretrain.STAGE_RECORD)) as f:
        record = json.load(f)
    assert record["status"] == "complete" and record["num_steps"] == 6 and record["split"] == "train"


@pytest.mark.slow
def test_a_causal_softmax_run_pretrains_on_next_tokens_then_fine_tunes(data_cache, tmp_path):
    config = pretraining_config(data_cache)
    config.attention.causal = True
    config.model.update(pooling="mean", cls_token=False)
    config.pretrain.objective = "causal"
    results = trainer.train_and_evaluate(from_config(config), str(tmp_path / "run"))
    assert results["pretrain"]["objective"] == "causal" and results["pretrain"]["status"] == "complete"
    assert results["attention"]["causal"] is True and 0 <= results["test_accuracy"] <= 1


def stage_params(config, workdir, pretraining):
    like = initial_state.create_train_state(from_config(config), tasks.get_task(config.task), distributed.make_mesh(),
                                      pretraining=pretraining)[2]
    where = os.path.join(workdir, "pretrain" if pretraining else "", "checkpoints")
    state = checkpointing.Checkpoints(where).restore_last(like)
    return int(state.step), [np.asarray(x) for x in jax.tree.leaves(state.params)]


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_run_stopped_mid_pretraining_resumes_to_the_uninterrupted_result(data_cache, tmp_path, monkeypatch):
    config = pretraining_config(data_cache)
    straight = str(tmp_path / "straight")
    first = trainer.train_and_evaluate(from_config(config), straight)
    assert first["pretrain_objective"] == "masked" and first["pretrain"]["num_steps"] == 6
    assert first["pretrain"]["steps_per_second"] > 0 and first["pretrain"]["examples_seen"] == 6 * 16
    pre_lines = lines(os.path.join(straight, "pretrain", "metrics.jsonl"))
    assert [m["step"] for m in pre_lines if "pretrain/loss" in m] == [3, 6]
    assert not any("val/accuracy" in m or "test/accuracy" in m for m in pre_lines)

    check_finite, signalled = step_metrics.check_finite, []

    def terminated_while_pretraining_step_5_runs(step_metrics, step, workdir, *args):
        if step == 4 and workdir.endswith("pretrain") and not signalled:
            signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        check_finite(step_metrics, step, workdir, *args)

    interrupted = str(tmp_path / "interrupted")
    monkeypatch.setattr(step_metrics, "check_finite", terminated_while_pretraining_step_5_runs)
    assert trainer.train_and_evaluate(from_config(config), interrupted) is None
    assert stage_params(config, interrupted, pretraining=True)[0] == 5
    assert checkpointing.Checkpoints(os.path.join(interrupted, "checkpoints")).last_step() is None  # not fine-tuned
    monkeypatch.setattr(step_metrics, "check_finite", check_finite)
    resumed = trainer.train_and_evaluate(from_config(config), interrupted)

    for pretraining in (True, False):
        step_a, params_a = stage_params(config, straight, pretraining)
        step_b, params_b = stage_params(config, interrupted, pretraining)
        assert step_a == step_b == 6
        for a, b in zip(params_a, params_b, strict=True):
            np.testing.assert_allclose(a, b, rtol=8 * F32_EPS, atol=8 * F32_EPS * np.abs(b).max())
    assert resumed["test_accuracy"] == first["test_accuracy"]
    for a, b in zip(pre_lines, lines(os.path.join(interrupted, "pretrain", "metrics.jsonl")), strict=True):
        assert b.keys() == a.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)

    # finished: both stages are read back, nothing trains again
    again = str(tmp_path / "again")
    shutil.copytree(straight, again)
    assert trainer.train_and_evaluate(from_config(config), again) == json.loads(json.dumps(first))


@pytest.mark.slow
def test_the_causal_objective_predicts_each_next_real_token():
    config = tiny_config("", "softmax", causal=True)
    config.model.update(pooling="mean", cls_token=False)
    config.pretrain.update(objective="causal", num_steps=3)
    settings = config_settings.from_config(config)
    model = pretrain.build_model(settings, tasks.get_task("listops"))(jax.random.key(0))
    tokens = jnp.asarray([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]], jnp.int32)
    tokens = jnp.pad(tokens, ((0, 0), (0, config.max_len - tokens.shape[1])))
    loss, accuracy = pretrain.make_objective(settings, VOCAB)(model, {"inputs": tokens}, jax.random.key(1))
    logits = model(tokens, deterministic=False, rngs=nnx.Rngs(jax.random.key(1)))
    targets = tokens[:, 1:]
    expected = -jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), targets[..., None], -1)[..., 0]
    weight = np.asarray(targets != 0)
    assert weight.sum() == 3 + 5  # the next real tokens only: never padding
    assert float(loss) == pytest.approx(float(np.asarray(expected)[weight].mean()), rel=1e-5)
