"""Dense softmax attention: blockwise online softmax (FlashAttention) and its reference.

The op is `api` (`FLASH`, `flash_attention`); this package imports nothing itself, so that the
block-sparse kernels, which run these kernels over a layout, and the flash op, which runs the block-sparse
implementations for a causal mask, import each other's modules without a circle through a package.
"""
