"""The full model of a task: shared encoder, masked pooling, classifier head."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
from flax import nnx
from jaxtyping import Array, Float, Int

from lra_jax.errors import ConfigError
from lra_jax.models.encoder import Encoder
from lra_jax.models.heads import POOLINGS, ClassifierHead, pool

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class SequenceClassifier(nnx.Module):
    """tokens int[b n] -> logits f32[b num_classes]."""

    def __init__(self, encoder: Encoder, head: ClassifierHead, pooling: str):
        if pooling not in POOLINGS:
            raise ConfigError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        if pooling == "cls" and encoder.cls is None:
            raise ConfigError("pooling='cls' needs config.model.cls_token=True")
        self.encoder, self.head, self.pooling = encoder, head, pooling

    def __call__(self, tokens: Int[Array, "b n"], *, deterministic: bool,
                 rngs: nnx.Rngs | None = None) -> Float[Array, "b c"]:
        features, mask = self.encoder(tokens, deterministic=deterministic, rngs=rngs)
        return self.head(pool(features, mask, self.pooling)).astype(jnp.float32)


def build_model(config: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int,
                rngs: nnx.Rngs) -> SequenceClassifier:
    """The model that `config.model` and `config.attention` describe."""
    m = config.model
    if m.dtype not in DTYPES:
        raise ConfigError(f"unknown model dtype {m.dtype!r}; choose one of {', '.join(DTYPES)}")
    dtype = DTYPES[m.dtype]
    encoder = Encoder(
        vocab_size=vocab_size, max_len=config.max_len, dim=m.emb_dim, num_heads=m.num_heads,
        mlp_dim=m.mlp_dim, num_layers=m.num_layers, attention=config.attention.to_dict(),
        positions=m.positions, cls_token=m.cls_token, dropout_rate=m.dropout_rate,
        attention_dropout_rate=m.attention_dropout_rate, scan_layers=m.scan_layers, remat=m.remat,
        dtype=dtype, rngs=rngs,
    )
    head = ClassifierHead(m.emb_dim, m.mlp_dim, num_classes, dtype=dtype, rngs=rngs)
    return SequenceClassifier(encoder, head, m.pooling)
