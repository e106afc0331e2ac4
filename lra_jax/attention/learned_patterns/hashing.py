"""Reformer LSH attention (Kitaev, Kaiser and Levskaya 2020, "Reformer: The Efficient Transformer", sec. 2).

Shared-QK attention. Keys are the queries (one projection), length-normalised,
k_j = q_j / |q_j|, and the scores are q_i . k_j / sqrt(d). (The LRA code multiplies
by sqrt(d) instead of dividing, a known defect the contract rules out.)

Angular LSH (sec. 2, "Hashing attention", after Andoni et al. 2015): for a random
Gaussian matrix R [d, b/2] per round,

    h(x) = argmax([x R ; -x R]),   b = num_buckets buckets.

LSH attention (sec. 2, "LSH attention"): in each hash round r, sort the tokens
by (bucket, position), cut the sorted sequence into chunks of m = chunk_size, and
let every query attend to the keys of its own and of the previous chunk that fall
in its bucket,

    P_i^(r) = { j : h_r(k_j) = h_r(q_i),  chunk_r(j) in {chunk_r(i), chunk_r(i) - 1} },
    o_i^(r) = sum_{j in P_i^(r)} exp(q_i . k_j / sqrt(d) - z(i, P_i^(r))) v_j,

where z is the log-sum-exp of the row. Choices made here:

* No wrap-around: the first chunk has no previous chunk (the paper's and LRA's
  look-one-back wraps to the last chunk). Padded tokens are sorted last (below), so
  the last chunk depends on how much padding follows; a wrap-around neighbour
  would let the amount of padding change real outputs.
* A token attends to itself only when it has no other key (sec. 2, "Causal
  masking for shared-QK attention": q_i . k_i is almost always the largest score).
  Its score is replaced by SELF_VALUE = -1e5, finite and far below any real score
  but far above MASK_VALUE, so it gets weight only when it is alone.
* Padding: padded positions get bucket b, after every real bucket, so they sort
  to the end; a real token's place in the sorted order, hence its chunk, depends
  only on the real tokens. Padded keys are masked; padded queries see no key
  (finite, uniform weights) and the layer zeroes their outputs.

Multi-round LSH (sec. 2, "Multi-round LSH attention"): with num_hashes independent hashes,
the rounds are combined by their log-sum-exps,

    o_i = sum_r exp(z(i, P_i^(r)) - z(i, P_i)) o_i^(r),   z(i, P_i) = logsumexp_r z(i, P_i^(r)),

and, with dedup=True (the paper's correction), every score is lowered by
log N_{i,j}, the number of rounds in which j is in P_i^(r), so that o_i is exactly
one softmax over the union P_i = u_r P_i^(r), each pair counted once.

Cost: per round, n / m chunks of m queries against 2m keys: O(n m) scores and
memory per head and round, instead of O(n^2); the sort is O(n log n).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from lra_jax.attention.core import (
    MASK_VALUE,
    Attention,
    matmul_flops,
    merge_heads,
    split_heads,
    stream_key,
    unit_vectors,
    zero_padding,
)
from lra_jax.attention.registry import register
from lra_jax.attention.weighted_values import NO_SEED, softmax_values
from lra_jax.errors import ConfigError

# Score of a token against itself: finite, far below any real score |q . k / sqrt(d)|
# and far above MASK_VALUE, so a token attends to itself only when it has no other key.
SELF_VALUE = -1e5


class HashRotations(nnx.Variable):
    """Non-trainable random rotations for LSH: the optimiser trains only `nnx.Param`; checkpoints keep them."""


def random_rotations(key: PRNGKeyArray, dim: int, num_hashes: int, num_buckets: int) -> Float[Array, "d r k"]:
    """R [d, num_hashes, max(num_buckets // 2, 1)] with i.i.d. N(0, 1) entries, one matrix per round."""
    width = max(num_buckets // 2, 1)
    # One flat draw, reshaped: XLA:CPU compiles rank-3 random draws far slower than 1-D ones.
    return jax.random.normal(key, (dim * num_hashes * width,), jnp.float32).reshape(dim, num_hashes, width)


def lsh_buckets(
    x: Float[Array, "b n h d"], rotations: Float[Array, "d r k"], mask: Bool[Array, "b n"], num_buckets: int
) -> Int[Array, "b h r n"]:
    """Angular LSH buckets h_r(x) = argmax([x R_r ; -x R_r]) per round; padded positions get `num_buckets`.

    With num_buckets = 1 every real token is in bucket 0.
    """
    b, n, h, _ = x.shape
    r = rotations.shape[1]
    if num_buckets == 1:
        buckets = jnp.zeros((b, h, r, n), jnp.int32)
    else:
        rotated = jnp.einsum("bnhd,drk->bhrnk", x.astype(jnp.float32), rotations.astype(jnp.float32))
        buckets = jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1).astype(jnp.int32)
    return jnp.where(mask[:, None, None, :], buckets, num_buckets)


def _chunks(x: Array, num_chunks: int, chunk: int) -> Array:
    """[b h r c*m ...] -> [b h r c m ...]."""
    return x.reshape(*x.shape[:3], num_chunks, chunk, *x.shape[4:])


def _look_one_back(x: Array, fill) -> Array:
    """[b h r c m ...] -> [b h r c 2m ...]: the previous chunk (`fill` before the first), then the chunk."""
    if x.shape[3] == 1:
        return x
    pad = [(0, 0)] * 3 + [(1, 0)] + [(0, 0)] * (x.ndim - 4)
    previous = jnp.pad(x, pad, constant_values=fill)[:, :, :, :-1]
    return jnp.concatenate([previous, x], axis=4)


def _gather(table: Array, index: Array) -> Array:
    """out[b, h, r', i] = table[b, h, r', index[b, h, i]] for table [b h r' n], index [b h M]."""
    return jnp.take_along_axis(table, index[:, :, None, :], axis=3)


def lsh_attention(
    q: Float[Array, "b n h d"],
    v: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    rotations: Float[Array, "d r k"],
    *,
    num_buckets: int,
    chunk_size: int,
    mask_self: bool = True,
    dedup: bool = True,
    dropout: tuple[Array, float] = (NO_SEED, 0.0),
) -> Float[Array, "b n h d"]:
    """Shared-QK LSH attention of q over the real keys k = q / |q| (module docstring).

    Args:
      q: shared queries/keys.
      v: values.
      mask: True on real tokens.
      rotations: LSH rotations [d, rounds, num_buckets // 2].
      num_buckets: buckets per round (1, or even).
      chunk_size: chunk length m (clamped to n).
      mask_self: a token attends to itself only when it has no other key.
      dedup: lower each score by log N_{i,j}, the rounds in which j is in P_i^(r).
      dropout: (seed, rate) of the attention weights' dropout (`Attention.dropout_seed`).

    Returns:
      The attention outputs [b n h d] in v's dtype; padded queries hold finite garbage.
    """
    b, n, h, d = v.shape
    rounds = rotations.shape[1]
    chunk = max(1, min(chunk_size, n))
    num_chunks = -(-n // chunk)
    padded = num_chunks * chunk

    q_hat = unit_vectors(q)  # hashing h(q) = h(q / |q|): the same buckets for queries and keys
    buckets = lsh_buckets(q_hat, rotations, mask, num_buckets)  # [b h r n]
    positions = jnp.arange(n, dtype=jnp.int32)
    order = jnp.argsort(buckets * n + positions, axis=-1)  # sorted by (bucket, position); [b h r n]
    rank = jnp.argsort(order, axis=-1)  # the inverse permutation: place of each token in the sorted order

    def sort(x: Array, fill) -> Array:  # [b h n ...] -> [b h r padded ...] in each round's sorted order
        index = order.reshape(order.shape + (1,) * (x.ndim - 3))
        x = jnp.take_along_axis(x[:, :, None], index, axis=3)
        pad = [(0, 0)] * 3 + [(0, padded - n)] + [(0, 0)] * (x.ndim - 4)
        return jnp.pad(x, pad, constant_values=fill)

    heads_first = lambda x: jnp.swapaxes(x, 1, 2)
    s_q = _chunks(sort(heads_first(q.astype(jnp.float32)), 0.0), num_chunks, chunk)  # [b h r c m d]
    s_k = _chunks(sort(heads_first(q_hat), 0.0), num_chunks, chunk)
    s_v = _chunks(sort(heads_first(v), 0), num_chunks, chunk)
    s_pos = _chunks(sort(jnp.broadcast_to(positions, (b, h, n)), -1), num_chunks, chunk)  # [b h r c m]
    s_bucket = _chunks(jnp.pad(jnp.take_along_axis(buckets, order, axis=-1),
                               [(0, 0)] * 3 + [(0, padded - n)], constant_values=num_buckets), num_chunks, chunk)
    s_real = _chunks(sort(jnp.broadcast_to(mask[:, None, :], (b, h, n)), False), num_chunks, chunk)

    k_chunks = _look_one_back(s_k, 0.0)  # [b h r c K d], K = 2m (m with one chunk)
    v_chunks = _look_one_back(s_v, 0)
    k_pos = _look_one_back(s_pos, -1)
    k_bucket = _look_one_back(s_bucket, num_buckets)
    k_real = _look_one_back(s_real, False)

    logits = jnp.einsum("bhrcqd,bhrckd->bhrcqk", s_q, k_chunks) / math.sqrt(d)
    allowed = k_real[..., None, :] & (s_bucket[..., :, None] == k_bucket[..., None, :])  # [b h r c m K]
    if mask_self:
        logits = jnp.where(s_pos[..., :, None] == k_pos[..., None, :], SELF_VALUE, logits)
    if dedup and rounds > 1:
        # N_{i,j} = #{r' : h_r'(i) = h_r'(j) and chunk_r'(j) in {chunk_r'(i), chunk_r'(i) - 1}}.
        chunk_of = rank // chunk  # [b h r' n]
        flat = lambda pos: jnp.clip(pos, 0, n - 1).reshape(b, h, -1)
        per_round = lambda table, pos: jnp.moveaxis(
            _gather(table, flat(pos)).reshape(b, h, rounds, *pos.shape[2:]), 2, -1)
        q_bucket_r, q_chunk_r = per_round(buckets, s_pos), per_round(chunk_of, s_pos)
        k_bucket_r, k_chunk_r = per_round(buckets, k_pos), per_round(chunk_of, k_pos)
        step = q_chunk_r[..., :, None, :] - k_chunk_r[..., None, :, :]
        together = (q_bucket_r[..., :, None, :] == k_bucket_r[..., None, :, :]) & ((step == 0) | (step == 1))
        count = jnp.sum(together, axis=-1)  # >= 1 wherever `allowed`: round r itself
        logits = logits - jnp.log(jnp.maximum(count, 1).astype(jnp.float32))
    logits = jnp.where(allowed, logits, MASK_VALUE)

    # lse = z(i, P_i^(r)); finite, also for a row with no key.
    out, lse = softmax_values(logits, v_chunks, *dropout)  # [b h r c m d], [b h r c m]

    # Back to the original order, then mix the rounds by their log-sum-exps.
    unsort = lambda x: jnp.take_along_axis(
        x.reshape(b, h, rounds, padded, *x.shape[5:])[:, :, :, :n],
        rank.reshape(rank.shape + (1,) * (x.ndim - 5)), axis=3)
    out, lse = unsort(out), unsort(lse)  # [b h r n d], [b h r n]
    weights = jax.nn.softmax(lse, axis=2)
    out = jnp.einsum("bhrn,bhrnd->bnhd", weights.astype(v.dtype), out)
    return out.astype(v.dtype)


@register("reformer")
class ReformerAttention(Attention):
    """Reformer LSH attention with shared QK (see module docstring).

    There is no key projection: keys are the normalised queries. Rotations R
    [head_dim, num_hashes, num_buckets / 2] are shared by the heads. At init they
    are drawn from `rngs` (stream "hashes", falling back to the default, then the
    params stream) and stored as `HashRotations` state (not trained, saved in
    checkpoints) for deterministic calls, so evaluation is repeatable. Every
    training call (deterministic=False) hashes with fresh rotations drawn from the
    `rngs` given to `__call__` (stream "hashes", else default, else dropout): the
    encoder gives each layer its own key per step, as the paper re-hashes.

    Args:
      dim, num_heads, rngs, **common: as `Attention`; dropout_rate drops attention weights.
      chunk_size: chunk length m. Default 128: the power of two just below the
        LRA code's chunk (it cuts n = 2000 into 10 chunks of 200).
      num_buckets: buckets b per round (1, or even). Default: derived so that the
        average bucket holds about one chunk at max_len, as in the LRA code
        (10 buckets and 10 chunks), b = 2 * ceil(max_len / (2m)), at least 2.
      num_hashes: hash rounds. Default 2: in the paper's experiments (sec. 5,
        Table 2) one round is clearly worse than two or more; the LRA code used 1
        (set num_hashes=1 to match it). Cost grows linearly with it.
      mask_self: a token attends to itself only when it has nothing else (paper);
        False lets it attend to itself like any key (the full-softmax limit).
      dedup: correct the rounds' duplicate pairs by log N_{i,j} (paper, sec. 2);
        without it a pair found in several rounds counts several times.
    """

    cost_exponent = 1.0  # chunks of fixed size (n log n to sort)
    data_dependent_pattern = True  # angular hashes

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Shared QK: 3 projections (q, v, out). Per round: the hash rotations x R ([n, d_h] x [d_h, b / 2] per head;
        none with one bucket), q.k and p v of every chunk of m queries over 2m keys (its own and the previous
        chunk; m for a single chunk) on the padded length c m, 2 x 2 (c m) 2m d; then the rounds' outputs mixed
        by their weights, 2 n r d. Sorting and gathers are not counted (no arithmetic)."""
        rounds, buckets = settings["num_hashes"], settings["num_buckets"]
        chunk = max(1, min(settings["chunk_size"], n))
        num_chunks = -(-n // chunk)
        keys = (2 if num_chunks > 1 else 1) * chunk
        hashing = matmul_flops(batch * n, dim, rounds * (buckets // 2)) if buckets > 1 else 0.0
        return (0.75 * cls.projection_flops(batch, n, dim) + hashing
                + rounds * cls.attention_flops(batch * num_chunks * chunk, keys, dim)
                + matmul_flops(batch * n, rounds, dim))

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        chunk_size: int = 128,
        num_buckets: int | None = None,
        num_hashes: int = 2,
        mask_self: bool = True,
        dedup: bool = True,
        **common,
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        del self.key  # shared QK: the keys are the normalised queries
        if chunk_size < 1:
            raise ConfigError(f"reformer chunk_size must be >= 1, got {chunk_size}")
        if num_hashes < 1:
            raise ConfigError(f"reformer num_hashes must be >= 1, got {num_hashes}")
        if num_buckets is None:
            if self.max_len is None:
                raise ConfigError(
                    "reformer derives num_buckets from max_len: pass max_len (the encoder passes the "
                    "task's max_len) or num_buckets"
                )
            num_buckets = max(2, 2 * -(-self.max_len // (2 * chunk_size)))
        if num_buckets < 1 or (num_buckets > 1 and num_buckets % 2):
            raise ConfigError(f"reformer num_buckets must be 1 or even (angular LSH), got {num_buckets}")
        self.chunk_size = chunk_size
        self.num_buckets = num_buckets
        self.num_hashes = num_hashes
        self.mask_self = mask_self
        self.dedup = dedup
        self.rotations = HashRotations(
            random_rotations(stream_key(rngs, "hashes", "params", "drawing Reformer hash rotations"), self.head_dim, num_hashes, num_buckets)
        )

    def __call__(self, x, mask, *, deterministic: bool, rngs: nnx.Rngs | None = None):
        q = split_heads(self.query(x), self.num_heads)
        v = split_heads(self.value(x), self.num_heads)
        out = self.attend(q, q, v, mask, deterministic=deterministic, rngs=rngs)
        return zero_padding(self.out(merge_heads(out.astype(x.dtype))), mask)

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        """As `Attention.attend`, with shared QK: `q` gives both queries and keys; `k` is ignored."""
        del k
        rotations = self.rotations[...]
        if not deterministic:
            if rngs is None:
                raise ValueError("reformer needs `rngs` when deterministic=False (fresh hashes every call)")
            rotations = random_rotations(stream_key(rngs, "hashes", "dropout", "drawing Reformer hash rotations"), self.head_dim, self.num_hashes,
                                         self.num_buckets)
        return lsh_attention(q, v, mask, rotations, num_buckets=self.num_buckets, chunk_size=self.chunk_size,
                             mask_self=self.mask_self, dedup=self.dedup,
                             dropout=self.dropout_seed(deterministic, rngs))
