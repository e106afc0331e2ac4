"""The jitted train and evaluation steps over pure NNX state, shared by the trainer and the
commands that compile them without running them (`lra_jax.tools.compile`, `lower`).

The state is a `train_state.TrainState` (step, params, rest, opt_state).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lra_jax.errors import ConfigError
from lra_jax.training.train_state import TrainState


def cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def micro_batches(batch: dict[str, jax.Array], accum_steps: int) -> dict[str, jax.Array]:
    """[B, ...] -> [accum_steps, B / accum_steps, ...]; micro-batch i holds rows i, i + k, i + 2k, ...

    Strided rather than contiguous: a batch split over the devices' rows keeps every micro-batch
    split over the same devices, so accumulation moves no data between them.
    """
    size = batch["label"].shape[0]
    if size % accum_steps:
        raise ConfigError(f"batch_size {size} is not divisible by grad_accum_steps {accum_steps}")
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(size // accum_steps, accum_steps, *x.shape[1:]), 0, 1),
                        batch)


def classification(model, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The classifier's objective: mean cross-entropy of the labels, and accuracy; `key` drives dropout."""
    logits = model(batch["inputs"], deterministic=False, rngs=nnx.Rngs(key))
    return cross_entropy(logits, batch["label"]).mean(), jnp.mean(jnp.argmax(logits, -1) == batch["label"])


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, key: jax.Array,
                    skipped_updates: int = 0, accum_steps: int = 1, objective=classification):
    """(state, batch) -> (state, metrics); the key of step s is fold_in(key, s).

    `objective(model, batch, key) -> (loss, accuracy)` is minimised: `classification`, or a
    pretraining objective (`training.pretrain.make_objective`).

    With `accum_steps` = k > 1 the batch is split into k micro-batches (`micro_batches`) whose
    gradients are averaged in a `lax.scan` before one optimizer update: the update of the whole
    batch, mean_i grad L_i = grad (1/k sum_i L_i), in 1/k of the activation memory. Micro-batch i
    draws its dropout from fold_in(step key, i); non-Param state (Routing's centroids) is threaded
    through the micro-batches in order.

    metrics: loss, accuracy, grad_norm (global L2 norm of the gradient), skipped and finite: False
    when the step left a non-finite state, i.e. its loss or gradient norm is not finite and the
    update was not skipped (`tx` wrapped in optax.apply_if_finite with `skipped_updates` > 0 skips
    up to that many in a row; a skipped step also keeps the non-Param state it had).
    """
    if accum_steps < 1:
        raise ConfigError(f"grad_accum_steps must be >= 1, got {accum_steps}")
    key_data, key_impl = np.asarray(jax.random.key_data(key)), jax.random.key_impl(key)  # host constant

    def gradients(params, rest, batch, dropout_key):
        def loss_fn(params):
            # copy=True: a fresh model whose non-Param state (e.g. Routing's centroids) may be updated here
            model = nnx.merge(graphdef, params, rest, copy=True)
            loss, accuracy = objective(model, batch, dropout_key)
            _, _, new_rest = nnx.split(model, nnx.Param, ...)
            return loss, (accuracy, new_rest)

        (loss, (accuracy, new_rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return grads, new_rest, loss, accuracy

    def accumulated(params, rest, batch, step_key):
        def body(carry, micro):
            grad_sum, rest = carry
            index, micro_batch = micro
            grads, rest, loss, accuracy = gradients(params, rest, micro_batch, jax.random.fold_in(step_key, index))
            return (jax.tree.map(jnp.add, grad_sum, grads), rest), (loss, accuracy)

        zeros = jax.tree.map(jnp.zeros_like, params)
        (grad_sum, rest), (losses, accuracies) = jax.lax.scan(
            body, (zeros, rest), (jnp.arange(accum_steps), micro_batches(batch, accum_steps)))
        grads = jax.tree.map(lambda g: g / accum_steps, grad_sum)
        return grads, rest, losses.mean(), accuracies.mean()

    def train_step(state, batch):
        step_key = jax.random.fold_in(jax.random.wrap_key_data(key_data, impl=key_impl), state.step)
        if accum_steps == 1:
            grads, rest, loss, accuracy = gradients(state.params, state.rest, batch, step_key)
        else:
            grads, rest, loss, accuracy = accumulated(state.params, state.rest, batch, step_key)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        skipped = jnp.zeros((), bool)
        if skipped_updates:
            skipped = ~finite & (opt_state.notfinite_count <= skipped_updates)
            rest = jax.tree.map(lambda old, new: jnp.where(skipped, old, new), state.rest, rest)
        new_state = TrainState(step=state.step + 1, params=params, rest=rest, opt_state=opt_state)
        return new_state, {"loss": loss, "accuracy": accuracy, "grad_norm": grad_norm,
                           "finite": finite | skipped, "skipped": skipped}

    return jax.jit(train_step, donate_argnums=0)



def make_eval_step(graphdef: nnx.GraphDef):
    """(state, batch) -> summed loss, correct count and example count (padding weighs 0)."""

    def eval_step(state, batch):
        model = nnx.merge(graphdef, state.params, state.rest)
        logits = model(batch["inputs"], deterministic=True)
        weight = batch["weight"]
        correct = (jnp.argmax(logits, -1) == batch["label"]) * weight
        return {"loss": jnp.sum(cross_entropy(logits, batch["label"]) * weight),
                "correct": jnp.sum(correct), "count": jnp.sum(weight)}

    return jax.jit(eval_step)
