"""The gated-scan op (lra_jax/kernels/gated_scan): its contract (`kernel_contract`: the Triton kernel, interpreted
here and compiled on a GPU, against the XLA chunked form, forward and the gradients of all four inputs, and in
bfloat16); the GLA and SSD layers with impl="pallas" against impl="xla"; the plan each target gets; the kernels lowered for CUDA, and compiled on a GPU where there is one
(`.ci/gpu-check`). The chunked form itself is held to the step-by-step recurrence in tests/attention/test_gated.py."""

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
from lra_jax.research.compilation import lowering
from lra_jax.kernels import TRITON, XLA, Target, tiling
from lra_jax.kernels.gated_scan import pallas_gpu
from lra_jax.kernels.gated_scan.api import GATED_SCAN, gated_scan

B, H, DK, DV = 2, 2, 4, 8


def scan_inputs(n, gate_width, dtype=np.float32, seed=0):
    """q, k [B n H DK], v [B n H DV] (standard normal) and log-gates in [-1, 0] [B n H gate_width]."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, n, H, DK)).astype(dtype) for _ in range(2))
    v = rng.standard_normal((B, n, H, DV)).astype(dtype)
    log_g = -rng.uniform(0.0, 1.0, (B, n, H, gate_width)).astype(np.float32)
    return q, k, v, log_g


def scan_case(decay: str, strict: bool, n: int, chunk: int, fast: bool = False) -> Case:
    """A gated scan of n steps with a gate per key dimension (GLA, "per-dim") or one per head (SSD, "scalar")."""
    def inputs(dtype):
        q, k, v, log_g = scan_inputs(n, DK if decay == "per-dim" else 1)
        return (q.astype(dtype), k.astype(dtype), v.astype(dtype), log_g), None  # the gates stay float32

    return Case(inputs, lambda plan, *x: gated_scan(*x, chunk=chunk, strict=strict, plan=plan), terms=n, fast=fast)


class TestGatedScan(KernelContract):
    """n = 37 and 29 are no multiple of any chunk (the padded path); chunk 8 runs as the kernel's 16, chunk 32
    as 32 over 40 steps; chunk 64 is SSD's, which its forward and dq kernels run while the dk/dv kernel runs 32.
    Both forms sum the same n terms per output in another order (other chunks, [C, C] vs per-key decays)."""

    op = GATED_SCAN
    cases = {
        "per-dim-37-16": scan_case("per-dim", False, 37, 16, fast=True),
        "scalar-strict-29-16": scan_case("scalar", True, 29, 16, fast=True),
        "per-dim-strict-40-32": scan_case("per-dim", True, 40, 32),
        "scalar-24-8": scan_case("scalar", False, 24, 8),
        "per-dim-24-8": scan_case("per-dim", False, 24, 8),
        "scalar-40-32": scan_case("scalar", False, 40, 32),
        "scalar-100-64": scan_case("scalar", False, 100, 64, fast=True),
    }
    bfloat16_cases = ("scalar-24-8",)


@pytest.mark.slow
def test_the_step_left_out_is_the_strict_forms_only_difference():
    """strict: y_t = q_t diag(g_t) S_{t-1}, so y - y_strict = (q_t · k_t) v_t, the current step's own term."""
    q, k, v, log_g = scan_inputs(24, DK)
    full, strict = (np.asarray(gated_scan(q, k, v, log_g, chunk=16, strict=s, impl="pallas", interpret=True))
                    for s in (False, True))
    own = np.einsum("bnhj,bnhj->bnh", q, k)[..., None] * v
    assert_close(full - strict, own, reassociation_tol(24, depth=4))


# The layers with impl="pallas" (the Triton kernel, interpreted) against impl="xla"; the causal form too.
LAYERS = {"gla": dict(chunk=8, gate_rank=4), "ssd": dict(state_size=4, expand=1, head_size=8, chunk=8),
          "ssd-causal": dict(state_size=4, expand=1, head_size=8, chunk=16, bidirectional=False)}


