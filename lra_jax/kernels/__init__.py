"""Pallas kernels for the attention hot path, each beside its pure-jnp reference.

    flash/         dense softmax attention, blockwise online softmax (FlashAttention)
    block_sparse/  the same online softmax over a block layout (local, strided, Longformer, BigBird)
    linear/        fused non-causal kernelized attention (Performer, Linear Transformer)

Every package has `reference.py` (pure jnp, the test oracle), `pallas_gpu.py`
(the kernel) and `api.py`, whose entry point takes `impl="auto"|"xla"|"pallas"`:
"auto" is the Pallas kernel on GPU and the XLA form elsewhere; `interpret=True`
runs the Pallas kernel in the Pallas interpreter (CPU tests).

Backend: the kernels use the backend-neutral `pl` API (BlockSpec, grid,
`pl.program_id`, ref indexing with `pl.ds`, `lax.fori_loop`) and are lowered
through the Triton backend (`jax.experimental.pallas.triton.CompilerParams`),
because in jax 0.10 a bare `pl.pallas_call` on GPU defaults to Mosaic GPU,
whose lowering expects the warpgroup-level `plgpu` programming model. They are
not written for TPU (Mosaic TPU wants (8, 128)-aligned trailing block dims and
a lane-dense log-sum-exp); on TPU "auto" resolves to XLA.
"""

from __future__ import annotations

import jax

IMPLS = ("auto", "xla", "pallas")


def resolve_impl(impl: str, interpret: bool = False) -> str:
    """"auto" -> "pallas" on GPU (or when interpreting), "xla" elsewhere; checks the name."""
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl == "auto":
        return "pallas" if interpret or jax.default_backend() == "gpu" else "xla"
    return impl


def pallas_available() -> bool:
    """True where the compiled (non-interpreted) kernels can run: a GPU backend."""
    return jax.default_backend() == "gpu"


def kernel_choice(impl: str, *, dropout_active: bool = False) -> tuple[bool, bool]:
    """For an attention layer: (use the Pallas kernel?, run it in the interpreter?).

    "pallas" always uses the kernel, interpreted where no GPU is present (correct
    but slow: for tests); "auto" uses it only on a GPU; "xla" never. The kernels
    have no attention dropout, so an active dropout falls back to XLA.
    """
    if dropout_active or resolve_impl(impl) == "xla":
        return False, False
    return True, not pallas_available()
