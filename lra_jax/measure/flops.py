"""Model FLOPs of a train step, counted from the shapes (the model-FLOPs convention of MFU,
Chowdhery et al. 2022, App. B): matmuls only, 2 FLOPs per multiply-add, and the backward pass
twice the forward (a gradient for each operand of every matmul):

    step = 3 * (sum over layers of [mixer(B, n, d, h) + 4 B n d m_mlp])

with B examples, n = max_len (+1 for the CLS token) positions, width d, h heads and MLP width
m_mlp. The mixer's part is the variant's `forward_flops` (next to its `cost_exponent`;
`lra_jax.attention.core.TokenMixer`); a variant that does not declare it gives None, and a caller
then has only XLA's compiled count, which also counts elementwise work. Elementwise work
(softmax, layer norms, GELU, dropout, the optimizer) and the classifier head (B d (m_mlp + classes),
below 1e-4 of a step here) are left out, so XLA's count of the same step is a little larger:
`tests/measure/test_flops.py` bounds the difference, for one layer of every variant and for train steps.

Each variant counts what its XLA path computes, not the ideal pattern: whole masked blocks (local,
Longformer, BigBird), padded chunks and blocks (Reformer, Sinkhorn, strided). Counted as matmuls too:
a depthwise convolution's multiply-adds (lightweight and dynamic convolutions, Nystromformer's value
convolution) and a complex product (S4D's kernel: 8 FLOPs per complex multiply-add, where XLA counts 2).
FFTs, the only mixing FNet has, count 5 N log2 N per complex transform of N points and half that for a
real one (`attention.core.fft_flops`; XLA counts 8 per point and stage). Sorts, gathers, top-k and
Sinkhorn's normalisations do no multiply-adds and are not counted.
"""

from __future__ import annotations

from typing import Any

from lra_jax.attention import registry
from lra_jax.attention.core import matmul_flops as matmul


def forward_flops(*, variant: str, batch: int, length: int, dim: int, num_heads: int, mlp_dim: int,
                  num_layers: int, settings: dict[str, Any]) -> float | None:
    """Forward matmul FLOPs of the encoder (None where the variant declares no count).

    `length` counts every position the blocks see (CLS token included); `settings` are the
    layer's settings as built (`registry.layer_settings`)."""
    mixer = registry.get(variant).forward_flops(batch, length, dim, num_heads, settings)
    if mixer is None:
        return None
    return num_layers * (mixer + 2 * matmul(batch * length, dim, mlp_dim))


def train_step_flops(**shape: Any) -> float | None:
    """Forward and backward matmul FLOPs of a train step: 3 x `forward_flops`."""
    forward = forward_flops(**shape)
    return None if forward is None else 3.0 * forward
