"""Attention variants. Importing this package registers every variant family."""

from lra_jax.attention import registry  # noqa: F401
from lra_jax.attention import (  # noqa: F401
    additive,
    clustering,
    convolution,
    hashing,
    kernelized,
    lowrank,
    mixers,
    sinkhorn,
    softmax,
    sparse,
    sparse_global,
    ssm,
    synthesizer,
)
