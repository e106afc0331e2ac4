"""Which (query, key) pairs may interact: the `Mask` every attention op takes, and the element rule
shared by kernels and references.

A pair (i, j) of query row i and key column j (indices into the padded arrays) is allowed iff

    key_code[j] > 0  and  (not causal or j <= i)
                     and  (no band or segments  or  global_q[i] or global_k[j]
                           or (same_segment(i, j) and |i - j| <= window))

with `key_code` int32 per batch and key, a `KeyCode`: PADDING, REAL, or GLOBAL (real and
seen by every query); `query_code` GLOBAL marks a global query (sees every real key);
segments (int32 per position, shared across the batch) confine attention to equal ids;
`window` None means no band. `rule` is a static `MaskRule`, or None for plain key padding. Global
tokens lift the band and the segments, never causality: a causal model sees no future token.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

import jax
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
    segment ids; globals: global queries and keys (`KeyCode.GLOBAL`) bypass the band and segments;
    causal: key j only for queries i >= j.
    """

    window: int | None = None
    segments: bool = False
    globals: bool = False
    causal: bool = False

    @property
    def local(self) -> bool:
        """Whether a band or segments restrict the pairs (what global tokens lift)."""
        return self.window is not None or self.segments

    @property
    def restricts(self) -> bool:
        """Whether the rule restricts anything beyond key padding (a band, segments or causality)."""
        return self.local or self.causal


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
    if rule.causal:
        ok = ok & (k_pos <= q_pos)
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


def _both(a, b, combine):
    return b if a is None else a if b is None else combine(a, b)


def _one(a, b, what: str):
    if a is not None and b is not None:
        raise ValueError(f"two masks that both set {what} do not compose; give them in one Mask")
    return b if a is None else a


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["key_mask", "query_mask", "query_segments", "key_segments", "global_queries",
                                "global_keys", "block_mask"],
                   meta_fields=["window", "causal", "block"])
@dataclasses.dataclass(frozen=True)
class Mask:
    """Which (query, key) pairs an attention op may mix: the one mask argument of `flash_attention`,
    `block_sparse_attention` and `linear_attention`. Frozen, a pytree (arrays as leaves, the band,
    causality and block size static), composable with `&`.

    key_mask [b, k], query_mask [b, q]: True on real tokens (None: all real; a key mask alone also masks
    the queries when q == k, self-attention). window: the band |i - j| <= window. causal: key j only for
    queries i >= j. query_segments [q], key_segments [k]: int ids shared across the batch, attention only
    within equal ids. global_queries [q], global_keys [k]: bool; a global token lifts the band and the
    segments (not causality). block_mask [q / block, k / block]: bool, only these block pairs (BigBird's
    blocks), at block size `block`.

    `a & b` intersects padding, bands, causality and block matrices (of one block size); segments and
    global tokens may come from one side only (two sets of ids do not intersect as ids).
    """

    key_mask: Bool[Array, "b k"] | None = None
    query_mask: Bool[Array, "b q"] | None = None
    window: int | None = None
    causal: bool = False
    query_segments: Int[Array, "q"] | None = None
    key_segments: Int[Array, "k"] | None = None
    global_queries: Bool[Array, "q"] | None = None
    global_keys: Bool[Array, "k"] | None = None
    block_mask: Bool[Array, "qb kb"] | None = None
    block: int | None = None

    def __post_init__(self):
        if self.window is not None and self.window < 0:
            raise ValueError(f"a mask's window is |i - j| <= window, so at least 0; got {self.window}")
        if (self.block_mask is None) != (self.block is None):
            raise ValueError("a block_mask needs its block size (Mask(block_mask=..., block=B)) and a block size "
                             "its block_mask")

    @classmethod
    def from_lengths(cls, lengths: Int[Array, "b"], nq: int, nk: int | None = None) -> Mask:
        """Prefix padding: the first lengths[i] queries and keys of sequence i are real."""
        lengths = jnp.asarray(lengths)[:, None]
        return cls(key_mask=jnp.arange(nq if nk is None else nk)[None, :] < lengths,
                   query_mask=jnp.arange(nq)[None, :] < lengths)

    def __and__(self, other: Mask) -> Mask:
        if self.block is not None and other.block is not None and self.block != other.block:
            raise ValueError(f"block masks of block sizes {self.block} and {other.block} do not compose")
        return Mask(
            key_mask=_both(self.key_mask, other.key_mask, jnp.logical_and),
            query_mask=_both(self.query_mask, other.query_mask, jnp.logical_and),
            window=_both(self.window, other.window, min), causal=self.causal or other.causal,
            query_segments=_one(self.query_segments, other.query_segments, "query segments"),
            key_segments=_one(self.key_segments, other.key_segments, "key segments"),
            global_queries=_one(self.global_queries, other.global_queries, "global queries"),
            global_keys=_one(self.global_keys, other.global_keys, "global keys"),
            block_mask=_both(self.block_mask, other.block_mask, jnp.logical_and), block=self.block or other.block)

    @property
    def rule(self) -> MaskRule:
        """The static element rule of the mask."""
        return MaskRule(self.window, self.query_segments is not None or self.key_segments is not None,
                        self.global_queries is not None or self.global_keys is not None, self.causal)

    @property
    def pattern(self) -> bool:
        """Whether it holds more than padding and causality (a band, segments, global tokens or blocks):
        what a block-sparse op serves and a dense one does not."""
        return self.rule.local or self.rule.globals or self.block_mask is not None

    def resolved(self, batch: int, nq: int, nk: int) -> Mask:
        """The mask with both padding masks as bool arrays: every token real where none is given, and a key
        mask alone also the query mask when nq == nk (self-attention)."""
        key_mask = jnp.ones((batch, nk), bool) if self.key_mask is None else jnp.asarray(self.key_mask, bool)
        query_mask = self.query_mask
        if query_mask is None:
            query_mask = key_mask if nq == nk else jnp.ones((batch, nq), bool)
        return dataclasses.replace(self, key_mask=key_mask, query_mask=jnp.asarray(query_mask, bool))

    def codes(self, nq: int, key_mask: Bool[Array, "b k"] | None = None) -> Codes:
        """The mask in the kernels' element terms (rule and codes) for nq queries and the key padding
        `key_mask` (default: its own; the mask must be `resolved`)."""
        key_mask = self.key_mask if key_mask is None else key_mask
        nk = key_mask.shape[1]
        key_code = jnp.asarray(key_mask).astype(jnp.int32)
        if self.global_keys is not None:
            key_code = key_code * (1 + jnp.asarray(self.global_keys, jnp.int32))[None, :]
        query_code = jnp.ones((nq,), jnp.int32)
        if self.global_queries is not None:
            query_code = 1 + jnp.asarray(self.global_queries, jnp.int32)
        segments = lambda ids, n: jnp.zeros((n,), jnp.int32) if ids is None else jnp.asarray(ids, jnp.int32)  # noqa: E731
        return Codes(self.rule, key_code, query_code, segments(self.query_segments, nq),
                     segments(self.key_segments, nk))
