"""Block-sparse attention on TPU: jax's splash attention with each pattern as its mask.

The pattern of `lra_jax.kernels.block_sparse.api` (window, segments, global
queries and keys, block matrix) becomes, exactly (the same allowed pairs as the
reference, key padding included):

    window only              static band mask |i - j| <= w (`BandWithGlobals`, no globals)
    window + globals         static band | global rows | global columns (Longformer)
    segments (+ window)      segment ids: equal ids only (and the static band); padding id -1
    block matrix (BigBird)   a dynamic boolean mask [nq, nk] expanded from the block
                             matrix (its random blocks are model state, known only at
                             run time), and with the band/globals where given
    nothing                  full mask (dense attention)

A query row with no allowed real key gives 0, as in the reference, for the dense
and band patterns (`rows_with_keys`); with segments or a block matrix such a row
(which no variant has: a real query always sees itself) is finite but not zeroed.

Splash skips every 128 x 128 block its mask says is empty, so the cost follows the
pattern. Segments together with global tokens cannot be expressed by segment ids
(a global key must match every id) and raise; no variant uses them together.
A dynamic mask is stored dense ([nq, nk] booleans, once for all heads): 256 MiB
at Path-X's 16K tokens, against 1 bit per pair for nothing with a static mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lra_jax.kernels.flash import pallas_tpu as splash


def _static(x, what: str) -> np.ndarray:
    try:
        return np.asarray(x, bool)
    except jax.errors.TracerArrayConversionError as error:
        raise ValueError(f"the TPU kernel needs {what} known when tracing (numpy), not a traced array") from error


def rows_with_keys(key_mask, nq: int, window: int | None, global_queries, global_keys):
    """bool [b, nq]: the query rows with at least one allowed real key (dense and band patterns)."""
    real = key_mask.astype(jnp.int32)
    if window is None:
        return jnp.broadcast_to(real.any(1, keepdims=True), (real.shape[0], nq)).astype(bool)
    nk = real.shape[1]
    before = jnp.pad(jnp.cumsum(real, axis=1), [(0, 0), (1, 0)])  # before[:, j] = real keys in [0, j)
    rows = jnp.arange(nq)
    hi, lo = jnp.clip(rows + window + 1, 0, nk), jnp.clip(rows - window, 0, nk)
    has = before[:, hi] - before[:, lo] > 0
    if global_keys is not None:
        has |= (key_mask & jnp.asarray(global_keys, bool)[None, :]).any(1, keepdims=True)
    if global_queries is not None:
        has |= jnp.asarray(global_queries, bool)[None, :] & key_mask.any(1, keepdims=True)
    return has


def attention(q, k, v, key_mask, query_mask, *, window, query_segments, key_segments, global_queries,
              global_keys, block_mask, block, scale, interpret):
    """Pattern attention [b, nq, h, d] via splash; padded query rows are not zeroed here (the api does).

    Args as `block_sparse_attention`, with key_mask / query_mask [b, nk] / [b, nq] and
    block the block size of `block_mask`.
    """
    nq, nk = q.shape[1], k.shape[1]
    nq_pad, nk_pad = (-(-x // splash.BLOCK) * splash.BLOCK for x in (nq, nk))
    use_segments = query_segments is not None or key_segments is not None
    use_globals = global_queries is not None or global_keys is not None
    if use_segments and use_globals:
        raise ValueError("the TPU kernel cannot combine segments with global tokens; use impl='xla'")
    restricted = window is not None or use_segments  # without a restriction, globals change nothing

    def padded(x, n, n_pad, value):
        x = np.zeros((n,), bool) if x is None else _static(x, "global tokens")
        return np.pad(x, (0, n_pad - n), constant_values=value)

    if restricted and use_globals:
        pattern = splash.BandWithGlobals((nq_pad, nk_pad), window, padded(global_queries, nq, nq_pad, False),
                                         padded(global_keys, nk, nk_pad, False))
    elif window is not None:
        pattern = splash.BandWithGlobals((nq_pad, nk_pad), window, np.zeros(nq_pad, bool), np.zeros(nk_pad, bool))
    else:
        pattern = splash.full_mask(nq_pad, nk_pad)
    if block_mask is not None:
        rows = jnp.minimum(jnp.arange(nq_pad) // block, block_mask.shape[0] - 1)
        cols = jnp.minimum(jnp.arange(nk_pad) // block, block_mask.shape[1] - 1)
        dense = jnp.asarray(block_mask, bool)[rows][:, cols]
        if not isinstance(pattern, splash.splash_mask.FullMask):
            dense &= jnp.asarray(pattern[:, :])
        pattern = dense

    pad_q = lambda x, value: jnp.pad(x, [(0, 0), (0, nq_pad - nq)] + [(0, 0)] * (x.ndim - 2),  # noqa: E731
                                     constant_values=value)
    pad_k = lambda x, value: jnp.pad(x, [(0, 0), (0, nk_pad - nk)] + [(0, 0)] * (x.ndim - 2),  # noqa: E731
                                     constant_values=value)
    q_seg = None if query_segments is None else jnp.asarray(query_segments, jnp.int32)[None]
    k_seg = None if key_segments is None else jnp.asarray(key_segments, jnp.int32)[None]
    q_ids = splash.segment_ids(pad_q(query_mask, False), None if q_seg is None else pad_q(q_seg, 0))
    k_ids = splash.segment_ids(pad_k(key_mask, False), None if k_seg is None else pad_k(k_seg, 0))
    out = splash.attention(pad_q(q, 0), pad_k(k, 0), pad_k(v, 0), q_ids, k_ids, pattern, scale, interpret)[:, :nq]
    if use_segments or block_mask is not None:
        return out
    keep = rows_with_keys(key_mask, nq, window if restricted else None, global_queries if restricted else None,
                          global_keys if restricted else None)
    return jnp.where(keep[:, :, None, None], out, jnp.zeros((), out.dtype))
