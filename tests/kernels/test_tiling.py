"""Blocks, warps and stages of the Triton kernels from the target GPU's shared memory (`lra_jax.kernels.tiling`).

The first tests are pure (shapes and a shared-memory figure -> blocks) and run anywhere, the kernels in
the Pallas interpreter. The rest compile the kernels with XLA:GPU for H100 and A100 on this CPU (the
`[cuda]` extra) and are skipped, with the reason, without it: the shared memory Triton requests must be
within each kernel's stated bound, the shapes that did not fit must compile, and the flash backward and
the gated-scan kernels must not spill registers where the register bound chose their blocks, nor the
selective-scan kernels at the channels per program their state width gives.
"""

from __future__ import annotations

import glob
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, reassociation_tol

from lra_jax import kernels
from lra_jax.kernels import tiling
from lra_jax.kernels.flash import pallas_gpu as flash
from lra_jax.kernels.linear import pallas_gpu as linear
from lra_jax.kernels.linear import reference as linear_reference
from lra_jax.kernels.linear.api import kernel_limit, linear_attention
from lra_jax.kernels.masking import Mask
from lra_jax.measure import accelerators

H100, A100 = tiling.SHARED_MEMORY_PER_BLOCK["9.0"], tiling.SHARED_MEMORY_PER_BLOCK["8.0"]


# ----------------------------------------------------------------------------- the choice, no compiler

def test_the_gpus_figures_agree_with_the_compile_targets():
    for name, figure in (("h100", H100), ("a100", A100)):
        assert accelerators._GPU_DEVICE_INFO[name]["shared_memory_per_block_optin"] == figure


def test_candidates_halve_from_the_requested_blocks_to_16():
    assert tiling.candidates(64, 64) == [(64, 64), (32, 32), (16, 16)]
    assert tiling.candidates(16, 64) == [(16, 64), (16, 32), (16, 16)]


def test_choose_takes_the_largest_blocks_then_the_most_stages_that_fit():
    need = lambda bq, bk, stages: 1000 * bq * stages  # noqa: E731
    assert tiling.choose("k", need, 64, 64, limit=128_000) == tiling.Tiling(64, 64, 4, 2, 128_000)
    assert tiling.choose("k", need, 64, 64, limit=64_000) == tiling.Tiling(64, 64, 4, 1, 64_000)
    assert tiling.choose("k", need, 64, 64, limit=63_999) == tiling.Tiling(32, 32, 4, 1, 32_000)
    with pytest.raises(tiling.TilingError, match=r"needs 16,000 bytes of shared memory \(this GPU has 15,999 per "
                                                 r"block\) even at 16-row blocks and one stage") as error:
        tiling.choose("k", need, 64, 64, limit=15_999)
    assert "register" not in str(error.value)


