"""The self-pretraining model: the shared encoder with a token head instead of a classifier.

    logits_i = W LN-encoded(x)_i + b        W: [dim, vocab_size + 1]

Position i predicts the token at i (masked-token objective, Devlin et al. 2019 §3.1) or at i + 1
(next-token objective, causal layers only); `lra_jax.training.pretrain` picks the targets. The
vocabulary gains one id, `mask_id(vocab_size)` = vocab_size, the [MASK] token; the fine-tuned
classifier is built with the same enlarged embedding so that the encoder's weights carry over
unchanged (it never sees that id). A CLS token, when the encoder has one, is dropped from the output.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from lra_jax.models.classifier import ModelSource, build_encoder
from lra_jax.models.model_settings import DTYPES
from lra_jax.models.encoder import Encoder


def mask_id(vocab_size: int) -> int:
    """The [MASK] token's id: one past the task's vocabulary."""
    return vocab_size


class TokenPredictor(nnx.Module):
    """tokens int[b n] (or int[b 2 n], a pair, each encoded alone) -> logits f32[b n V] (or [b 2 n V])."""

    def __init__(self, encoder: Encoder, dim: int, num_tokens: int, *, dtype, rngs: nnx.Rngs):
        self.encoder = encoder
        self.head = nnx.Linear(dim, num_tokens, dtype=dtype, rngs=rngs)

    def __call__(self, tokens: Int[Array, "*b n"], *, deterministic: bool,
                 rngs: nnx.Rngs | None = None) -> Float[Array, "*b n v"]:
        length = tokens.shape[-1]
        features, _ = self.encoder(tokens.reshape(-1, length), deterministic=deterministic, rngs=rngs)
        logits = self.head(features[:, features.shape[1] - length:]).astype(jnp.float32)  # CLS dropped
        return logits.reshape(*tokens.shape, -1)


def build_token_predictor(config: ModelSource, *, vocab_size: int, rngs: nnx.Rngs) -> TokenPredictor:
    """The pretraining model of `config`: its encoder over vocab_size + 1 ids ([MASK] added), a token head."""
    m = config.model
    encoder = build_encoder(config, vocab_size=vocab_size + 1, rngs=rngs)
    return TokenPredictor(encoder, m.emb_dim, vocab_size + 1, dtype=DTYPES[m.dtype], rngs=rngs)
