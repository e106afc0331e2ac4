"""Which (query, key) pairs may interact: the element rule shared by kernels and references.

A pair (i, j) of query row i and key column j (indices into the padded arrays) is allowed iff

    key_code[j] > 0  and  (rule is None  or  global_q[i] or global_k[j]
                           or (same_segment(i, j) and |i - j| <= window))

with `key_code` int32 per batch and key, a `KeyCode`: PADDING, REAL, or GLOBAL (real and
seen by every query); `query_code` GLOBAL marks a global query (sees every real key);
segments (int32 per position, shared across the batch) confine attention to equal ids;
`window` None means no band. `rule` is a static `MaskRule`, or None for plain key padding (flash).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

# Logit of a masked pair: finite, so max/exp never see -inf - -inf; masked
# probabilities are also zeroed explicitly, so this never carries weight.
MASK_VALUE = -1e30



class KeyCode(enum.IntEnum):
    """What a key (or, GLOBAL only, a query) is, as the int32 codes the kernels read."""

    PADDING = 0
    REAL = 1
    GLOBAL = 2  # real and global: seen by every query (a global query sees every real key)


@dataclasses.dataclass(frozen=True)
class MaskRule:
    """The static part of a pattern (hashable: kernels compile per rule).

    window: band |i - j| <= window, or None for no band; segments: attention only within equal
    segment ids; globals: global queries and keys (`KeyCode.GLOBAL`) bypass the band and segments.
    """

    window: int | None = None
    segments: bool = False
    globals: bool = False

    @property
    def restricts(self) -> bool:
        """Whether the rule restricts anything beyond key padding (a band or segments)."""
        return self.window is not None or self.segments


GLOBAL = int(KeyCode.GLOBAL)  # the plain int, for comparisons inside kernels


def allowed(q_pos, k_pos, key_code, query_code, q_seg, k_seg, rule: MaskRule | None):
    """[..., q, k] bool from q_pos/query_code/q_seg [q] and k_pos/key_code/k_seg [k] (leading dims broadcast)."""
    column = lambda x: None if x is None else x[..., :, None]  # noqa: E731
    row = lambda x: None if x is None else x[..., None, :]  # noqa: E731
    return pairs_allowed(q_pos[:, None], k_pos[None, :], row(key_code), column(query_code), column(q_seg),
                         row(k_seg), rule)


def pairs_allowed(q_pos, k_pos, key_code, query_code, q_seg, k_seg, rule: MaskRule | None):
    """The rule on operands that broadcast to [..., q, k]: q_pos, query_code, q_seg as [..., q, 1] and
    k_pos, key_code, k_seg as [..., 1, k] (the form a kernel's tile holds them in)."""
    ok = key_code > int(KeyCode.PADDING)
    if rule is None:
        return ok
    window = rule.window
    near = None  # None: no local restriction, every listed pair is allowed
    if window is not None:
        near = (q_pos - k_pos <= window) & (k_pos - q_pos <= window)  # |i - j| <= w, without an int abs
    if rule.segments:
        same = q_seg == k_seg
        near = same if near is None else near & same
    if near is None:
        return ok
    if rule.globals:
        near = near | (query_code == GLOBAL) | (key_code == GLOBAL)
    return ok & near


class Codes(NamedTuple):
    """The pattern in the kernels' element terms (`lra_jax.kernels.masking`), unpadded."""

    rule: MaskRule
    key_code: Int[Array, "b k"]  # KeyCode: PADDING, REAL or GLOBAL
    query_code: Int[Array, "q"]  # KeyCode.REAL, or GLOBAL for a global query
    q_seg: Int[Array, "q"]
    k_seg: Int[Array, "k"]


def element_codes(nq: int, key_mask: Bool[Array, "b k"], window, query_segments, key_segments, global_queries,
                  global_keys) -> Codes:
    """The rule and the codes of a pattern given by the settings of `block_sparse_attention`
    (window, segments, global queries and keys) and the key padding, for nq queries."""
    nk = key_mask.shape[1]
    use_segments = query_segments is not None or key_segments is not None
    use_globals = global_queries is not None or global_keys is not None
    key_code = jnp.asarray(key_mask).astype(jnp.int32)
    if global_keys is not None:
        key_code = key_code * (1 + jnp.asarray(global_keys, jnp.int32))[None, :]
    query_code = jnp.ones((nq,), jnp.int32)
    if global_queries is not None:
        query_code = 1 + jnp.asarray(global_queries, jnp.int32)
    q_seg = jnp.zeros((nq,), jnp.int32) if query_segments is None else jnp.asarray(query_segments, jnp.int32)
    k_seg = jnp.zeros((nk,), jnp.int32) if key_segments is None else jnp.asarray(key_segments, jnp.int32)
    return Codes(MaskRule(window, use_segments, use_globals), key_code, query_code, q_seg, k_seg)
