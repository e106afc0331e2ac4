"""Pure-jnp non-causal kernelized attention: the oracle for the linear kernel.

Katharopoulos et al. 2020 ("Transformers are RNNs", eq. 4-6), Choromanski et al.
2021 (Performer, FAVOR+):

    out_i = phi(q_i)^T S / phi(q_i)^T z  (0 where phi(q_i)^T z = 0: no real key),  S = sum_j m_j phi(k_j) v_j^T,  z = sum_j m_j phi(k_j),

in float32; m_j is the key mask. Shapes: q, k [b, n, h, m] (features, or inputs
of the feature map), v [b, n, h, d]; padded query rows are 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

def feature(x, feature_map: str):
    """phi(x) in float32: "elu" = elu(x) + 1 (Linear Transformer), "identity" = x (precomputed features)."""
    x = x.astype(jnp.float32)
    return jax.nn.elu(x) + 1.0 if feature_map == "elu" else x


def attention(q, k, v, key_mask, query_mask, feature_map: str):
    """Two einsum reductions and a normalised read-out, no epsilon; returns [b, n, h, d] in v's dtype."""
    phi_q = feature(q, feature_map)
    phi_k = jnp.where(key_mask[:, :, None, None], feature(k, feature_map), 0.0)
    kv = jnp.einsum("bnhm,bnhd->bhmd", phi_k, v.astype(jnp.float32))
    z = phi_k.sum(1)
    den = jnp.einsum("bnhm,bhm->bnh", phi_q, z)[..., None]
    nonzero = den != 0
    out = jnp.where(nonzero, jnp.einsum("bnhm,bhmd->bnhd", phi_q, kv) / jnp.where(nonzero, den, 1.0), 0.0)
    return jnp.where(query_mask[:, :, None, None], out, 0.0).astype(v.dtype)
