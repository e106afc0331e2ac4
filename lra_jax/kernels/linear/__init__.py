"""Non-causal kernelized (linear) attention: fused Pallas kernel and its reference."""

from lra_jax.kernels.linear.api import linear_attention

__all__ = ["linear_attention"]
