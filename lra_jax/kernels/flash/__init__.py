"""Dense softmax attention: blockwise online softmax (FlashAttention) and its reference."""

from lra_jax.kernels.flash.api import FLASH, flash_attention

__all__ = ["FLASH", "flash_attention"]
