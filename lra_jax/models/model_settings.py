"""`config.model`, typed: the one home of the model's defaults (`config.task_defaults` starts every config
from them) and of the names its choices take. Checked by `lra_jax.config.settings`."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
POSITIONS = ("learned", "sinusoidal")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The encoder and its classifier; the defaults are the LRA paper's full-scale model.

    num_layers, num_heads, emb_dim, mlp_dim: the blocks (mlp_dim 0: no feed-forward sublayer).
    dropout_rate: residuals and MLP; attention_dropout_rate: the attention weights.
    positions: "learned" | "sinusoidal"; cls_token: a learned CLS token in front;
    pooling: "cls" | "mean" | "max"; dtype: a key of DTYPES.
    scan_layers, remat: the layers in one `lax.scan`, recomputed in the backward pass: the same function
    in about a third of the memory (Linformer ListOps, batch 32: 25 -> 9 GB); both False for speed where
    memory is plentiful.
    """

    num_layers: int = 4
    num_heads: int = 4
    emb_dim: int = 256
    mlp_dim: int = 1024
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    positions: str = "learned"
    cls_token: bool = True
    pooling: str = "cls"
    dtype: str = "float32"
    scan_layers: bool = True
    remat: bool = True
