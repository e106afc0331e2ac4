"""The full model of a task: shared encoder, masked pooling, classifier head.

One sequence per example (`SequenceClassifier`), or a pair of documents encoded by the one shared
encoder and compared by their pooled vectors (`DualEncoderClassifier`, the Retrieval task).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from lra_jax.models.encoder import Encoder
from lra_jax.models.heads import ClassifierHead, pair_features, pool
from lra_jax.models.model_settings import DTYPES, ModelSettings

class ModelSource(Protocol):
    """What `build_model` reads: `lra_jax.config.settings.Settings`, whose values its `check` validated
    (models never import the config layer, which sits above them)."""

    model: ModelSettings
    attention: Mapping[str, Any]
    max_len: int


class SequenceClassifier(nnx.Module):
    """tokens int[b n] -> logits f32[b num_classes]."""

    def __init__(self, encoder: Encoder, head: ClassifierHead, pooling: str):
        self.encoder, self.head, self.pooling = encoder, head, pooling

    def __call__(self, tokens: Int[Array, "b n"], *, deterministic: bool,
                 rngs: nnx.Rngs | None = None) -> Float[Array, "b c"]:
        features, mask = self.encoder(tokens, deterministic=deterministic, rngs=rngs)
        return self.head(pool(features, mask, self.pooling)).astype(jnp.float32)


class DualEncoderClassifier(nnx.Module):
    """tokens int[b 2 n] -> logits f32[b num_classes]: both documents through the one encoder,
    pooled to u and v, classified from [u, v, u * v, u - v]."""

    def __init__(self, encoder: Encoder, head: ClassifierHead, pooling: str):
        self.encoder, self.head, self.pooling = encoder, head, pooling

    def __call__(self, tokens: Int[Array, "b 2 n"], *, deterministic: bool,
                 rngs: nnx.Rngs | None = None) -> Float[Array, "b c"]:
        batch, pair, length = tokens.shape
        features, mask = self.encoder(tokens.reshape(batch * pair, length), deterministic=deterministic, rngs=rngs)
        pooled = pool(features, mask, self.pooling).reshape(batch, pair, -1)
        return self.head(pair_features(pooled[:, 0], pooled[:, 1])).astype(jnp.float32)


def build_encoder(config: ModelSource, *, vocab_size: int, rngs: nnx.Rngs) -> Encoder:
    """The shared encoder that `config.model` and `config.attention` describe (without a head)."""
    return Encoder(vocab_size=vocab_size, max_len=config.max_len, model=config.model,
                   attention=dict(config.attention), rngs=rngs)


def build_model(config: ModelSource, *, vocab_size: int, num_classes: int, rngs: nnx.Rngs,
                dual: bool = False) -> SequenceClassifier | DualEncoderClassifier:
    """The model that `config.model` and `config.attention` describe; `dual`: pairs of sequences."""
    m = config.model
    dtype = DTYPES[m.dtype]
    encoder = build_encoder(config, vocab_size=vocab_size, rngs=rngs)
    if dual:
        head = ClassifierHead(4 * m.emb_dim, m.mlp_dim, num_classes, dtype=dtype, rngs=rngs)
        return DualEncoderClassifier(encoder, head, m.pooling)
    head = ClassifierHead(m.emb_dim, m.mlp_dim, num_classes, dtype=dtype, rngs=rngs)
    return SequenceClassifier(encoder, head, m.pooling)
