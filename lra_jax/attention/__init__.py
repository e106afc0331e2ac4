"""Attention variants. Importing this package registers every variant family."""

from lra_jax.attention import registry  # noqa: F401
from lra_jax.attention import kernelized, lowrank, softmax, sparse  # noqa: F401
