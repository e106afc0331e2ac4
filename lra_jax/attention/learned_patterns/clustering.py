"""Routing Transformer: content-based sparse attention by online k-means (Roy et al. 2021).

"Efficient Content-Based Sparse Attention with Routing Transformers" (TACL 2021), sec. 4.1:
queries and keys are routed to k clusters by the nearest of k centroids mu_1..mu_k, and each
query attends only to the keys routed to its own cluster,

    out_i = sum_{j : mu(k_j) = mu(q_i), mask_j} softmax_j(q_i . k_j / sqrt(d)) v_j,

with the centroids learned by online (mini-batch) k-means on L2-normalised queries and keys,
an exponential moving average (sec. 4.1, update of mu):

    mu <- lambda mu + (1 - lambda) / 2 sum_{i : mu(Q_i) = mu} Q_i + (1 - lambda) / 2 sum_{j : mu(K_j) = mu} K_j.

What this implementation does, and where it departs from the paper:

* Balanced membership (static shapes). Instead of a hard argmax assignment (clusters of any
  size), cluster c takes the top-w queries and the top-w keys by cosine similarity to its
  centroid, as the paper's own implementation does to keep shapes static. Attention runs within
  each cluster: c blocks of w x w scores, n * w floats when c * w ~ n; with c ~ sqrt(n) that is
  the paper's O(n^1.5 d). A query picked by several clusters gets the mean of their outputs.
  A query picked by no cluster attends to itself alone (its output is its own value v_i: a
  window-0 local fallback), so every real token gets an attention output; the residual path
  around the block carries it as usual.
* Separate queries and keys. Routing uses the shared q and k projections of `Attention`
  (the paper ties Q and K for causal LM; here q and k stay separate so that one cluster with
  w >= n is exactly softmax attention with the same parameters). Both are L2-normalised for
  routing only; attention itself uses the raw q, k with the usual 1 / sqrt(d).
* EMA update. In training only (deterministic=False), each real query and key (normalised,
  no gradient) is assigned to its nearest centroid (largest cosine), and each centroid moves
  towards the mean of what was assigned to it: mu <- lambda mu + (1 - lambda) mean. The mean
  replaces the paper's (halved) sums so that the step does not grow with batch size and
  sequence length (mini-batch k-means); a centroid with nothing assigned stays put. Padded
  tokens are never assigned. Routing in a call uses the centroids from before that call's update.
  The centroids are `Centroids` state (nnx.Variable, not nnx.Param): the optimiser never
  touches them; `attend` assigns the new value, which nnx.jit, nnx.split/merge inside jax.jit
  (the trainer) and the encoder's scanned layers carry out of the step.
* No local-attention heads. The paper mixes routing heads with local heads; every head here
  routes (a `local` layer can be stacked alongside if wanted).

Padding: padded tokens get score -1e30, so they are picked only when a cluster has room
beyond every real token, and then only as masked keys; padded keys are masked in every softmax.
The cluster size w comes from the settings (`window`, or ceil(max_len / num_clusters)), never
from the padded length, and is clamped to n per call: appending padding changes neither which
real tokens are picked nor their outputs, so the variant is length-invariant.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from lra_jax.attention.core import MASK_VALUE, Attention, masked_softmax, matmul_flops, unit_vectors
from lra_jax.attention.registry import register
from lra_jax.errors import ConfigError


class Centroids(nnx.Variable):
    """Non-trainable k-means centroids [h c d]: updated by EMA in training, saved in checkpoints."""


def cluster_scores(
    x_hat: Float[Array, "b n h d"], centroids: Float[Array, "h c d"], mask: Bool[Array, "b n"]
) -> Float[Array, "b h c n"]:
    """Cosine similarity of every (normalised) token to every centroid; padded tokens get -1e30."""
    scores = jnp.einsum("bnhd,hcd->bhcn", x_hat, unit_vectors(centroids))
    return jnp.where(mask[:, None, None, :], scores, MASK_VALUE)


def top_members(
    x_hat: Float[Array, "b n h d"], centroids: Float[Array, "h c d"], mask: Bool[Array, "b n"], window: int
) -> Int[Array, "b h c w"]:
    """Positions of the `window` tokens most similar to each centroid (balanced clusters)."""
    return jax.lax.top_k(cluster_scores(x_hat, centroids, mask), window)[1]


def ema_update(
    centroids: Float[Array, "h c d"],
    q_hat: Float[Array, "b n h d"],
    k_hat: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    decay: float,
) -> Float[Array, "h c d"]:
    """One online k-means step: mu <- decay mu + (1 - decay) mean of the real q, k nearest to mu.

    Centroids with nothing assigned are returned unchanged.
    """
    num_clusters = centroids.shape[1]
    mu_hat = unit_vectors(centroids)
    real = mask[:, :, None, None].astype(jnp.float32)
    sums, counts = 0.0, 0.0
    for x_hat in (q_hat, k_hat):
        nearest = jnp.argmax(jnp.einsum("bnhd,hcd->bnhc", x_hat, mu_hat), axis=-1)  # [b n h]
        members = jax.nn.one_hot(nearest, num_clusters, dtype=jnp.float32) * real  # [b n h c]
        sums = sums + jnp.einsum("bnhc,bnhd->hcd", members, x_hat)
        counts = counts + jnp.sum(members, axis=(0, 1))  # [h c]
    mean = sums / jnp.maximum(counts, 1.0)[..., None]
    moved = decay * centroids + (1.0 - decay) * mean
    return jnp.where(counts[..., None] > 0, moved, centroids)


def routing_attention(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n h d"],
    v: Float[Array, "b n h d"],
    mask: Bool[Array, "b n"],
    centroids: Float[Array, "h c d"],
    window: int,
    drop=None,
) -> Float[Array, "b n h d"]:
    """Attention within balanced clusters: cluster c's top-w queries attend to its top-w keys.

    Args:
      q, k, v: per-head queries, keys and values.
      mask: True on real tokens.
      centroids: [h, c, d] routing centroids (need not be normalised).
      window: tokens per cluster w (clamped to n).
      drop: optional dropout applied to the [b h c w w] attention weights.

    Returns:
      The mean of the cluster outputs of each query; a query in no cluster returns its own value.
    """
    b, n, h, d = v.shape
    w = max(1, min(window, n))
    c = centroids.shape[1]
    q_hat, k_hat = (jax.lax.stop_gradient(unit_vectors(x)) for x in (q, k))
    q_idx = top_members(q_hat, centroids, mask, w).reshape(b, h, c * w)
    k_idx = top_members(k_hat, centroids, mask, w).reshape(b, h, c * w)

    def gather(x: Array, idx: Array) -> Array:  # [b n h d] -> [b h c w d]
        picked = jnp.take_along_axis(jnp.swapaxes(x, 1, 2), idx[..., None], axis=2)
        return picked.reshape(b, h, c, w, x.shape[-1])

    logits = jnp.einsum("bhcqd,bhckd->bhcqk", gather(q, q_idx), gather(k, k_idx)) / jnp.sqrt(d).astype(q.dtype)
    key_mask = jnp.take_along_axis(jnp.broadcast_to(mask[:, None, :], (b, h, n)), k_idx, axis=2)
    probs = masked_softmax(logits, key_mask.reshape(b, h, c, 1, w))
    if drop is not None:
        probs = drop(probs)
    cluster_out = jnp.einsum("bhcqk,bhckd->bhcqd", probs.astype(v.dtype), gather(v, k_idx))

    # Scatter back to the queries' positions and average over the clusters that picked them.
    batch, head = jnp.arange(b)[:, None, None], jnp.arange(h)[None, :, None]
    total = jnp.zeros((b, h, n, d), jnp.float32).at[batch, head, q_idx].add(
        cluster_out.reshape(b, h, c * w, d).astype(jnp.float32))
    count = jnp.zeros((b, h, n), jnp.float32).at[batch, head, q_idx].add(1.0)
    out = total / jnp.maximum(count, 1.0)[..., None]
    out = jnp.where(count[..., None] > 0, out, jnp.swapaxes(v, 1, 2).astype(jnp.float32))
    return jnp.swapaxes(out, 1, 2).astype(v.dtype)


@register("routing")
class RoutingAttention(Attention):
    """Routing Transformer attention: balanced online k-means clusters (see module docstring).

    Args:
      dim, num_heads, rngs, **common: as `Attention`; the centroids are drawn from `rngs.params()`.
      num_clusters: clusters k per head. Default 16: at ListOps' 2000 tokens each cluster then
        holds ~128 tokens, the `local` window default; the paper takes k ~ sqrt(n) (sec. 4.1, for
        O(n^1.5 d) cost), i.e. 45 at n = 2000.
      window: tokens per cluster w (each cluster takes w queries and w keys). Default
        ceil(max_len / num_clusters), so the clusters together hold about max_len tokens.
        Derived from the settings, never from the padded input, so appended padding changes nothing.
      decay: EMA decay lambda of the centroid update; 0.999, the value of the paper (sec. 4.1).
    """

    cost_exponent = 1.5  # sqrt(n) clusters of sqrt(n) tokens (paper, sec. 4.1)
    data_dependent_pattern = True  # top-w cluster membership

    @classmethod
    def settings_at_length(cls, n: int) -> dict:
        return dict(num_clusters=math.isqrt(n))

    @classmethod
    def forward_flops(cls, batch, n, dim, num_heads, settings):
        """Projections, routing scores of the queries and of the keys against the c centroids (2 products of
        2 n d c), then q.k and p v inside each cluster of w queries and w keys, 2 x 2 (c w) w d.
        An evaluation call's forward: training also moves the centroids (4 more products of 2 n d c,
        without gradient), not counted."""
        clusters, window = settings["num_clusters"], max(1, min(settings["window"], n))
        return (cls.projection_flops(batch, n, dim) + 2 * matmul_flops(batch * n, dim, clusters)
                + cls.attention_flops(batch * clusters * window, window, dim))

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        num_clusters: int = 16,
        window: int | None = None,
        decay: float = 0.999,
        **common,
    ):
        super().__init__(dim, num_heads, rngs=rngs, **common)
        if num_clusters < 1:
            raise ConfigError(f"routing needs num_clusters >= 1, got {num_clusters}")
        if not 0.0 <= decay <= 1.0:
            raise ConfigError(f"routing decay must be in [0, 1], got {decay}")
        if window is None:
            if self.max_len is None:
                raise ConfigError(
                    "routing needs its cluster size: pass window, or max_len (the encoder passes the "
                    "task's max_len) to use ceil(max_len / num_clusters)"
                )
            window = math.ceil(self.max_len / num_clusters)
        if window < 1:
            raise ConfigError(f"routing window must be >= 1, got {window}")
        self.num_clusters, self.window, self.decay = num_clusters, window, decay
        size = num_heads * num_clusters * self.head_dim
        draw = jax.random.normal(rngs.params(), (size,), jnp.float32)  # flat: rank-3 draws compile slowly
        self.centroids = Centroids(unit_vectors(draw.reshape(num_heads, num_clusters, self.head_dim)))

    def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        centroids = self.centroids[...]
        drop = lambda p: self.drop(p, deterministic=deterministic, rngs=rngs)
        out = routing_attention(q, k, v, mask, centroids, self.window, drop=drop)
        if not deterministic:
            q_hat, k_hat = (jax.lax.stop_gradient(unit_vectors(x)) for x in (q, k))
            self.centroids[...] = ema_update(centroids, q_hat, k_hat, mask, self.decay)
        return out
