"""Block-sparse softmax attention: the flash online softmax over a block layout, and its reference.

The op is `api` (`BLOCK_SPARSE`, `block_sparse_attention`); this package imports nothing itself (see
`lra_jax.kernels.flash`).
"""
