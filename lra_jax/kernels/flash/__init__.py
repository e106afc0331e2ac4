"""Dense softmax attention: blockwise online softmax (FlashAttention) and its reference."""

from lra_jax.kernels.flash.api import flash_attention

__all__ = ["flash_attention"]
