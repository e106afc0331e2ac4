"""The one dispatch point: `kernels.plan` over each op's table picks the implementation the op then runs."""

from __future__ import annotations

import pytest

from lra_jax import kernels
from lra_jax.kernels import MOSAIC_BLOCK_SPARSE, MOSAIC_FLASH, SPLASH, TRITON, XLA, Target
from lra_jax.kernels.block_sparse.api import BLOCK_SPARSE
from lra_jax.kernels.flash.api import FLASH
from lra_jax.kernels.linear.api import LINEAR


@pytest.mark.parametrize("op,platform,dropout,want", [
    (FLASH, "gpu", False, TRITON), (FLASH, "gpu", True, TRITON),
    (FLASH, "tpu", False, SPLASH), (FLASH, "tpu", True, MOSAIC_FLASH),
    (BLOCK_SPARSE, "tpu", False, SPLASH), (BLOCK_SPARSE, "tpu", True, MOSAIC_BLOCK_SPARSE),
    (LINEAR, "gpu", False, TRITON), (FLASH, "cpu", False, TRITON),
])
def test_pallas_plans_the_table_entry_for_the_target(op, platform, dropout, want):
    plan = kernels.plan("pallas", Target(platform, interpret=True), op, dropout_active=dropout)
    assert plan.implementation is op[want] and plan.reason is None
    assert plan.dropout == dropout and plan.interpret


def test_xla_where_the_table_has_no_kernel_or_the_kernel_lacks_what_the_call_needs():
    gpu = Target("gpu", interpret=False)
    assert kernels.plan("auto", Target("cpu", interpret=True), FLASH).kernel == XLA
    assert kernels.plan("xla", gpu, FLASH).implementation is FLASH.xla
    no_tpu = kernels.plan("pallas", Target("tpu", interpret=False), LINEAR)
    assert no_tpu.kernel == XLA and "no mosaic kernel" in no_tpu.reason
    dropout = kernels.plan("pallas", gpu, LINEAR, dropout_active=True)
    assert dropout.kernel == XLA and "dropout" in dropout.reason
    float16 = kernels.plan("pallas", gpu, FLASH, dtype="float16")
    assert float16.kernel == XLA and "float16" in float16.reason
    limited = kernels.plan("pallas", gpu, FLASH, unsupported="a setting the kernel lacks")
    assert limited.kernel == XLA and limited.reason == "a setting the kernel lacks"


def test_a_table_starts_with_its_xla_form():
    with pytest.raises(ValueError, match="XLA form"):
        kernels.KernelOp("broken", (FLASH[TRITON],))
