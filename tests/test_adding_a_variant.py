"""Adding a variant with a kernel path takes one class and one config file (README, "Adding a variant").

The class below is written as a contributor would write it outside the package: registered with
`@register`, naming its kernel op once (`kernel_op = FLASH`) and passing its layer's plan to the op.
The config file is written to tmp_path. The test builds the model from that file, runs it on the
Triton kernel in the Pallas interpreter, checks it against its own XLA form and the contract's
padding rules, and reads back the kernel the layer recorded.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close
from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.attention.core import Attention
from lra_jax.config import paths
from lra_jax.config.settings import from_config
from lra_jax.kernels.flash.api import FLASH, flash_attention
from lra_jax.kernels.linear.api import LINEAR
from lra_jax.kernels.masking import Mask
from lra_jax.models.classifier import build_model

CONFIG_FILE = '''"""Tempered softmax attention on an LRA task."""

from lra_jax.config import task_defaults


def get_config(arg=None):
    return task_defaults.get_config(arg, attention=dict(name="tempered_softmax", temperature=2.0, impl="pallas"))
'''


@pytest.fixture
def tempered_softmax(monkeypatch):
    """The contributor's class, registered for this test only (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "_VARIANTS", dict(registry._VARIANTS))

    @registry.register("tempered_softmax")
    class TemperedSoftmaxAttention(Attention):
        """softmax(q k^T / (temperature sqrt(d))) v over the real keys."""

        kernel_op = FLASH

        def __init__(self, dim: int, num_heads: int, *, temperature: float = 1.0, rngs: nnx.Rngs, **common):
            super().__init__(dim, num_heads, rngs=rngs, **common)
            self.temperature = temperature

        def attend(self, q, k, v, mask, *, deterministic: bool, rngs: nnx.Rngs | None):
            scale = 1.0 / (self.temperature * q.shape[-1] ** 0.5)
            plan = self.kernel_plan(deterministic)
            if plan.uses_pallas:
                return flash_attention(q, k, v, Mask(key_mask=mask), scale=scale, plan=plan,
                                       **self.kernel_dropout(plan, rngs))
            logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
            return self.weighted_values(logits, v, mask, deterministic=deterministic, rngs=rngs)

    return TemperedSoftmaxAttention


def build_from_file(tmp_path, **overrides):
    path = tmp_path / "tempered_softmax.py"
    path.write_text(CONFIG_FILE)
    config = paths.load(f"{path}:listops,mini")
    config.attention.update(overrides)
    return config, build_model(from_config(config), vocab_size=20, num_classes=10, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_a_new_variant_runs_its_kernel_from_one_class_and_one_config_file(tempered_softmax, tmp_path):
    with kernels.target_platform("gpu", interpret=True):
        config, model = build_from_file(tmp_path)
    _, on_xla = build_from_file(tmp_path, impl="xla")
    assert config.attention.name == "tempered_softmax"
    recorded = registry.layer_kernels(model)
    assert recorded and all(entry["eval"] == entry["train"] == kernels.TRITON for entry in recorded), recorded
    assert all(entry["interpreted"] for entry in recorded)
    assert registry.layer_settings(model)["temperature"] == 2.0

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, 20, (2, 24)), jnp.int32)
    mask = jnp.arange(24)[None, :] < jnp.array([[24], [15]])
    tokens = jnp.where(mask, tokens, 0)
    layer = next(node for _, node in nnx.iter_graph(model) if isinstance(node, tempered_softmax))
    assert layer.kernel_plan(deterministic=True).implementation is FLASH[kernels.TRITON]
    assert_close(np.asarray(model(tokens, deterministic=True)), np.asarray(on_xla(tokens, deterministic=True)),
                 1e-4, "the kernel against the variant's XLA form")


@pytest.mark.slow
def test_the_new_variant_meets_the_contract_on_its_kernel(tempered_softmax):
    """Padded outputs are zero and finite; real outputs ignore padding content and trailing padding;
    the kernel applies the attention dropout in training."""
    with kernels.target_platform("gpu", interpret=True):
        layer = registry.build("tempered_softmax", dim=16, num_heads=2, rngs=nnx.Rngs(0), temperature=0.5,
                               dropout_rate=0.2, impl="pallas")
    assert layer.kernel_plan(deterministic=False).dropout
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 20, 16)), jnp.float32)
    mask = jnp.arange(20)[None, :] < jnp.array([[20], [11]])
    out = np.asarray(layer(x, mask, deterministic=True))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[~np.asarray(mask)], 0.0)
    other = np.asarray(layer(jnp.where(mask[..., None], x, 40.0), mask, deterministic=True))
    assert_close(other[np.asarray(mask)], out[np.asarray(mask)], 1e-5, "padding content")
    longer = np.asarray(layer(jnp.pad(x, ((0, 0), (0, 9), (0, 0))), jnp.pad(mask, ((0, 0), (0, 9))),
                              deterministic=True))[:, :20]
    assert_close(longer[np.asarray(mask)], out[np.asarray(mask)], 1e-5, "trailing padding")
    train = lambda seed: np.asarray(layer(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=seed)))  # noqa: E731
    np.testing.assert_array_equal(train(3), train(3))
    assert not np.allclose(train(3), train(4))
    assert np.isfinite(train(3)).all()


def test_a_plan_made_for_another_op_is_refused():
    """The op runs the implementation its plan names, and only one of its own."""
    q = jnp.ones((1, 8, 1, 16), jnp.float32)
    plan = kernels.plan("pallas", kernels.Target("gpu", interpret=True), LINEAR)
    with pytest.raises(ValueError, match="not an implementation of the flash op"):
        flash_attention(q, q, q, plan=plan)
