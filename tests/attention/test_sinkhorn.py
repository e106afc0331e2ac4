"""Sparse Sinkhorn attention: the Sinkhorn operator, a forced permutation, Gumbel keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, qkv_and_mask, real, reassociation_tol, slow_except
from lra_jax.attention import registry
from lra_jax.attention.learned_patterns.sinkhorn import UNROLLED_ROUNDS, log_sinkhorn, sinkhorn_attention, sort_matrix
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Enough Sinkhorn rounds to converge on these 5 x 5 and 6 x 6 logits in float32 (10 leave ~5e-6).
ITERATIONS = 20
SINKHORN_TOL = reassociation_tol(6, depth=2 * ITERATIONS)

HEADS, HEAD_DIM = 2, 8


def test_sinkhorn_iterations_give_a_doubly_stochastic_matrix():
    logits = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    sinkhorn = jax.jit(lambda x, iterations: jnp.exp(log_sinkhorn(x, iterations)), static_argnums=1)
    p = np.asarray(sinkhorn(logits, ITERATIONS))
    # 20 iterations of a row and a column log-sum-exp over 6 terms each: float32 round-off up to
    # 2 * 20 * 6 eps = 3e-5 in the marginals, far below one iteration's error (> 1e-2).
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=SINKHORN_TOL)
    np.testing.assert_allclose(p.sum(-2), 1.0, atol=SINKHORN_TOL)
    # One iteration is not enough: rows are off after the column step.
    assert np.abs(np.asarray(sinkhorn(logits, 1)).sum(-1) - 1).max() > 1e-2


@pytest.mark.slow
def test_rounds_past_the_unrolled_count_run_as_one_loop_with_the_same_result_and_gradient():
    rng = np.random.default_rng(2)
    logits = 4 * rng.standard_normal((2, 3, 6, 6)).astype(np.float32)  # sharp: every round still moves it
    weights = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)  # a cotangent for the gradient

    def looped(x, extra=3):  # UNROLLED_ROUNDS + extra rounds in one call: a compiled loop
        return jnp.exp(log_sinkhorn(x, UNROLLED_ROUNDS + extra))

    def unrolled(x, extra=3):  # the same rounds in two calls, each unrolled
        return jnp.exp(log_sinkhorn(log_sinkhorn(x, UNROLLED_ROUNDS), extra))

    primitives = {str(e.primitive) for e in jax.make_jaxpr(looped)(logits).eqns}
    assert primitives & {"scan", "while"}
    assert not {str(e.primitive) for e in jax.make_jaxpr(unrolled)(logits).eqns} & {"scan", "while"}

    def gradient(f, extra=3):
        return np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(f(x, extra) * weights)))(logits))

    assert_close(np.asarray(jax.jit(looped)(logits)), np.asarray(jax.jit(unrolled)(logits)), SINKHORN_TOL)
    assert_close(gradient(looped), gradient(unrolled), SINKHORN_TOL)
    # One round fewer moves both by 3e-3 of their scale (> 100 x the tolerance): the loop runs every round.
    assert np.abs(np.asarray(jax.jit(unrolled)(logits)) - np.asarray(unrolled(logits, 2))).max() > 1e-3
    assert np.abs(gradient(unrolled) - gradient(unrolled, 2)).max() > 1e-3


def test_padded_blocks_are_cut_out_of_the_sorting_matrix():
    logits = np.random.default_rng(1).standard_normal((2, 1, 5, 5)).astype(np.float32)
    real_blocks = np.array([[True] * 5, [True, True, True, False, False]])
    sort = jax.jit(lambda x, r: sort_matrix(x, r, temperature=1.0, iterations=ITERATIONS))
    p = np.asarray(sort(logits, real_blocks))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=SINKHORN_TOL)  # as above, over <= 6 blocks
    np.testing.assert_allclose(p.sum(-2), 1.0, atol=SINKHORN_TOL)
    np.testing.assert_array_equal(p[1, 0, :3, 3:], 0.0)  # real rows give padded blocks nothing
    np.testing.assert_array_equal(p[1, 0, 3:], np.eye(5)[3:])  # padded blocks map to themselves
    # The real 3 x 3 part is what Sinkhorn gives on it alone: appended blocks change nothing.
    alone = sort(logits[1:, :, :3, :3], real_blocks[1:, :3])
    assert_close(p[1, 0, :3, :3], np.asarray(alone)[0, 0], TOL)


def block_pair_reference(q, k, v, mask, block, partner):
    """In float64: query block i attends to the real keys of blocks i and partner[i] (a dense mask)."""
    n = q.shape[1]
    blk = np.arange(n) // block
    allowed = (blk[None, :] == blk[:, None]) | (blk[None, :] == np.asarray(partner)[blk][:, None])
    allowed = allowed[None, None] & mask[:, None, None, :]
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    logits = np.where(allowed, np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(q.shape[-1]), -1e300)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v64)


@pytest.mark.parametrize("partner", slow_except([[0, 1, 2, 3], [1, 2, 3, 0], [3, 0, 1, 2]], keep=[[1, 2, 3, 0]]))
def test_a_forced_permutation_is_attention_over_own_and_partner_block(partner):
    n, block = 16, 4
    q, k, v, mask = qkv_and_mask(n, [16, 14, 13], HEADS, HEAD_DIM, seed=sum(partner))
    # Sorting logits 10 on the wanted permutation, temperature 1e-3: Sinkhorn returns it exactly.
    logits = np.broadcast_to(10.0 * np.eye(4)[partner], (3, HEADS, 4, 4)).astype(np.float32)

    @jax.jit
    def attend(q, k, v, mask, logits):
        p = sort_matrix(logits, jnp.ones((3, 4), bool), temperature=1e-3, iterations=5)
        return sinkhorn_attention(q, k, v, mask, p, block)

    out = real(attend(q, k, v, mask, logits), mask)
    want = real(block_pair_reference(q, k, v, mask, block, partner), mask)
    assert_close(out, want, TOL)
    assert np.abs(out - real(softmax_attention(q, k, v, mask), mask)).max() > 1e-2  # it is sparse


def layer(seed=0, **settings):
    settings = {"block": 4, "max_len": 24} | settings
    return registry.build("sinkhorn", dim=HEADS * HEAD_DIM, num_heads=HEADS, rngs=nnx.Rngs(seed), **settings)


@pytest.mark.slow
def test_gumbel_noise_only_in_training_and_from_the_given_key():
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 20, HEADS * HEAD_DIM)), jnp.float32)
    mask = jnp.arange(20)[None, :] < jnp.array([[20], [11]])
    model = layer()
    graphdef, state = nnx.split(model)

    def run(state, x, key, train):
        rngs = nnx.Rngs(key) if train else None
        return nnx.merge(graphdef, state)(x, mask, deterministic=not train, rngs=rngs)

    run = jax.jit(run, static_argnums=3)
    key1, key2 = jax.random.key(1), jax.random.key(2)
    evaluation = np.asarray(run(state, x, key1, False))
    np.testing.assert_array_equal(np.asarray(run(state, x, key2, False)), evaluation)  # no noise in eval
    a, a_again, b = (np.asarray(run(state, x, key, True)) for key in (key1, key1, key2))
    np.testing.assert_array_equal(a, a_again)  # one key repeats
    assert np.abs(a - b).max() > 1e-4  # two keys differ
    assert np.abs(a - evaluation).max() > 1e-4  # training adds noise (dropout is 0 here)
    assert np.isfinite(a).all()


@pytest.mark.slow
def test_sorting_network_learns_through_the_permutation():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 20, HEADS * HEAD_DIM)), jnp.float32)
    mask = jnp.arange(20)[None, :] < jnp.array([[20], [6]])  # row 2: blocks 2-4 fully padded
    model = layer()
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params):
        return jnp.sum(nnx.merge(graphdef, params)(x, mask, deterministic=True) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    kernel_grad = np.asarray(grads["sort_kernel"][...])
    assert np.isfinite(kernel_grad).all() and np.abs(kernel_grad).max() > 0


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="block"):
        layer(block=0)
    with pytest.raises(ConfigError, match="max_len"):
        registry.build("sinkhorn", dim=16, num_heads=2, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="temperature"):
        layer(temperature=0.0)
    x = jnp.zeros((1, 30, HEADS * HEAD_DIM))
    with pytest.raises(ConfigError, match="max_len"):
        layer()(x, jnp.ones((1, 30), bool), deterministic=True)
