"""The shared Transformer encoder: every attention variant plugs into the same blocks.

    x_0 = Embed(tokens) + P            (P learned or sinusoidal, Vaswani et al. 2017 §3.5)
    x_l = x_{l-1} + Attn(LN(x_{l-1}))  then  x_l = x_l + MLP(LN(x_l))   (pre-LN blocks;
                                        mlp_dim = 0 leaves the MLP sublayer out)
    out = LN(x_L)

An optional learned CLS token is prepended (and counted as a real token).

Memory: `scan_layers` stacks the blocks' parameters and runs them with one
`lax.scan`; `remat` recomputes each block's activations in the backward pass
instead of storing them. Together they cut the train step's temporary memory
several-fold at long lengths (docs/will-it-fit.md) for about a third more compute.
Both change how the layers are run, not what they compute.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from lra_jax.attention import registry
from lra_jax.attention.core import zero_padding
from lra_jax.attention.dropout import Dropout
from lra_jax.models.model_settings import DTYPES, ModelSettings


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); float32 [length, dim]."""
    position = np.arange(length)[:, None]
    rate = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
    table = np.zeros((length, dim), np.float32)
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate)[:, : dim // 2]
    return table


class MlpBlock(nnx.Module):
    """Position-wise feed-forward: Dense(mlp_dim) -> GELU -> dropout -> Dense(dim)."""

    def __init__(self, dim: int, mlp_dim: int, *, dropout_rate: float, dtype, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(dim, mlp_dim, dtype=dtype, rngs=rngs)
        self.output = nnx.Linear(mlp_dim, dim, dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout_rate)

    def __call__(self, x, *, deterministic: bool, rngs: nnx.Rngs | None):
        hidden = self.dropout(jax.nn.gelu(self.hidden(x)), deterministic=deterministic, rngs=rngs)
        return self.output(hidden)


class Block(nnx.Module):
    """Pre-LN Transformer block whose attention is any registered variant."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *, attention: dict[str, Any],
                 max_len: int, dropout_rate: float, attention_dropout_rate: float, dtype, rngs: nnx.Rngs):
        settings = {k: v for k, v in attention.items() if k != "name"}
        self.attention_norm = nnx.LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.attention = registry.build(
            attention["name"], dim=dim, num_heads=num_heads, rngs=rngs, max_len=max_len,
            dropout_rate=attention_dropout_rate, dtype=dtype, **settings,
        )
        if mlp_dim:
            self.mlp_norm = nnx.LayerNorm(dim, dtype=dtype, rngs=rngs)
            self.mlp = MlpBlock(dim, mlp_dim, dropout_rate=dropout_rate, dtype=dtype, rngs=rngs)
        else:  # mlp_dim 0: no feed-forward sublayer (S4D's blocks, whose layer ends in its own GLU)
            self.mlp_norm = self.mlp = None
        self.dropout = Dropout(dropout_rate)

    def __call__(self, x, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
        drop = lambda y: self.dropout(y, deterministic=deterministic, rngs=rngs)  # noqa: E731
        x = x + drop(self.attention(self.attention_norm(x), mask, deterministic=deterministic, rngs=rngs))
        if self.mlp is None:
            return x
        return x + drop(self.mlp(self.mlp_norm(x), deterministic=deterministic, rngs=rngs))


class Encoder(nnx.Module):
    """Token embedding + positions + `num_layers` blocks + final LayerNorm.

    Args:
      vocab_size: token ids are in [0, vocab_size); id 0 is padding.
      max_len: longest input (without the CLS token).
      model: the blocks' sizes, dropout, positions ("learned" | "sinusoidal"), the CLS token, dtype;
        scan_layers stacks the blocks and runs them with `lax.scan` (one compiled block), remat
        recomputes each block's activations in the backward pass (`jax.checkpoint`). Its pooling is
        the classifier's.
      attention: {"name": variant, **settings} for `registry.build`.
    """

    def __init__(self, *, vocab_size: int, max_len: int, model: ModelSettings, attention: dict[str, Any],
                 rngs: nnx.Rngs):
        m, dim, dtype = model, model.emb_dim, DTYPES[model.dtype]
        length = max_len + int(m.cls_token)
        self.embed = nnx.Embed(vocab_size, dim, dtype=dtype, rngs=rngs,
                               embedding_init=nnx.initializers.normal(stddev=1.0))
        if m.positions == "learned":
            self.positions = nnx.Param(nnx.initializers.normal(stddev=0.02)(rngs.params(), (length, dim)))
        else:
            self.positions = nnx.Variable(jnp.asarray(sinusoidal_positions(length, dim)))
        self.cls = nnx.Param(jnp.zeros((1, 1, dim))) if m.cls_token else None
        self.dropout = Dropout(m.dropout_rate)

        def make_block(rngs: nnx.Rngs) -> Block:
            return Block(dim, m.num_heads, m.mlp_dim, attention=attention, max_len=length,
                         dropout_rate=m.dropout_rate, attention_dropout_rate=m.attention_dropout_rate, dtype=dtype,
                         rngs=rngs)

        if m.scan_layers:  # one Block whose parameters carry a leading [num_layers] axis
            self.blocks = nnx.split_rngs(splits=m.num_layers)(nnx.vmap(make_block, in_axes=0, out_axes=0))(rngs)
        else:
            self.blocks = nnx.List([make_block(rngs) for _ in range(m.num_layers)])
        self.final_norm = nnx.LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.num_layers, self.scan_layers, self.remat = m.num_layers, m.scan_layers, m.remat

    def __call__(self, tokens: Int[Array, "b n"], *, deterministic: bool,
                 rngs: nnx.Rngs | None = None) -> tuple[Float[Array, "b m d"], Bool[Array, "b m"]]:
        """Encodes tokens; returns features and their mask (m = n + 1 with a CLS token)."""
        mask = tokens != 0
        x = self.embed(tokens)
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...].astype(x.dtype), (x.shape[0], 1, x.shape[2]))
            x = jnp.concatenate([cls, x], axis=1)
            mask = jnp.concatenate([jnp.ones((x.shape[0], 1), bool), mask], axis=1)
        x = x + self.positions[...][: x.shape[1]].astype(x.dtype)
        x = zero_padding(self.dropout(x, deterministic=deterministic, rngs=rngs), mask)
        # Layer l draws its dropout (and feature redraws) from its own key.
        keys = None if deterministic else jax.random.split(rngs.dropout(), self.num_layers)

        def run(block: Block, x, key):
            return block(x, mask, deterministic=deterministic, rngs=None if key is None else nnx.Rngs(key))

        if self.scan_layers:
            graphdef, params, rest = nnx.split(self.blocks, nnx.Param, ...)

            def layer(x, inputs):
                layer_params, layer_rest, key = inputs
                block = nnx.merge(graphdef, layer_params, layer_rest)
                x = run(block, x, key)
                return x, nnx.state(block, nnx.Not(nnx.Param))  # e.g. centroids updated in training

            layer = jax.checkpoint(layer) if self.remat else layer
            x, rest = jax.lax.scan(layer, x, (params, rest, keys))
            nnx.update(self.blocks, rest)
        else:
            step = nnx.remat(run) if self.remat else run
            for index, block in enumerate(self.blocks):
                x = step(block, x, None if keys is None else keys[index])
        return zero_padding(self.final_norm(x), mask), mask