@pytest.mark.parametrize("name", slow_except(LAYERS, keep={"gla"}))
def test_layer_with_the_kernel_matches_the_layer_with_xla(name):
    assert_layer_kernel_agrees_with_xla(name.split("-")[0], LAYERS[name])


def test_plans_the_triton_kernel_on_a_gpu_and_xla_with_a_reason_elsewhere():
    gpu = Target("gpu", interpret=False)
    assert kernels.plan("auto", gpu, GATED_SCAN).implementation is GATED_SCAN[TRITON]
    assert kernels.plan("auto", Target("cpu", interpret=True), GATED_SCAN).kernel == XLA  # CPU: XLA, as asked
    tpu = kernels.plan("pallas", Target("tpu", interpret=False), GATED_SCAN)
    assert tpu.kernel == XLA and "no mosaic kernel" in tpu.reason
    with kernels.target_platform("gpu"):
        causal = registry.build("ssd", dim=16, num_heads=2, rngs=nnx.Rngs(0), impl="auto", bidirectional=False)
        wide = registry.build("gla", dim=512, num_heads=1, rngs=nnx.Rngs(0), impl="auto")  # d_k 256, d_v 512
    assert causal.kernel_plan(deterministic=False).kernel == TRITON  # the scan runs one direction: causal too
    too_wide = wide.kernel_plan(deterministic=True)
    assert too_wide.kernel == XLA and "gated scan" in too_wide.reason and "impl='xla'" in too_wide.reason