def test_the_refusal_names_the_bound_that_refused_the_smallest_blocks():
    """Registers (the estimate per thread against 255), shared memory (the bytes against the GPU's), or both."""
    need = lambda bq, bk, stages: 1000 * bq * stages  # noqa: E731
    live = lambda bq, bk: 128 * 12 * bq  # noqa: E731 - 16 rows: 192 elements a thread, with the scalars 256
    assert tiling.choose("k", need, 64, 64, limit=10**6, live_elements=lambda bq, bk: live(bq, bk) // 2).block_q == 16
    with pytest.raises(tiling.TilingError) as error:
        tiling.choose("k", need, 64, 64, limit=10**6, live_elements=live)
    assert str(error.value) == ("the k Triton kernel needs an estimated 256 registers per thread (4 warps; a thread "
                                "has 255, beyond which ptxas spills to local memory) even at 16-row blocks: "
                                "use impl='xla'")
    with pytest.raises(tiling.TilingError, match=r"needs an estimated 256 registers per thread .* and 16,000 bytes "
                                                 r"of shared memory \(this GPU has 15,999 per block\) even at 16-row "
                                                 r"blocks and one stage: use impl='xla'"):
        tiling.choose("k", need, 64, 64, limit=15_999, live_elements=live)
    with pytest.raises(tiling.TilingError, match=r"needs an estimated 264 registers per thread \(8 warps; .* 16-row "
                                                 r"blocks: "):
        tiling.choose("k", need, 64, 64, limit=10**6, num_warps=8, live_elements=lambda bq, bk: 256 * 200 * bq // 16)


@pytest.mark.parametrize("limit", [H100, A100])
@pytest.mark.parametrize("d", [16, 64])  # Path-X and ListOps heads; Performer's 256 features
def test_performer_full_scale_tilings_fit_the_gpu(limit, d):
    """Full-scale Performer: 256 features. At the fixed 64-row block and two stages the backward asked
    for 278,528 bytes (A100 ListOps, d = 64) and 167,936 (A100 Path-X, d = 16), the forward 196,608."""
    with kernels.target_platform("gpu", shared_memory=limit):
        forward, backward = linear.choose_tilings(64, 256, d)
    assert forward.shared_memory == linear.forward_bytes(forward.block_q, 256, d, forward.num_stages) <= limit
    assert backward.shared_memory == linear.backward_bytes(backward.block_q, 256, d, backward.num_stages) <= limit
    if limit == A100:  # the fixed 64 rows and two stages that failed are no longer chosen where they failed
        assert (backward.block_q, backward.num_stages) != (64, 2)
        assert (forward.block_q, forward.num_stages) != (64, 2) or d == 16


def test_flash_blocks_keep_the_backward_within_the_registers():
    """At head dim 64, float32, 64 x 64 blocks the dK/dV kernel spilled on A100 (255 registers); 32 x 32 did not."""
    for d, expected in ((16, 64), (32, 32), (64, 32)):
        tiles = flash.choose_tiling(64, 64, d)
        assert (tiles.block_q, tiles.block_k) == (expected, expected)
        assert flash.live_elements(tiles.block_q, tiles.block_k, d) / 128 + tiling.SCALAR_REGISTERS <= 255


def test_dense_flash_takes_the_blocks_measured_on_hopper_where_the_gpu_has_its_shared_memory():
    """H100/H200: 64 x 64 at head dim 64 and 64 x 32 at 128 (faster there than the spill-free 32 x 32 and
    16 x 16); requested blocks still bound them. Other head dims and an A100 keep the register bound."""
    with kernels.target_platform("gpu", shared_memory=H100):
        for d, blocks in flash.HOPPER_BLOCKS.items():
            tiles = flash.choose_dense_tiling(64, 64, d)
            assert (tiles.block_q, tiles.block_k) == blocks and tiles.shared_memory <= H100
        smaller = flash.choose_dense_tiling(32, 16, 64)  # the requested blocks bound the measured ones
        assert (smaller.block_q, smaller.block_k) == (32, 16)
        assert flash.choose_dense_tiling(64, 64, 32) == flash.choose_tiling(64, 64, 32)
    with kernels.target_platform("gpu", shared_memory=A100):
        for d in flash.HOPPER_BLOCKS:
            assert flash.choose_dense_tiling(64, 64, d) == flash.choose_tiling(64, 64, d)


@pytest.mark.slow
def test_the_tiling_sweep_times_the_dense_kernel_at_the_tiling_it_names():
    """Its call at a forced tiling (B_q != B_k), interpreted, is softmax attention on the real rows."""
    from lra_jax.kernels.flash import reference
    from lra_jax.tools import tiling_sweep

    q, k, v = (jnp.asarray(np.random.default_rng(i).standard_normal((2, 128, 2, 64)), jnp.float32) for i in range(3))
    mask = jnp.asarray(np.arange(128)[None, :] < np.array([[128], [90]]))
    out = tiling_sweep.kernel_at(tiling.Tiling(64, 32, 4, 2, 0), 0.0, interpret=True)(q, k, v, mask)
    want = reference.attention(q, k, v, mask, mask, 64**-0.5, 0.0, None)
    assert_close(np.where(mask[:, :, None, None], out, 0), want, reassociation_tol(128, depth=4))


def test_the_tiling_sweep_says_it_needs_a_gpu():
    from lra_jax.tools import tiling_sweep

    if kernels.pallas_available():
        pytest.skip("a GPU is here: the sweep runs")
    with pytest.raises(SystemExit, match="needs a GPU"):
        tiling_sweep.main([])


def test_a_kernel_that_cannot_fit_any_block_is_named_and_the_layer_runs_xla():
    with kernels.target_platform("gpu", shared_memory=A100):
        assert kernel_limit(256, 64) is None
        reason = kernel_limit(512, 128)  # S and dS alone: 2 x 512 x 128 floats = 512 KiB
    assert reason.startswith("the linear attention forward Triton kernel needs") and "use impl='xla'" in reason


def test_target_platform_passes_the_shared_memory_to_inner_targets_of_the_same_platform():
    with kernels.target_platform("gpu", shared_memory=1234):
        with kernels.target_platform("cuda"):
            assert tiling.shared_memory() == 1234
        with kernels.target_platform("tpu"):
            assert kernels.current_target().shared_memory is None
    if tiling.local_compute_capability() is None:  # no GPU here: the H100 the kernels are lowered for
        with kernels.target_platform("gpu"):
            assert tiling.shared_memory() == H100


@pytest.mark.slow
def test_smaller_blocks_chosen_for_a_small_gpu_give_the_same_attention():
    """A GPU with little shared memory: the forward runs 32 rows a step, the backward 16 at one stage; the
    result and its gradient are the reference's."""
    keys = jax.random.split(jax.random.key(3), 3)
    q, k, v = (jax.random.normal(key, (2, 40, 2, 32)) for key in keys)
    mask = jnp.arange(40)[None, :] < jnp.array([[40], [25]])
    small = linear.backward_bytes(16, 32, 32, 1)
    with kernels.target_platform("gpu", interpret=True, shared_memory=small):
        assert [(t.block_q, t.num_stages) for t in linear.choose_tilings(64, 32, 32)] == [(32, 1), (16, 1)]
        out, grad = jax.value_and_grad(
            lambda q: linear_attention(q, k, v, Mask(key_mask=mask), impl="pallas", interpret=True).sum())(q)
    want, want_grad = jax.value_and_grad(lambda q: linear_reference.attention(q, k, v, mask, mask, "elu").sum())(q)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- XLA:GPU on this CPU

def gpu_or_skip(name: str):
    reason = accelerators.available()["cuda"]
    if reason:
        pytest.skip(f"compiling for {name} needs XLA:GPU: {reason}")
    return accelerators.get(name)


def compile_for(target, fn, shapes, tmp_path, **options):
    """Compiles fn for `target` with the target's shared memory; {kernel name: shared memory bytes}."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from lra_jax import compat

    mesh = Mesh(np.array(target.devices), ("data",))
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec())) for shape, dtype in shapes]
    with kernels.target_platform("gpu", shared_memory=target.shared_memory), compat.abstract_mesh(mesh):
        jax.jit(fn).lower(*args).compile(compiler_options={"xla_dump_to": str(tmp_path), **options})
    text = "".join(open(f).read() for f in glob.glob(str(tmp_path / "*thunk_sequence*")))
    return {m[1]: int(m[2]) for m in re.finditer(r"\] (\w+) grid: .* shared_memory: (\d+) bytes", text)}


def linear_step():
    def step(q, k, v, mask):  # the value too: the backward does not need the forward's output
        return jax.value_and_grad(lambda q, k, v: linear_attention(q, k, v, Mask(key_mask=mask), feature_map="identity",
                                                                   impl="pallas").sum(), (0, 1, 2))(q, k, v)
    return step


@pytest.mark.parametrize("name", ["h100", "a100"])
@pytest.mark.parametrize("n, h, d", [(2000, 8, 64), (16384, 2, 16)])  # ListOps and Path-X heads
@pytest.mark.slow
def test_full_scale_performer_kernels_compile_within_their_bounds(name, n, h, d, tmp_path):
    """The shapes that did not compile (A100: ListOps 196,608 and 278,528 bytes asked, Path-X 167,936;
    166,912 available) compile, each kernel asking for no more than its bound."""
    target = gpu_or_skip(name)
    shapes = [((1, n, h, 256), jnp.float32)] * 2 + [((1, n, h, d), jnp.float32), ((1, n), bool)]
    requested = compile_for(target, linear_step(), shapes, tmp_path)
    with kernels.target_platform("gpu", shared_memory=target.shared_memory):
        forward, backward = linear.choose_tilings(64, 256, d)
    assert 0 < requested["linear_attention_fwd"] <= forward.shared_memory <= target.shared_memory
    assert 0 < requested["linear_attention_bwd"] <= backward.shared_memory <= target.shared_memory


@pytest.mark.parametrize("name", ["h100", "a100"])
@pytest.mark.parametrize("d, dtype", [(64, jnp.float32), (128, jnp.bfloat16)])
@pytest.mark.slow
def test_flash_kernels_ask_no_more_than_their_bound_and_do_not_spill(name, d, dtype, tmp_path):
    """Forward and backward with attention dropout, within the shared-memory bound of the blocks chosen;
    where the register bound chose them (A100), XLA fails the compile if ptxas spills a register."""
    from lra_jax.kernels.flash.api import flash_attention

    target = gpu_or_skip(name)
    seed = jnp.zeros((1,), jnp.uint32)

    def step(q, k, v, mask):
        return jax.grad(lambda q, k, v: flash_attention(q, k, v, Mask(key_mask=mask), impl="pallas", dropout_rate=0.1,
                                                        dropout_seed=seed).astype(jnp.float32).sum(),
                        (0, 1, 2))(q, k, v)

    shapes = [((2, 512, 2, d), dtype)] * 3 + [((2, 512), bool)]
    with kernels.target_platform("gpu", shared_memory=target.shared_memory):
        tiles = flash.choose_dense_tiling(64, 64, d)
        spill_free = tiles == flash.choose_tiling(64, 64, d)
    assert spill_free == (name == "a100")
    requested = compile_for(target, step, shapes, tmp_path,
                            xla_gpu_fail_ptx_compilation_on_register_spilling=spill_free)
    for kernel in ("flash_fwd", "flash_bwd_dq", "flash_bwd_dkv"):
        assert 0 < requested[kernel] <= tiles.shared_memory, kernel


# (d_k, d_v, one decay per head, chunk, dtype): the full-scale GLA heads (d_k = d_v / 2 of ListOps/Text's 64,
# Retrieval's 32, the image tasks' <= 16, padded to 16) at chunk 16 and SSD's (d_k = d_v = 16) at chunk 64.
GATED_SCANS = [(32, 64, False, 16, jnp.float32), (16, 32, False, 16, jnp.float32), (16, 16, False, 16, jnp.float32),
               (16, 16, True, 64, jnp.float32), (32, 64, False, 16, jnp.bfloat16), (16, 16, True, 64, jnp.bfloat16)]


@pytest.mark.parametrize("name", ["h100", "a100"])
@pytest.mark.parametrize("dk, dv, scalar_decay, chunk, dtype", GATED_SCANS)
@pytest.mark.slow
def test_gated_scan_kernels_ask_no_more_than_their_bound_and_do_not_spill(name, dk, dv, scalar_decay, chunk, dtype,
                                                                           tmp_path):
    """The forward, dq and dk/dv kernels (value and all four gradients) at the tilings the register fit chose:
    XLA fails the compile if ptxas spills a register (the dk/dv kernel spilled 20-184 bytes at SSD's chunk of 64),
    and each asks for no more shared memory than its bound."""
    from lra_jax.kernels.gated_scan.api import gated_scan
    from lra_jax.kernels.gated_scan import pallas_gpu as gated

    target = gpu_or_skip(name)

    def step(q, k, v, log_g):
        return jax.value_and_grad(lambda *x: gated_scan(*x, chunk=chunk, impl="pallas").sum(), (0, 1, 2, 3))(
            q, k, v, log_g)

    n, h = 1000, 2  # no multiple of the chunk: the padded path
    gates = (1, n, h, 1 if scalar_decay else dk)
    shapes = [((1, n, h, dk), dtype)] * 2 + [((1, n, h, dv), dtype), (gates, jnp.float32)]
    requested = compile_for(target, step, shapes, tmp_path, xla_gpu_fail_ptx_compilation_on_register_spilling=True)
    with kernels.target_platform("gpu", shared_memory=target.shared_memory):
        tiles = gated.choose_tilings(chunk, dk, dv, scalar_decay)
    for kernel, tile in zip(("gated_scan_fwd", "gated_scan_bwd_dq", "gated_scan_bwd_dkv"), tiles):
        assert 0 < requested[kernel] <= tile.shared_memory <= target.shared_memory, kernel


# (states N, dtype): S6's N = 16 of its full-scale configs (32 channels a program) and N = 64 (8 channels a program:
# the [channels, N] tiles are capped at STATE_TILE elements). The test fails when it should: at one warp, N = 64
# and 32 channels, ptxas spills and XLA discards the compile.
SELECTIVE_SCANS = [(16, jnp.float32), (16, jnp.bfloat16), (64, jnp.float32)]


@pytest.mark.parametrize("name", ["h100", "a100"])
@pytest.mark.parametrize("state, dtype", SELECTIVE_SCANS)
@pytest.mark.slow
def test_selective_scan_kernels_do_not_spill(name, state, dtype, tmp_path):
    """The forward kernel and both backward kernels (value and all five gradients) at the channels per program
    that `STATE_TILE` gives: XLA fails the compile if ptxas spills a register."""
    from lra_jax.kernels.selective_scan.api import selective_scan

    target = gpu_or_skip(name)

    def step(dt, a, x, b, c):
        return jax.value_and_grad(lambda *v: selective_scan(*v, chunk=16, impl="pallas").sum(), (0, 1, 2, 3, 4))(
            dt, a, x, b, c)

    n, inner = 1000, 64  # no multiple of the kernels' chunk: the padded path
    shapes = [((1, n, inner), dtype), ((inner, state), jnp.float32), ((1, n, inner), dtype),
              ((1, n, state), dtype), ((1, n, state), dtype)]
    requested = compile_for(target, step, shapes, tmp_path, xla_gpu_fail_ptx_compilation_on_register_spilling=True)
    assert {"selective_scan_fwd", "selective_scan_bwd_states", "selective_scan_bwd_reverse"} <= set(requested)


@pytest.mark.slow
def test_a_block_mask_runs_at_the_smaller_blocks_the_gpu_needs():
    """BigBird's block mask at 32-token blocks, run at 16 (a GPU with little shared memory): the mask is
    the same pattern at the finer blocks, so the result is the reference's."""
    from lra_jax.kernels.block_sparse.api import block_sparse_attention

    keys = jax.random.split(jax.random.key(5), 4)
    q, k, v = (jax.random.normal(key, (1, 96, 2, 16)) for key in keys[:3])
    block_mask = jax.random.bernoulli(keys[3], 0.5, (3, 3)) | jnp.eye(3, dtype=bool)
    mask = jnp.arange(96)[None, :] < 90
    run = lambda impl: block_sparse_attention(q, k, v, Mask(key_mask=mask, block_mask=block_mask, block=32),  # noqa: E731
                                              impl=impl, interpret=True)
    with kernels.target_platform("gpu", interpret=True, shared_memory=flash.shared_memory_bytes(16, 16, 16, 2)):
        assert flash.choose_tiling(32, 32, 16).block_q == 16
        out = run("pallas")
    np.testing.assert_allclose(out, run("xla"), rtol=1e-5, atol=1e-6)
