"""softmax_values: the hand-written forward and backward equal autodiff of softmax -> dropout -> matmul."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_jax import compat
from lra_jax.attention.weighted_values import softmax_values
from lra_jax.config.settings import from_config
from lra_jax.data.tasks import TaskSpec
from lra_jax.kernels import dropout as counter_mask
from lra_jax.kernels.masking import MASK_VALUE
from lra_jax.measure.step_timing import random_batch
from lra_jax.research.benchmarks import bench_cells
from lra_jax.training import distributed, initial_state
from lra_jax.training.steps import make_train_step


def reference(logits, values, seed, rate):
    """The composition autodiff sees: softmax, the layer's dropout (`counter_mask.drop`), the product."""
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    if rate:
        probs = counter_mask.drop(probs, seed, rate)
    out = jnp.einsum("...qk,...kd->...qd", probs.astype(values.dtype), values)
    return out, jax.nn.logsumexp(logits, axis=-1)


def inputs(dtype=jnp.float32, shape=(2, 3, 7, 9, 5)):
    """Logits [2, 3, 7, 9] with masked keys, a row with every key masked and one logit far above the
    rest (a row whose softmax is nearly one-hot), and values [2, 3, 9, 5]."""
    kl, kv = jax.random.split(jax.random.key(0))
    *lead, q, k, d = shape
    logits = 3.0 * jax.random.normal(kl, (*lead, q, k))
    logits = logits.at[..., -2:].set(MASK_VALUE)  # the last two keys are padding
    logits = logits.at[0, 1, 2, :].set(MASK_VALUE)  # a query without any real key
    logits = logits.at[1, 0, 4, 3].set(80.0)
    values = jax.random.normal(kv, (*lead, k, d))
    return logits.astype(dtype), values.astype(dtype)


def loss_of(fn, rate, seed):
    """A loss that reaches both outputs with cotangents other than ones."""
    def loss(logits, values):
        out, lse = fn(logits, values, seed, rate)
        where_real = lse > MASK_VALUE / 2
        return jnp.sum(jnp.sin(out.astype(jnp.float32))) + jnp.sum(jnp.where(where_real, jnp.cos(lse), 0.0))
    return loss


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5])
@pytest.mark.slow
def test_outputs_and_gradients_equal_autodiff_of_the_composition(rate):
    logits, values = inputs()
    seed = jnp.array([7], jnp.uint32)
    out, lse = softmax_values(logits, values, seed, rate)
    want_out, want_lse = reference(logits, values, seed, rate)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-4)
    got = jax.grad(loss_of(softmax_values, rate, seed), argnums=(0, 1))(logits, values)
    want = jax.grad(loss_of(reference, rate, seed), argnums=(0, 1))(logits, values)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(w))))


def test_dropout_changes_the_output_and_the_seed_picks_the_mask():
    logits, values = inputs()
    plain, _ = softmax_values(logits, values)
    first, _ = softmax_values(logits, values, jnp.array([1], jnp.uint32), 0.1)
    again, _ = softmax_values(logits, values, jnp.array([1], jnp.uint32), 0.1)
    other, _ = softmax_values(logits, values, jnp.array([2], jnp.uint32), 0.1)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, plain) and not np.allclose(first, other)


@pytest.mark.slow
def test_bfloat16_keeps_dtypes_and_stays_near_float32():
    logits, values = inputs(jnp.bfloat16)
    seed = jnp.array([3], jnp.uint32)
    out, lse = jax.jit(softmax_values, static_argnums=3)(logits, values, seed, 0.1)
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    grads = jax.grad(loss_of(softmax_values, 0.1, seed), argnums=(0, 1))(logits, values)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]
    want, _ = reference(logits.astype(jnp.float32), values.astype(jnp.float32), seed, 0.1)
    np.testing.assert_allclose(out.astype(jnp.float32), want, atol=0.05 * float(jnp.max(jnp.abs(want))))


def test_a_rate_outside_zero_to_one_is_refused():
    logits, values = inputs()
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        softmax_values(logits, values, jnp.array([1], jnp.uint32), 1.0)


@pytest.mark.parametrize("variant", ["softmax", "luong"])
@pytest.mark.slow
def test_dropout_keeps_no_second_weight_array_from_forward_to_backward(variant):
    """The train step keeps P of each layer for the backward. With dropout, M * P must not be kept as
    well (it is drawn again in the backward): 4 layers at n = 512 grow the compiled step's temporaries
    by less than one [b, h, n, n] array (measured: +0.06 on jax 0.10 and 0.12), not by about one per
    layer (+4.4 before the backward tied its M * P to dO)."""
    settings = dict(batch_size=2, seed=0, num_layers=4, num_heads=4, emb_dim=64, mlp_dim=128,
                    dtype="float32", scan_layers=False, remat=False)
    length = 512
    task = TaskSpec("text-bench", bench_cells.VOCAB_SIZE, bench_cells.NUM_CLASSES, False, load=None)
    mesh = distributed.make_mesh()

    def temporaries(rate):
        config = bench_cells.bench_config(variant, length, settings, rate)
        graphdef, tx, state = initial_state.create_train_state(from_config(config), task, mesh)
        batch = random_batch(task, config.batch_size, config.max_len, config.seed)
        with compat.abstract_mesh(mesh):
            compiled = make_train_step(graphdef, tx, jax.random.key(0)).lower(state, batch).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    weights_bytes = settings["batch_size"] * settings["num_heads"] * (length + 1) ** 2 * 4  # + the CLS token
    assert temporaries(0.1) - temporaries(0.0) < weights_bytes
