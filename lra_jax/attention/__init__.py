"""Attention variants, one sub-package per family as the literature groups them; importing this package
registers every variant.

The shared core (`core`: the contract's base classes and masking; `registry`; `dropout`; `weighted_values`)
and full attention (`softmax`, `additive`: Bahdanau and Luong) sit at the top; the families below it are
`sparse`, `learned_patterns`, `low_rank`, `kernelized`, `synthesized`, `mixing` and `recurrent`
(`registry.FAMILY_PACKAGES`). The modules are imported in the order the docs list the variants of a family.
"""

# isort: off
from lra_jax.attention import registry, softmax, additive  # noqa: F401
from lra_jax.attention.sparse import windows, global_tokens  # noqa: F401
from lra_jax.attention.learned_patterns import hashing, clustering, sinkhorn  # noqa: F401
from lra_jax.attention.low_rank import projections  # noqa: F401
from lra_jax.attention.kernelized import feature_maps  # noqa: F401
from lra_jax.attention.synthesized import synthesizer  # noqa: F401
from lra_jax.attention.mixing import convolution, token_mixers  # noqa: F401
from lra_jax.attention.recurrent import ssm, diagonal, mega, hyena, selective, gated  # noqa: F401
