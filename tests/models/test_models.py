"""The shared encoder, pooling and classifier."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import F32_EPS, SMALL, assert_close, reassociation_tol, slow_except

from lra_jax.attention import registry
from lra_jax.config import task_defaults as base
from lra_jax.config.settings import from_config
from lra_jax.errors import ConfigError
from lra_jax.models.classifier import build_model
from lra_jax.models.encoder import sinusoidal_positions
from lra_jax.models.heads import pool


def small_config(name, positions="learned", pooling="cls"):
    config = base.get_config("listops,mini", attention=dict(name=name, **SMALL.get(name, {})))
    config.max_len = 40
    config.model.update(num_layers=2, num_heads=2, emb_dim=16, mlp_dim=32, positions=positions,
                        pooling=pooling, cls_token=pooling == "cls")
    return config


def tokens_with_padding(lengths, total):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 18, size=(len(lengths), total))
    tokens[np.arange(total)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return jnp.asarray(tokens, jnp.int32)


@nnx.jit
def logits(model, tokens):
    return model(tokens, deterministic=True)


def check_padding_length_invariance(name, positions="learned", pooling="cls"):
    settings = from_config(small_config(name, positions, pooling))
    model = build_model(settings, vocab_size=18, num_classes=10, rngs=nnx.Rngs(0))
    short = tokens_with_padding([7, 20, 24], 24)
    long = jnp.pad(short, ((0, 0), (0, 16)))
    # Another padded length reorders float32 sums over <= 41 positions and 32 features in each of
    # 2 layers (~6 reductions each): 6e-5 of the logits' scale. Padding that leaks moves them by O(1).
    assert_close(logits(model, long), logits(model, short), reassociation_tol(41, depth=12))


@pytest.mark.parametrize("name", slow_except(registry.names(), keep={"softmax"}))
@pytest.mark.every_variant("name")
def test_logits_do_not_depend_on_the_padded_length(name):
    if not registry.get(name).length_invariant:
        pytest.skip(f"{name} depends on the padded length by construction (see its docstring)")
    check_padding_length_invariance(name)


@pytest.mark.parametrize("positions,pooling", [("sinusoidal", "mean"), ("learned", "max")])
@pytest.mark.slow
def test_padding_invariance_holds_for_every_position_and_pooling_choice(positions, pooling):
    check_padding_length_invariance("linformer", positions, pooling)


def test_pooling_ignores_padding_and_all_padding_rows_give_zeros():
    x = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3) - 20
    mask = jnp.array([[True, True, False, False], [False] * 4])
    # Exact: means and maxima of two small integers.
    np.testing.assert_allclose(pool(x, mask, "mean")[0], x[0, :2].mean(0))
    np.testing.assert_allclose(pool(x, mask, "max")[0], x[0, :2].max(0))
    np.testing.assert_allclose(pool(x, mask, "cls")[0], x[0, 0])
    np.testing.assert_array_equal(pool(x, mask, "mean")[1], 0)
    np.testing.assert_array_equal(pool(x, mask, "max")[1], 0)


def test_sinusoidal_table_matches_the_formula():
    table = sinusoidal_positions(50, 8)
    p, i = 17, 2  # float32 sin/cos of a float32 angle near 1: a few eps, rtol ~8 eps
    np.testing.assert_allclose(table[p, 2 * i], np.sin(p / 10000 ** (2 * i / 8)), rtol=8 * F32_EPS)
    np.testing.assert_allclose(table[p, 2 * i + 1], np.cos(p / 10000 ** (2 * i / 8)), rtol=8 * F32_EPS)


@pytest.mark.slow
def test_bfloat16_model_gives_finite_float32_logits():
    config = small_config("softmax")
    config.model.dtype = "bfloat16"
    model = build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0))
    logits = model(tokens_with_padding([5, 9], 12), deterministic=True)
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


@pytest.mark.slow
def test_dropout_is_keyed_by_the_given_rngs():
    config = small_config("softmax")
    config.model.update(dropout_rate=0.1, attention_dropout_rate=0.1)
    model = build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0))
    tokens = tokens_with_padding([5, 9], 12)
    a = model(tokens, deterministic=False, rngs=nnx.Rngs(1))
    b = model(tokens, deterministic=False, rngs=nnx.Rngs(1))
    c = model(tokens, deterministic=False, rngs=nnx.Rngs(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("field,value,choices", [
    ("pooling", "median", "cls, mean, max"),
    ("positions", "rotary", "learned, sinusoidal"),
    ("dtype", "float16", "float32, bfloat16"),
])
def test_bad_model_settings_name_the_choices_before_a_model_is_built(field, value, choices):
    config = small_config("softmax")
    config.model[field] = value
    with pytest.raises(ConfigError, match=f"model.{field}='{value}' is out of range: it must be one of {choices}"):
        from_config(config)


def test_cls_pooling_without_cls_token_is_refused():
    config = small_config("softmax")
    config.model.cls_token = False
    with pytest.raises(ConfigError, match="cls_token"):
        from_config(config)


def test_unknown_variant_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known variants: .*softmax"):
        build_model(from_config(small_config("flash")), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", ["softmax", "performer"])
@pytest.mark.slow
def test_scanned_and_rematerialised_layers_compute_the_same_function(name):
    """Same parameters and dropout keys: a Python loop of blocks, lax.scan, and scan + remat agree."""
    config = small_config(name)
    config.model.update(dropout_rate=0.1, attention_dropout_rate=0.1)
    looped = build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0))
    config.model.update(scan_layers=True, remat=True)
    scanned = build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(1))
    stacked = jax.tree.map(lambda *layers: jnp.stack(layers), *[nnx.state(b) for b in looped.encoder.blocks])
    nnx.update(scanned.encoder.blocks, stacked)
    for part in ("embed", "final_norm"):
        nnx.update(getattr(scanned.encoder, part), nnx.state(getattr(looped.encoder, part)))
    scanned.encoder.positions[...] = looped.encoder.positions[...]
    scanned.encoder.cls[...] = looped.encoder.cls[...]
    nnx.update(scanned.head, nnx.state(looped.head))
    tokens = tokens_with_padding([5, 12], 14)

    def loss(model):
        return jnp.sum(model(tokens, deterministic=False, rngs=nnx.Rngs(3)) ** 2)

    # A scan (and remat's recomputation) may fuse and order the float32 sums differently from the
    # loop: 2 layers of ~6 reductions over <= 32 terms forward, as many again backward. Errors
    # are taken against each quantity's largest entry: a gradient entry near zero (one of 512 was
    # 1.6e-6 off, 3e-4 relative, on another machine) carries the rounding of the large terms
    # that cancelled in it. A wrong layer order or dropout key changes everything by O(1).
    forward_tol, backward_tol = reassociation_tol(32, depth=12), reassociation_tol(32, depth=24)
    assert_close(logits(scanned, tokens), logits(looped, tokens), forward_tol)
    loss_and_grads = nnx.jit(nnx.value_and_grad(loss))
    loss_looped, grads_looped = loss_and_grads(looped)
    loss_scanned, grads_scanned = loss_and_grads(scanned)
    assert_close(loss_scanned, loss_looped, forward_tol)
    stacked_grads = jnp.stack([g["attention"]["query"]["kernel"][...] for g in grads_looped["encoder"]["blocks"].values()])
    assert_close(grads_scanned["encoder"]["blocks"]["attention"]["query"]["kernel"][...], stacked_grads, backward_tol)


@pytest.mark.slow
def test_dual_encoder_encodes_both_documents_with_the_one_encoder():
    config = small_config("softmax", pooling="mean")
    model = build_model(from_config(config), vocab_size=18, num_classes=2, rngs=nnx.Rngs(0), dual=True)
    first, second = tokens_with_padding([7, 20, 24], 24), tokens_with_padding([24, 3, 11], 24)[:, ::-1]
    logits = jax.jit(lambda t: model(t, deterministic=True))(jnp.stack([first, second], axis=1))
    assert logits.shape == (3, 2) and logits.dtype == jnp.float32

    def pooled(tokens):
        features, mask = model.encoder(tokens, deterministic=True)
        return pool(features, mask, "mean")

    u, v = pooled(first), pooled(second)
    expected = model.head(jnp.concatenate([u, v, u * v, u - v], axis=-1))
    # The same float32 sums, jitted as one program vs. run eagerly in pieces: 1 layer, widths <= 32.
    assert_close(np.asarray(logits), np.asarray(expected), reassociation_tol(32, depth=8))
    swapped = model(jnp.stack([second, first], axis=1), deterministic=True)
    assert not np.allclose(np.asarray(swapped), np.asarray(logits))  # u - v makes the head order-aware


@pytest.mark.parametrize("scan_layers", [False, True])
def test_layer_settings_read_the_built_values_from_a_model(scan_layers):
    """What a run records as its attention: the values left to the variant (None, or absent) filled in."""
    from lra_jax.attention.additive import default_query_chunk

    config = small_config("additive")  # query_chunk left to the backend's default
    config.model.scan_layers = scan_layers
    model = nnx.eval_shape(lambda: build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0)))
    settings = registry.layer_settings(model)
    assert settings["name"] == "additive" and settings["query_chunk"] == default_query_chunk() == 1  # CPU
    assert settings["max_len"] == 41 and settings["dtype"] == "float32"  # 40 tokens + the CLS token

    config = small_config("reformer")
    with config.unlocked():
        del config.attention["num_buckets"]  # derived from max_len and chunk_size
    model = nnx.eval_shape(lambda: build_model(from_config(config), vocab_size=18, num_classes=10, rngs=nnx.Rngs(0)))
    assert registry.layer_settings(model)["num_buckets"] == 12  # 2 * ceil(41 / (2 * 4))
