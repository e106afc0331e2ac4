"""Non-causal kernelized (linear) attention: fused Pallas kernel and its reference."""

from lra_jax.kernels.linear.api import LINEAR, linear_attention

__all__ = ["LINEAR", "linear_attention"]
