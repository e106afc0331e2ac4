"""Causal layers (`causal=True`, or `bidirectional=False` for the mixers), the condition of next-token
pretraining: position i mixes positions <= i only. That no output has a nonzero derivative with respect to a
later input is checked for every causal form with the other declared patterns (tests/attention/test_patterns.py);
here: against references (softmax over the earlier keys, kernelized prefix sums), under the attention
contract's padding rules, on the kernels, and at the config boundary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import assert_close, build_small, reassociation_tol, tiny_config
from lra_jax import kernels
from lra_jax.attention import registry
from lra_jax.attention.kernelized import feature_maps
from lra_jax.attention.core import causal_variants
from lra_jax.config import settings as config_settings
from lra_jax.errors import ConfigError

DIM, HEADS, N, CUT = 16, 2, 20, 9
TOL = reassociation_tol(N, depth=8)
CAUSAL = causal_variants()


def build(name, **settings):
    return build_small(name, dim=DIM, num_heads=HEADS, seed=0, max_len=N, causal=True, **settings)


def tokens(seed, n=N):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((2, n, DIM)), jnp.float32)


@nnx.jit
def forward(model, x, mask):
    return model(x, mask, deterministic=True)


def test_the_causal_variants_are_those_with_a_weight_per_pair_a_causal_band_or_a_kernelized_sum():
    assert CAUSAL == ["additive", "linear", "local", "luong", "softmax", "strided", "synthesizer", "taylor"]


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.slow
@pytest.mark.every_variant("name")
def test_a_causal_layer_keeps_the_padding_contract(name):
    model = build(name)
    x = tokens(2)
    mask = jnp.arange(N)[None, :] < jnp.array([[13], [0]])  # ragged, and a row of padding alone
    out = forward(model, x, mask)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out)[~np.asarray(mask)], 0.0)
    x_other = jnp.where(mask[..., None], x, 100.0 * tokens(3))
    assert_close(forward(model, x_other, mask)[0, :13], out[0, :13], TOL)
    grad = jax.grad(lambda x: jnp.sum(model(x, mask, deterministic=True) ** 2))(x)
    assert np.isfinite(np.asarray(grad)).all()


def pattern_softmax_reference(model, x, lengths, allowed, heads=HEADS):
    """The layer's output with, per head h, query i's softmax over the real keys j with allowed(h, i, j),
    computed one query at a time in float64 (padded queries: 0)."""
    q, k, v = (np.asarray(getattr(model, p)(x), np.float64).reshape(2, N, heads, -1) for p in ("query", "key", "value"))
    mixed = np.zeros_like(q)
    for b in range(2):
        for i in range(lengths[b]):
            for h in range(heads):
                keys = [j for j in range(lengths[b]) if allowed(h, i, j)]
                logits = q[b, i, h] @ k[b, keys, h].T / np.sqrt(q.shape[-1])
                weights = np.exp(logits - logits.max())
                mixed[b, i, h] = weights / weights.sum() @ v[b, keys, h]
    expected = np.array(model.out(jnp.asarray(mixed.reshape(2, N, DIM), jnp.float32)))
    expected[np.arange(N)[None, :] >= lengths[:, None]] = 0
    return expected


WINDOW, STRIDE = 3, 4  # tests/helpers.SMALL: several blocks at N = 20
PATTERNS = {
    "softmax": lambda h, i, j: j <= i,
    "local": lambda h, i, j: i - WINDOW <= j <= i,
    # heads 0 .. h//2 - 1 local (i's block), the others strided (i's residue), both up to i
    "strided": lambda h, i, j: j <= i and (j // STRIDE == i // STRIDE if h < HEADS // 2 else (i - j) % STRIDE == 0),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_causal_softmax_layers_are_softmax_over_their_earlier_real_keys(name):
    model = build(name)
    x, lengths = tokens(4), np.array([N, 11])
    mask = jnp.arange(N)[None, :] < lengths[:, None]
    assert_close(forward(model, x, mask), pattern_softmax_reference(model, x, lengths, PATTERNS[name]), TOL)


def test_causal_single_head_strided_is_one_softmax_over_block_and_residue_up_to_i():
    model = build_small("strided", dim=DIM, num_heads=1, seed=0, max_len=N, causal=True)
    x, lengths = tokens(7), np.array([N, 13])
    mask = jnp.arange(N)[None, :] < lengths[:, None]
    union = lambda h, i, j: j <= i and (j // STRIDE == i // STRIDE or (i - j) % STRIDE == 0)  # noqa: E731
    assert_close(forward(model, x, mask), pattern_softmax_reference(model, x, lengths, union, heads=1), TOL)


def kernel_average_reference(phi_q, phi_k, v):
    """sum_{j<=i} (phi_q_i . phi_k_j) v_j / sum_{j<=i} phi_q_i . phi_k_j in float64, one query at a time
    (0 where the sum of weights is 0)."""
    phi_q, phi_k, v = (np.asarray(t, np.float64) for t in (phi_q, phi_k, v))
    out = np.zeros(v.shape)
    for i in range(v.shape[1]):
        weights = np.einsum("bhm,bjhm->bhj", phi_q[:, i], phi_k[:, : i + 1])
        total = weights.sum(-1)[..., None]
        out[:, i] = np.divide(np.einsum("bhj,bjhd->bhd", weights, v[:, : i + 1]), total,
                              out=np.zeros(out[:, i].shape), where=total > 0)
    return out


@pytest.mark.parametrize("chunk", [1, 6, 20, 64])  # one position, a ragged last chunk, exact, all in one
@pytest.mark.slow
def test_causal_kernel_attention_is_the_prefix_average_in_any_chunking(chunk):
    rng = np.random.default_rng(5)
    phi_q, phi_k = (jnp.asarray(rng.uniform(0.0, 2.0, (2, N, HEADS, 5)), jnp.float32) for _ in range(2))
    phi_k = phi_k.at[1, 7:].set(0.0).at[1, :3].set(0.0)  # no real key before position 3 in row 1
    v = jnp.asarray(rng.standard_normal((2, N, HEADS, 4)), jnp.float32)
    out = feature_maps.causal_kernel_attention(phi_q, phi_k, v, chunk=chunk)
    assert_close(out, kernel_average_reference(phi_q, phi_k, v), TOL)
    np.testing.assert_array_equal(np.asarray(out[1, :3]), 0.0)


@pytest.mark.parametrize("name, features", [("linear", lambda x: feature_maps.elu_features(x)),
                                            ("taylor", lambda x: feature_maps.taylor_features(x, 1.0))])
def test_causal_kernelized_layers_average_over_the_earlier_real_keys(name, features):
    model = build(name)
    x, lengths = tokens(6), np.array([N, 11])
    mask = jnp.arange(N)[None, :] < lengths[:, None]
    q, k, v = (getattr(model, p)(x).reshape(2, N, HEADS, -1) for p in ("query", "key", "value"))
    phi_k = jnp.where(mask[:, :, None, None], features(k), 0.0)
    mixed = kernel_average_reference(features(q), phi_k, v)
    expected = np.array(model.out(jnp.asarray(mixed.reshape(2, N, DIM), jnp.float32)))
    expected[~np.asarray(mask)] = 0
    assert_close(forward(model, x, mask), expected, TOL)


@pytest.mark.parametrize("name", ["softmax", "local", "synthesizer"])
def test_a_causal_attention_layer_runs_its_kernel_with_a_causal_mask(name):
    """The attention ops take causality in their mask: a causal layer on them runs the Pallas kernel (over
    the causal layout), interpreted here on a GPU target, and computes what its XLA form computes."""
    with kernels.target_platform("gpu", interpret=True):
        fused = build(name, impl="pallas")
    plain = build(name, impl="xla")
    assert fused.kernel_plan(deterministic=True).uses_pallas
    x, mask = tokens(3), jnp.arange(N)[None, :] < jnp.array([[N], [CUT]])
    assert_close(forward(fused, x, mask), forward(plain, x, mask), TOL)


@pytest.mark.parametrize("name", ["strided", "linear"])
def test_a_causal_layer_whose_kernel_has_no_causal_form_runs_xla_and_says_why(name):
    with kernels.target_platform("gpu", interpret=False):
        model = build(name, impl="pallas")
    plan = model.kernel_plan(deterministic=True)
    assert not plan.uses_pallas and "causal" in plan.reason


@pytest.mark.parametrize("name", [n for n in registry.names() if n not in CAUSAL])
def test_other_variants_refuse_causal_and_name_those_that_take_it(name):
    with pytest.raises(ConfigError, match=r"no causal form; causal layers are additive \(causal=True\), "
                                          r"gla \(bidirectional=False\), hyena \(bidirectional=False\), linear \(causal=True\), local \(causal=True\), "
                                          r"lru \(bidirectional=False\), luong \(causal=True\), mega \(bidirectional=False\), "
                                          r"s4d \(bidirectional=False\), s5 \(bidirectional=False\), "
                                          r"s6 \(bidirectional=False\), softmax \(causal=True\), ssd \(bidirectional=False\)"):
        build(name)


def causal_config(name="softmax", **attention):
    config = tiny_config("", name, **({} if "bidirectional" in attention else {"causal": True}), **attention)
    config.model.update(pooling="mean", cls_token=False)
    config.pretrain.update(objective="causal", num_steps=3)
    return config


@pytest.mark.parametrize("name, attention", [("softmax", {}), ("additive", {}), ("s4d", {"bidirectional": False}),
                                             ("lru", {"bidirectional": False}), ("s5", {"bidirectional": False}),
                                             ("s6", {"bidirectional": False}), ("gla", {"bidirectional": False}),
                                             ("ssd", {"bidirectional": False}), ("hyena", {"bidirectional": False}),
                                             ("mega", {"bidirectional": False})])
def test_next_token_pretraining_is_accepted_for_causal_layers(name, attention):
    assert config_settings.from_config(causal_config(name, **attention)).pretrain.objective == "causal"


def test_next_token_pretraining_is_refused_without_a_causal_layer():
    config = causal_config()
    config.attention.causal = False
    with pytest.raises(ConfigError, match="causal needs a causal layer, --config.attention.causal=True"):
        config_settings.from_config(config)


def test_cls_pooling_is_refused_with_a_causal_layer():
    config = causal_config()
    config.model.update(pooling="cls", cls_token=True)
    with pytest.raises(ConfigError, match="CLS token in front sees only itself"):
        config_settings.from_config(config)


BIDIRECTIONAL = [n for n in registry.names() if registry.get(n).causal_form() == "bidirectional=False"]


def test_the_bidirectional_mixers_are_those_of_the_zoo():
    assert set(BIDIRECTIONAL) == {"s4d", "s5", "lru", "s6", "ssd", "gla", "hyena", "mega"}
