"""The masked-token objective under the attention contract, for every registered variant: the
pretraining model's outputs at real tokens, and so its loss, do not depend on the padding, and both
are finite even with a row of padding alone (the layers' gradients there: test_attention_contract).
Next-token prediction: a causal model's output at position i does not depend on the tokens after i."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import SMALL, assert_close, reassociation_tol, slow_except

from lra_jax.attention import registry
from lra_jax.attention.core import causal_variants
from lra_jax.config import task_defaults as base
from lra_jax.config.settings import from_config
from lra_jax.models.pretraining import build_token_predictor
from lra_jax.training import pretrain

VOCAB, N, EXTRA = 18, 24, 16


def small_settings(name, **attention):
    config = base.get_config("listops,mini", attention=dict(name=name, **SMALL.get(name, {}), **attention))
    config.model.update(num_layers=1, num_heads=2, emb_dim=16, mlp_dim=32)  # tiny: seconds for every variant
    if attention:  # the causal forms: no CLS token in front, where it would see only itself (settings.check)
        config.model.update(pooling="mean", cls_token=False)
    config.max_len = N + EXTRA
    return from_config(config)


def tokens_with_padding(lengths, total=N):
    tokens = np.random.default_rng(0).integers(1, VOCAB, size=(len(lengths), total))
    tokens[np.arange(total)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return jnp.asarray(tokens, jnp.int32)


@nnx.jit
def masked_step(model, tokens):
    """The masked objective on `tokens` [b N] and on the same rows with EXTRA more padding:
    (loss, logits, loss with the padding appended, its logits at the first N positions)."""
    corrupted, chosen = pretrain.mask_tokens(jax.random.key(1), tokens, 0.3, VOCAB)

    def loss(model, corrupted, tokens, chosen):
        return pretrain.token_loss(model(corrupted, deterministic=True), tokens, chosen)[0]

    pad = lambda x: jnp.pad(x, ((0, 0), (0, EXTRA)))  # noqa: E731
    return (loss(model, corrupted, tokens, chosen), model(corrupted, deterministic=True),
            loss(model, pad(corrupted), pad(tokens), pad(chosen)), model(pad(corrupted), deterministic=True)[:, :N])


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.every_variant("name")
@pytest.mark.slow
def test_masked_objective_respects_padding(name):
    model = build_token_predictor(small_settings(name), vocab_size=VOCAB, rngs=nnx.Rngs(0))
    tokens = tokens_with_padding([7, N, 0, 15])  # ragged, none, a row of padding alone
    loss, logits, long_loss, long_logits = masked_step(model, tokens)
    assert np.isfinite(float(loss)) and np.isfinite(np.asarray(logits)).all()
    if not registry.get(name).length_invariant:
        pytest.skip(f"{name} depends on the padded length by construction (see its docstring)")
    real = np.asarray(tokens != 0)[..., None]
    # Another padded length reorders float32 sums over <= N + EXTRA positions in one layer.
    tol = reassociation_tol(N + EXTRA + 1, depth=12)
    assert_close(np.where(real, long_logits, 0), np.where(real, logits, 0), tol)
    assert float(long_loss) == pytest.approx(float(loss), rel=tol, abs=tol)


@pytest.mark.parametrize("name, causal", slow_except(
    [(name, dict(bidirectional=False)) for name in ("s4d", "lru", "s5", "s6", "gla", "ssd", "hyena", "mega")]
    + [(name, dict(causal=True)) for name in causal_variants()], keep={"softmax"}))
@pytest.mark.every_variant("name")
def test_a_causal_model_sees_no_later_token(name, causal):
    model = build_token_predictor(small_settings(name, **causal), vocab_size=VOCAB, rngs=nnx.Rngs(0))
    tokens = tokens_with_padding([N, N])
    changed = tokens.at[:, 12:].set((tokens[:, 12:] % (VOCAB - 1)) + 1)  # every later token changed
    forward = nnx.jit(lambda model, t: model(t, deterministic=True))
    before, after = forward(model, tokens), forward(model, changed)
    assert_close(after[:, :12], before[:, :12], reassociation_tol(N + 1, depth=12))
    assert np.abs(np.asarray(after[:, 12:] - before[:, 12:])).max() > 1e-3  # they do see the changed ones
