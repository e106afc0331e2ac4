"""Which (query, key) pairs may interact: the element rule shared by kernels and references.

A pair (i, j) of query row i and key column j (indices into the padded arrays) is allowed iff

    key_code[j] > 0  and  (rule is None  or  global_q[i] or global_k[j]
                           or (same_segment(i, j) and |i - j| <= window))

with `key_code` int32 per batch and key: 0 = padding, 1 = real, 2 = real and
global (seen by every query); `query_code` 2 marks a global query (sees every
real key); segments (int32 per position, shared across the batch) confine
attention to equal ids; `window` None means no band. `rule` is the static tuple
(window, use_segments, use_globals), or None for plain key padding (flash).
"""

from __future__ import annotations

import jax.numpy as jnp

# Logit of a masked pair: finite, so max/exp never see -inf - -inf; masked
# probabilities are also zeroed explicitly, so this never carries weight.
MASK_VALUE = -1e30

Rule = tuple  # (window: int | None, use_segments: bool, use_globals: bool)


def allowed(q_pos, k_pos, key_code, query_code, q_seg, k_seg, rule: Rule | None):
    """[..., q, k] bool from q_pos/query_code/q_seg [q] and k_pos/key_code/k_seg [k] (leading dims broadcast)."""
    ok = key_code[..., None, :] > 0
    if rule is None:
        return ok
    window, use_segments, use_globals = rule
    near = None  # None: no local restriction, every listed pair is allowed
    if window is not None:
        near = jnp.abs(q_pos[:, None] - k_pos[None, :]) <= window
    if use_segments:
        same = q_seg[..., :, None] == k_seg[..., None, :]
        near = same if near is None else near & same
    if near is None:
        return ok
    if use_globals:
        near = near | (query_code[..., :, None] == 2) | (key_code[..., None, :] == 2)
    return ok & near