@pytest.mark.parametrize("decay", slow_except(["per-dim", "scalar"], keep={"scalar"}))
def test_kernels_lower_for_cuda_forward_and_backward(decay):
    """jax.export for CUDA runs the Pallas -> Triton lowering of the forward kernel and both backward kernels
    (bfloat16 inputs, a length that is no multiple of the chunk)."""
    n, dk, dv = 1000, 32 if decay == "per-dim" else 16, 64
    qk = jax.ShapeDtypeStruct((2, n, 4, dk), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((2, n, 4, dv), jnp.bfloat16)
    log_g = jax.ShapeDtypeStruct((2, n, 4, dk if decay == "per-dim" else 1), jnp.float32)
    loss = lambda *x: jnp.sum(gated_scan(*x, chunk=64, impl="pallas", platform="gpu"))  # noqa: E731
    step = jax.jit(lambda *x: (loss(*x), jax.grad(loss, argnums=(0, 1, 2, 3))(*x)))
    text = lowering.lowered_text(step, "cuda", qk, qk, v, log_g)
    assert text.count(lowering.KERNEL_CALLS["gpu"]) == 3  # gated_scan_fwd, gated_scan_bwd_dq, gated_scan_bwd_dkv


# ptxas's registers per thread (12.9, sm_90a: the least `.maxnreg` without a spill; None: it spilled at 255) for the
# kernels XLA:GPU compiled for H100, float32, two stages: (kernel, one decay per head, chunk, warps, d_k, d_v).
# The full-scale heads (SSD: d_k = d_v = 16, chunk 64; GLA: chunk 16, d_k = d_v / 2 of 64, 32, <= 16 padded to 16)
# and the next larger chunk or fewer warps that the planner refuses; pallas_gpu.REGISTER_FIT is fitted to these
# and the rest of the sweep (about 200 counts).
PTXAS_REGISTERS = {
    ("forward", True, 64, 4, 16, 16): 223, ("dq", True, 64, 4, 16, 16): 196,
    ("dkv", True, 64, 4, 16, 16): None,  # 96 bytes spilled (184 through XLA's nvJitLink, before the key-major tiles)
    ("dkv", True, 32, 4, 16, 16): 197,
    ("forward", False, 16, 4, 32, 64): 168, ("dq", False, 16, 4, 32, 64): 150,
    ("dkv", False, 16, 4, 32, 64): 237,  # 251 with bfloat16 inputs: within the margin, refused
    ("dkv", False, 16, 8, 32, 64): 194, ("forward", False, 32, 4, 32, 64): None, ("dq", False, 32, 8, 32, 64): 241,
    ("forward", False, 16, 4, 16, 32): 92, ("dq", False, 16, 4, 16, 32): 111, ("dkv", False, 16, 4, 16, 32): 160,
    ("dkv", False, 32, 4, 16, 32): None,
    ("forward", False, 16, 4, 16, 16): 101, ("dq", False, 16, 4, 16, 16): 117, ("dkv", False, 16, 4, 16, 16): 175,
    ("forward", False, 32, 4, 16, 16): None, ("dkv", False, 32, 8, 16, 16): 241,
    ("forward", True, 64, 4, 32, 16): 251, ("dkv", True, 32, 4, 32, 16): 241, ("dq", False, 32, 8, 32, 32): 237,
}


def test_the_register_fit_bounds_ptxas_counts_and_keeps_its_margin():
    """The fit is at or above every count and above 255 wherever ptxas spilled; what it allows (with its margin),
    ptxas ran with the margin to spare."""
    for (kernel, scalar_decay, chunk, warps, dk, dv), counted in PTXAS_REGISTERS.items():
        case = (kernel, scalar_decay, chunk, warps, dk, dv)
        fitted = pallas_gpu.registers(kernel, chunk, dk, dv, scalar_decay, warps)
        assert fitted > tiling.MAX_REGISTERS if counted is None else fitted >= counted, (case, fitted)
        if fitted + pallas_gpu.REGISTER_MARGIN <= tiling.MAX_REGISTERS:
            assert counted <= tiling.MAX_REGISTERS - pallas_gpu.REGISTER_MARGIN, (case, fitted)


def test_each_kernel_takes_the_largest_chunk_ptxas_runs_without_spilling():
    """SSD at full scale: forward and dq at its 64 steps, the dk/dv kernel at 32 (at 64 ptxas spilled 96-184 bytes);
    GLA's ListOps/Text heads (d_k 32, d_v 64): the dk/dv kernel at 8 warps (at 4 it needs 237-251 registers of 255).
    Every choice is a count of PTXAS_REGISTERS below 255 less the margin."""
    expected = {(64, 16, 16, True): [(64, 4), (64, 4), (32, 4)], (16, 32, 64, False): [(16, 4), (16, 4), (16, 8)],
                (16, 16, 32, False): [(16, 4)] * 3, (16, 16, 16, False): [(16, 4)] * 3}
    for name in ("9.0", "8.0"):  # H100 and A100: the register file is the same, the shared memory binds neither
        with kernels.target_platform("gpu", shared_memory=tiling.SHARED_MEMORY_PER_BLOCK[name]):
            for (chunk, dk, dv, scalar_decay), want in expected.items():
                tiles = pallas_gpu.choose_tilings(chunk, dk, dv, scalar_decay)
                assert [(t.block_q, t.num_warps) for t in tiles] == want, (chunk, dk, dv, scalar_decay)
                for kernel, t in zip(pallas_gpu.KERNELS, tiles):
                    counted = PTXAS_REGISTERS[kernel, scalar_decay, t.block_q, t.num_warps, dk, dv]
                    assert counted <= tiling.MAX_REGISTERS - pallas_gpu.REGISTER_MARGIN
                    assert t.num_stages == 2 and t.shared_memory == pallas_gpu.shared_memory_bytes(
                        kernel, t.block_q, dk, dv, 2)


def test_a_head_too_wide_for_the_registers_says_so():
    refused = r"gated scan dkv Triton kernel needs an estimated \d+ registers per thread \(4 warps; .* even at 16-row "
    with kernels.target_platform("gpu"), pytest.raises(tiling.TilingError, match=refused + r"blocks: use impl='xla'"):
        pallas_gpu.choose_tilings(64, 64, 64, True)  # SSD with N = P = 64: its dk/dv kernel spilled even at 16
