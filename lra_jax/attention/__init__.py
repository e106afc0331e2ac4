"""Attention variants. Importing this package registers every variant family."""

from lra_jax.attention import registry  # noqa: F401
from lra_jax.attention import additive, kernelized, lowrank, mixers, softmax, sparse, synthesizer  # noqa: F401
