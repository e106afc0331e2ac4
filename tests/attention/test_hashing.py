"""Reformer LSH attention against full attention and a dense reference of its hashing pattern."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, real, reassociation_tol
from lra_jax.attention import registry
from lra_jax.attention.core import unit_vectors
from lra_jax.attention.learned_patterns.hashing import HashRotations
from lra_jax.attention.softmax import softmax_attention
from lra_jax.errors import ConfigError

# float32 against a float64 reference or another float32 order of the same sums (jit, chunks,
# blocks, padding appended): sums of at most 40 terms (positions, widths) chained through up to 8
# reductions in one layer: 4e-5 of the compared values' scale. A wrong mask, pattern or scale is O(1).
TOL = reassociation_tol(40, depth=8)
# Gradients chain the backward pass's as many reductions again.
GRAD_TOL = reassociation_tol(40, depth=16)

HEADS, HEAD_DIM = 2, 8


def qv_and_mask(n, lengths, heads=HEADS, seed=0):
    """Per-head q, v [b n h d] and a ragged mask [b n]; numpy, so no compile per shape."""
    rng = np.random.default_rng(seed)
    q, v = (rng.standard_normal((len(lengths), n, heads, HEAD_DIM)).astype(np.float32) for _ in range(2))
    return q, v, np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def reformer(heads=HEADS, seed=0, **settings):
    return registry.build("reformer", dim=heads * HEAD_DIM, num_heads=heads, rngs=nnx.Rngs(seed), **settings)


@nnx.jit
def _eval(layer, q, v, mask):
    return layer.attend(q, q, v, mask, deterministic=True, rngs=None)


@nnx.jit
def _train(layer, q, v, mask, key):
    return layer.attend(q, q, v, mask, deterministic=False, rngs=nnx.Rngs(key))


def attend(layer, deterministic=True):
    """Jitted `attend(q, q, v, mask)` (shared QK), the layer's state an argument (one compile per setting).

    In training mode the returned function takes a key for the call's rngs.
    """
    if deterministic:
        return lambda q, v, mask: _eval(layer, q, v, mask)
    return lambda q, v, mask, key: _train(layer, q, v, mask, key)


# --- the exact limit ----------------------------------------------------------------------------


def test_one_bucket_one_round_whole_sequence_chunk_no_self_mask_is_softmax_with_normalised_keys():
    n = 11
    q, v, mask = qv_and_mask(n, [n, 6, 1])
    layer = reformer(num_buckets=1, num_hashes=1, chunk_size=16, mask_self=False)

    def loss(q, v, lsh):
        out = (layer.attend(q, q, v, mask, deterministic=True, rngs=None) if lsh
               else softmax_attention(q, unit_vectors(q), v, mask))
        return jnp.sum(jnp.where(mask[:, :, None, None], out, 0.0) ** 2), out

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    (_, out), grads = run(q, v, True)
    (_, want), want_grads = run(q, v, False)
    assert_close(real(out, mask), real(want, mask), TOL)
    for got, expected in zip(grads, want_grads):
        assert_close(np.asarray(got), np.asarray(expected), GRAD_TOL)


# --- a dense reference of the LSH pattern -----------------------------------------------------------


def dense_lsh_reference(q, v, mask, rotations, num_buckets, chunk, mask_self=True, dedup=True):
    """In float64 with explicit n x n masks, per round, from the definitions in the module docstring.

    Returns the lse-weighted mix of the rounds and, separately, one softmax over the union of the
    rounds' pairs (equal to the mix when dedup=True).
    """
    q, v = q.astype(np.float64), v.astype(np.float64)
    _, n, _, d = q.shape
    k = q / np.linalg.norm(q, axis=-1, keepdims=True)
    rotated = np.einsum("bnhd,drk->bhrnk", k, rotations.astype(np.float64))
    buckets = np.argmax(np.concatenate([rotated, -rotated], -1), -1) if num_buckets > 1 else 0 * rotated[..., 0]
    buckets = np.where(mask[:, None, None, :], buckets, num_buckets).astype(int)  # [b h r n]
    pos = np.arange(n)
    rank = np.argsort(np.argsort(buckets * n + pos, axis=-1, kind="stable"), axis=-1)
    chunk_of = rank // min(chunk, n)
    step = chunk_of[..., :, None] - chunk_of[..., None, :]  # chunk(i) - chunk(j)
    pairs = ((buckets[..., :, None] == buckets[..., None, :]) & ((step == 0) | (step == 1))
             & mask[:, None, None, None, :])  # [b h r n n]: j in P_i^(r)
    count = pairs.sum(axis=2, keepdims=True)  # N_{i,j}
    logits = np.einsum("bqhd,bkhd->bhqk", q, k)[:, :, None] / np.sqrt(d)
    if mask_self:
        logits = np.where(np.eye(n, dtype=bool), -1e5, logits)

    def softmax(logits, allowed):
        logits = np.where(allowed, logits, -1e300)
        top = logits.max(-1, keepdims=True)
        lse = top[..., 0] + np.log(np.exp(logits - top).sum(-1))
        return np.exp(logits - lse[..., None]), lse

    round_logits = logits - np.log(np.maximum(count, 1)) if dedup else logits + 0 * count
    probs, lse = softmax(round_logits, pairs)  # [b h r n n], [b h r n]
    outs = np.einsum("bhrqk,bkhd->bhrqd", probs, v)
    weights = np.exp(lse - lse.max(2, keepdims=True))
    mix = np.einsum("bhrq,bhrqd->bqhd", weights / weights.sum(2, keepdims=True), outs)
    union_probs, _ = softmax(logits[:, :, 0], pairs.any(axis=2))
    union = np.einsum("bhqk,bkhd->bqhd", union_probs, v)
    return mix, union


@pytest.mark.parametrize(
    "n, chunk, num_buckets, num_hashes, dedup",
    [
        (13, 3, 4, 2, True),  # a short last chunk
        (13, 3, 4, 2, False),  # no duplicate correction: each round's softmax weighted by its lse
        (20, 4, 2, 3, True),  # three rounds
        (9, 16, 4, 2, True),  # one chunk: buckets alone restrict
    ],
)
@pytest.mark.slow
def test_chunked_lsh_matches_a_dense_reference_of_its_pattern(n, chunk, num_buckets, num_hashes, dedup):
    q, v, mask = qv_and_mask(n, [n, n - 4, 2, 1], seed=n + chunk)
    layer = reformer(chunk_size=chunk, num_buckets=num_buckets, num_hashes=num_hashes, dedup=dedup, seed=n)
    out = real(attend(layer)(q, v, mask), mask)
    mix, union = dense_lsh_reference(q, v, mask, np.asarray(layer.rotations[...]), num_buckets, chunk, dedup=dedup)
    assert_close(out, real(mix, mask), TOL)
    if dedup:  # the lse-weighted mix with the log N correction is one softmax over the union of the rounds
        assert_close(out, real(union, mask), TOL)
    elif num_hashes > 1:  # without it, pairs found in several rounds count more
        assert np.abs(out - real(union, mask)).max() > 1e-4
    # The pattern restricts: full attention with normalised shared keys differs.
    full = real(softmax_attention(q, unit_vectors(q), v, mask), mask)
    assert np.abs(out - full).max() > 1e-3


@pytest.mark.slow
def test_padding_sorted_last_keeps_real_chunks_whatever_the_padding():
    """Real outputs do not change with padded content nor with appended padding (4 buckets, 3 rounds)."""
    n, extra = 20, 13
    q, v, mask = qv_and_mask(n + extra, [n, 11, 3], seed=5)
    run = attend(reformer(chunk_size=3, num_buckets=4, num_hashes=3))
    short = real(run(q[:, :n], v[:, :n], mask[:, :n]), mask[:, :n])
    long = real(run(q, v, mask)[:, :n], mask[:, :n])
    assert_close(long, short, TOL)
    noisy = np.where(mask[:, :, None, None], q, 100.0 * np.random.default_rng(1).standard_normal(q.shape))
    assert_close(real(run(noisy.astype(np.float32), v, mask), mask), real(run(q, v, mask), mask), TOL)


# --- self-masking ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_token_attends_to_itself_only_when_alone():
    n = 8
    u = np.random.default_rng(3).standard_normal(HEAD_DIM).astype(np.float32)
    q = np.broadcast_to(u, (1, n, 1, HEAD_DIM)).copy()
    q[0, 0, 0] = -u  # the opposite direction: the other bucket of 2, alone there
    v = np.random.default_rng(4).standard_normal((1, n, 1, HEAD_DIM)).astype(np.float32)
    mask = np.arange(n)[None, :] < 7  # one padded token, in no bucket
    for mask_self in (True, False):
        layer = reformer(heads=1, chunk_size=n, num_buckets=2, num_hashes=1, mask_self=mask_self)
        out = np.asarray(attend(layer)(q, v, mask))[0, :, 0]
        assert_close(out[0], v[0, 0, 0], TOL)  # alone: itself
        for i in range(1, 7):  # equal scores: the mean over the others of its bucket (and itself without mask_self)
            others = [j for j in range(1, 7) if j != i or not mask_self]
            assert_close(out[i], v[0, others, 0].mean(0), TOL)


# --- randomness -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_evaluation_hashes_come_from_the_init_key_and_training_hashes_from_the_call_key():
    n = 24
    q, v, mask = qv_and_mask(n, [n, 17], seed=2)
    settings = {"chunk_size": 4, "num_buckets": 4, "num_hashes": 2}
    a, b, a_again = (reformer(seed=s, **settings) for s in (0, 1, 0))
    out_a, out_b, out_a_again = (attend(m)(q, v, mask) for m in (a, b, a_again))
    np.testing.assert_array_equal(np.asarray(out_a), np.asarray(out_a_again))
    assert np.abs(np.asarray(out_a) - np.asarray(out_b)).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(attend(a)(q, v, mask)), np.asarray(out_a))  # eval repeats

    train = attend(a, deterministic=False)
    key1, key2 = jax.random.key(1), jax.random.key(2)
    t1, t1_again, t2 = train(q, v, mask, key1), train(q, v, mask, key1), train(q, v, mask, key2)
    np.testing.assert_array_equal(np.asarray(t1), np.asarray(t1_again))
    assert np.abs(np.asarray(t1) - np.asarray(t2)).max() > 1e-3
    assert np.abs(np.asarray(t1) - np.asarray(out_a)).max() > 1e-3  # fresh rotations, not the stored ones


def test_rotations_are_state_not_parameters_and_there_is_no_key_projection():
    layer = reformer(chunk_size=4, num_buckets=8, num_hashes=3)
    assert isinstance(layer.rotations, HashRotations) and layer.rotations.shape == (HEAD_DIM, 3, 4)
    params = nnx.state(layer, nnx.Param)
    assert "rotations" not in params and "rotations" in nnx.state(layer, nnx.Not(nnx.Param))
    assert set(params.keys()) == {"query", "value", "out"}  # shared QK


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="num_buckets"):
        reformer(num_buckets=3)
    with pytest.raises(ConfigError, match="max_len"):
        reformer()  # num_buckets derived from max_len
    assert reformer(chunk_size=32, max_len=2000).num_buckets == 64  # average bucket ~ one chunk
