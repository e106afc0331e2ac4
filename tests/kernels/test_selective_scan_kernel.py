"""The selective-scan op (lra_jax/kernels/selective_scan): its XLA chunked form against the step-by-step
recurrence at several chunks; its contract (`kernel_contract`: the Triton kernel, interpreted here and compiled
on a GPU, against the XLA form, forward and the gradients of all five inputs, and in bfloat16); the S6 layer
with impl="pallas" against impl="xla", both directions and the causal form; the plan each target gets; the
kernels lowered for CUDA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, reassociation_tol, slow_except
from kernel_contract import Case, KernelContract, assert_layer_kernel_agrees_with_xla
from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.kernels import TRITON, XLA, Target
from lra_jax.kernels.selective_scan import reference
from lra_jax.kernels.selective_scan.api import SELECTIVE_SCAN, selective_scan
from lra_jax.research.compilation import lowering

B = 2


def scan_inputs(n, inner, state, dtype=np.float32, seed=0):
    """Δ in (0, 0.5], A in [-2, -0.1] (their product a decay per step of at most e^-1), x, B, C standard normal."""
    rng = np.random.default_rng(seed)
    dt = rng.uniform(1e-3, 0.5, (B, n, inner)).astype(np.float32)
    a = -rng.uniform(0.1, 2.0, (inner, state)).astype(np.float32)
    x = rng.standard_normal((B, n, inner)).astype(dtype)
    b, c = (rng.standard_normal((B, n, state)).astype(dtype) for _ in range(2))
    return dt, a, x, b, c


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_the_chunked_form_is_the_recurrence(chunk):
    """Any chunk, the last one short (n = 37): the same n terms per output as step by step, in another order."""
    inputs = [jnp.asarray(v) for v in scan_inputs(37, 6, 4)]
    assert_close(reference.chunked(*inputs, chunk=chunk), reference.recurrent(*inputs), reassociation_tol(37, depth=4))


def scan_case(n: int, inner: int, state: int, chunk: int = 8, fast: bool = False) -> Case:
    """A selective scan of n steps over `inner` channels with `state` states each (padded by the kernel's call
    to its 16-step chunks, its block of channels and 16 states where they are no multiple)."""
    def inputs(dtype):
        dt, a, x, b, c = scan_inputs(n, inner, state)
        return (dt, a, x.astype(dtype), b.astype(dtype), c.astype(dtype)), None  # Δ and A stay float32

    return Case(inputs, lambda plan, *v: selective_scan(*v, chunk=chunk, plan=plan), terms=n, fast=fast)


class TestSelectiveScan(KernelContract):
    """n = 37 is no multiple of the kernel's 16-step chunks, 20 channels none of its 32-channel blocks and 12
    states not a power of two (the padded path); 64 channels are two blocks; 100 steps carry over seven chunks;
    64 states take blocks of 8 channels.
    Both forms sum the same n terms per output in another order."""

    op = SELECTIVE_SCAN
    cases = {
        "37-20-12": scan_case(37, 20, 12, fast=True),
        "32-64-16": scan_case(32, 64, 16, fast=True),
        "100-8-16": scan_case(100, 8, 16, chunk=16),
        "24-20-64": scan_case(24, 20, 64),  # 64 states: 8 channels per program, three blocks over 24 padded
    }
    bfloat16_cases = ("32-64-16",)


# The S6 layer with impl="pallas" (the Triton kernel, interpreted) against impl="xla"; the causal form too.
LAYERS = {"s6": dict(state_size=4, chunk=8), "s6-causal": dict(state_size=4, chunk=8, bidirectional=False)}


@pytest.mark.parametrize("name", slow_except(LAYERS, keep={"s6"}))
def test_layer_with_the_kernel_matches_the_layer_with_xla(name):
    assert_layer_kernel_agrees_with_xla(name.split("-")[0], LAYERS[name])


def test_plans_the_triton_kernel_on_a_gpu_and_xla_with_a_reason_elsewhere():
    assert kernels.plan("auto", Target("gpu", interpret=False), SELECTIVE_SCAN).kernel == TRITON
    assert kernels.plan("auto", Target("cpu", interpret=True), SELECTIVE_SCAN).kernel == XLA  # CPU: XLA, as asked
    tpu = kernels.plan("pallas", Target("tpu", interpret=False), SELECTIVE_SCAN)
    assert tpu.kernel == XLA and "no mosaic kernel" in tpu.reason
    with kernels.target_platform("gpu"):
        causal = registry.build("s6", dim=16, num_heads=2, rngs=nnx.Rngs(0), impl="auto", bidirectional=False)
    assert causal.kernel_plan(deterministic=False).kernel == TRITON  # the scan runs one direction: causal too


@pytest.mark.slow
def test_the_kernels_lower_for_cuda_in_a_training_step():
    """Forward and backward lower through Triton for a GPU: three kernel calls, none falling back to XLA."""
    n, inner, state = 1000, 64, 16
    channels = jax.ShapeDtypeStruct((2, n, inner), jnp.float32)
    states = jax.ShapeDtypeStruct((2, n, state), jnp.float32)
    a = jax.ShapeDtypeStruct((inner, state), jnp.float32)
    loss = lambda *v: jnp.sum(selective_scan(*v, chunk=16, impl="pallas", platform="gpu"))  # noqa: E731
    step = jax.jit(lambda *v: (loss(*v), jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*v)))
    text = lowering.lowered_text(step, "cuda", channels, a, channels, states, states)
    assert text.count(lowering.KERNEL_CALLS["gpu"]) == 3  # selective_scan_fwd, _bwd_states, _bwd_reverse
