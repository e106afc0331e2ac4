"""Lowering for the accelerators from this CPU: every kernel, and full-scale Path-X train steps.

`jax.export` with platforms=["cuda"] runs the Pallas -> Triton lowering and
platforms=["tpu"] the Mosaic lowering (jax's splash attention), so a kernel or a
train step that would not compile there fails here. Each kernel is lowered
forward and backward (the gradient of a projection of its output); the custom
call of the platform's kernel must be in the lowered module. Shapes are abstract
(`jax.ShapeDtypeStruct`): nothing full-size is allocated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import slow_except

from lra_jax import kernels
from lra_jax.research.compilation import lowering
from lra_jax.research.choices import config_files
from lra_jax.kernels.block_sparse.api import block_sparse_attention
from lra_jax.kernels.flash.api import flash_attention
from lra_jax.kernels.linear.api import linear_attention
from lra_jax.kernels.masking import Mask
from lra_jax.tools import lower

B, N, H, D = 2, 1000, 2, 64  # a length that is no multiple of any block

KERNELS = {
    "flash": lambda q, k, v, m, p: flash_attention(q, k, v, Mask(key_mask=m), impl="pallas", platform=p),
    "local": lambda q, k, v, m, p: block_sparse_attention(q, k, v, Mask(key_mask=m, window=100), impl="pallas",
                                                          platform=p),
    "longformer": lambda q, k, v, m, p: block_sparse_attention(
        q, k, v, Mask(key_mask=m, window=100, global_keys=np.arange(N) < 1), impl="pallas", platform=p),
    "segments": lambda q, k, v, m, p: block_sparse_attention(
        q, k, v, Mask(key_mask=m, query_segments=jnp.arange(N) // 128, key_segments=jnp.arange(N) // 128),
        impl="pallas", platform=p),
    "block-mask": lambda q, k, v, m, p: block_sparse_attention(
        q, k, v, Mask(key_mask=m, block_mask=jnp.eye(16, dtype=bool) | (jnp.arange(16)[None, :] == 0), block=64),
        impl="pallas", platform=p),
    "linear": lambda q, k, v, m, p: linear_attention(q, k, v, Mask(key_mask=m), impl="pallas", platform=p),
    "flash-dropout": lambda q, k, v, m, p: flash_attention(q, k, v, Mask(key_mask=m), impl="pallas", platform=p,
                                                           dropout_rate=0.1, dropout_seed=SEED),
    "longformer-dropout": lambda q, k, v, m, p: block_sparse_attention(
        q, k, v, Mask(key_mask=m, window=100, global_keys=np.arange(N) < 1), impl="pallas", platform=p,
        dropout_rate=0.1, dropout_seed=SEED),
}
SEED = np.array([7], np.uint32)
# No linear kernel on TPU; splash has no dropout, and only dense attention has our TPU kernel with it.
CASES = [(name, p) for name in KERNELS for p in ("cuda", "tpu")
         if not (p == "tpu" and (name == "linear" or (name.endswith("-dropout") and name != "flash-dropout")))]


@pytest.mark.parametrize("name,platform", slow_except(CASES, keep={("flash", "cuda"), ("flash", "tpu")}))
def test_kernel_forward_and_backward_lower(name, platform):
    fn = KERNELS[name]
    qkv = jax.ShapeDtypeStruct((B, N, H, D), jnp.bfloat16)
    mask = jax.ShapeDtypeStruct((B, N), bool)

    def loss(q, k, v, m):
        return jnp.sum(fn(q, k, v, m, kernels.platform_of(platform)).astype(jnp.float32))

    step = jax.jit(lambda q, k, v, m: (loss(q, k, v, m), jax.grad(loss, argnums=(0, 1, 2))(q, k, v, m)))
    text = lowering.lowered_text(step, platform, qkv, qkv, qkv, mask)
    call = lowering.KERNEL_CALLS[kernels.platform_of(platform)]
    assert text.count(call) >= 2  # the forward kernel and at least one backward kernel


@pytest.mark.parametrize("variant", ["softmax", "local", "bigbird", "performer"])
@pytest.mark.slow
def test_full_scale_pathx_train_step_lowers_for_gpu_and_tpu(variant):
    """Path-X at 16,384 tokens, its config's dtype; attention dropout 0 so the train step runs the kernel."""
    module = config_files()[variant]
    config = lowering.load_config(module, "pathx", "full", attention_dropout_rate=0.0)
    assert config.max_len == 128 * 128
    for platform, kernel in (("cuda", kernels.TRITON), ("tpu", kernels.SPLASH)):
        described, result = lowering.lower_one(config, platform)
        assert result == "ok", (platform, result)
        if variant == "performer" and platform == "tpu":
            kernel = kernels.XLA  # no TPU kernel for linear attention
        assert described.startswith(f"encoder/blocks/attention={kernel}"), (platform, described)


@pytest.mark.slow
def test_attention_dropout_trains_with_the_triton_kernel_and_on_tpu_with_our_mosaic_kernel():
    config = lowering.load_config(config_files()["local"], "pathx", "mini")
    config.model.attention_dropout_rate = 0.1
    described, result = lowering.lower_one(config, "tpu")
    assert result == "ok"
    assert described == f"encoder/blocks/0/attention={kernels.MOSAIC_BLOCK_SPARSE}, eval {kernels.SPLASH}"
    described, result = lowering.lower_one(config, "cuda")
    assert result == "ok"
    assert described.startswith(f"encoder/blocks/0/attention={kernels.TRITON}") and "eval" not in described


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert lower.main(["--platforms=cuda,gpu2"]) == 2
    assert lower.main(["--variants=softmx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: unknown platform gpu2") and err[1].startswith("error: unknown variant softmx")
    assert lower.main(["--variants=softmax", "--tasks=listops", "--config.attention.mode=random"]) == 2
    assert capsys.readouterr().err.startswith("error: softmax's config: unknown config key --config.attention.mode")


@pytest.mark.slow
def test_a_config_override_reaches_the_lowered_step(capsys):
    """synthesizer's random mode (a learned n x n matrix) has no kernel: --config.attention.mode=random
    takes its cuda step from the Triton kernel (the dense mode's) to XLA."""
    argv = ["--platforms=cuda", "--variants=synthesizer", "--tasks=listops", "--scale=mini"]
    assert lower.main(argv) == 0 and lower.main([*argv, "--config.attention.mode=random"]) == 0
    dense, random = [line for line in capsys.readouterr().out.splitlines() if line.startswith("synthesizer")]
    assert kernels.TRITON in dense and kernels.TRITON not in random and "xla" in random


@pytest.mark.slow
def test_command_prints_a_row_per_combination_and_exits_0(capsys):
    assert lower.main(["--platforms=cuda,tpu", "--variants=linformer", "--tasks=retrieval", "--scale=mini"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert [row.split()[:4] for row in rows[1:3]] == [["linformer", "retrieval", "cuda", "ok"],
                                                      ["linformer", "retrieval", "tpu", "ok"]]
    assert rows[-1].startswith("2/2 lowered (mini scale)")
