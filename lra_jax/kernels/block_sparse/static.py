"""The static settings of a block-sparse kernel call (`BlockSparseStatic`), shared by every implementation of
`api.BLOCK_SPARSE` (the Triton and Mosaic kernels and the XLA reference take `(q, k, v, inputs, static)`,
`inputs` an `operands.AttentionInputs`)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BlockSparseStatic:
    """The static settings of a call: softmax scale, kernel block size (a block_mask's own where the mask
    has one), dropout rate, interpreter."""

    scale: float
    block: int = 64
    dropout_rate: float = 0.0
    interpret: bool = False
