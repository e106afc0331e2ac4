"""lra_jax: efficient attention on the Long Range Arena, in JAX/Flax NNX."""

__version__ = "0.1.0"
