"""Attention variants. Importing this package registers every variant family."""

from lra_jax.attention import registry  # noqa: F401
from lra_jax.attention import (  # noqa: F401
    additive,
    clustering,
    gated,
    convolution,
    hashing,
    hyena,
    kernelized,
    lowrank,
    mega,
    mixers,
    recurrent,
    selective,
    sinkhorn,
    softmax,
    sparse,
    sparse_global,
    ssm,
    synthesizer,
)
