"""Block-sparse softmax attention: the flash online softmax over a block layout, and its reference."""

from lra_jax.kernels.block_sparse.api import BLOCK_SPARSE, block_sparse_attention

__all__ = ["BLOCK_SPARSE", "block_sparse_attention"]
