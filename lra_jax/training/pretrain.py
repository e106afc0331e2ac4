"""Self-pretraining (SPT, Amos, Berant and Gupta 2024): a denoising stage on the task's own training
split before the classifier is trained, run by `trainer.train_and_evaluate` when
`config.pretrain.objective` is not "none" (docs/self-pretraining.md).

Objectives, over the real tokens of an int[b n] (or [b 2 n]) batch; padding (id 0) is never
corrupted nor predicted:

    masked  BERT's (Devlin et al. 2019 §3.1): each real token is chosen with probability
            `mask_rate`; a chosen token becomes [MASK] (80%), a random real token (10%) or
            stays (10%); loss = mean over chosen positions of -log p(x_i | corrupted x).
            Pixels are the tokens of Image and Pathfinder, as they are the classifier's.
    causal  next-token prediction: loss = mean over real targets of -log p(x_{i+1} | x_{<=i});
            only for a model whose every layer is causal (attention.causal=True on the variants
            that take it, or S4D with bidirectional=False; `config.settings.check_pretrain`
            refuses the others).

Randomness: the step's key (fold_in(dropout key, step), then the micro-batch index) is split into
the masking key and the dropout key, so a resumed stage draws the same masks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lra_jax.config.settings import Settings
from lra_jax.models.pretraining import build_token_predictor, mask_id
from lra_jax.training.train_state import TrainState

STAGE_DIR = "pretrain"  # the stage's checkpoints, metrics and record, inside the run's workdir
# The stage's record: not results.json, which the commands that collect runs (selection, the chart)
# read as a run's; the run's own results.json holds it too, under "pretrain".
STAGE_RECORD = "stage.json"


def mask_tokens(key: jax.Array, tokens: jax.Array, rate: float, vocab_size: int) -> tuple[jax.Array, jax.Array]:
    """BERT corruption of int tokens[...] -> (corrupted tokens[...], chosen bool[...]).

    Chosen ~ Bernoulli(rate) on real tokens only; of those 80% -> mask_id(vocab_size), 10% -> a token
    drawn uniformly from the real ids 1 .. vocab_size - 1, 10% unchanged."""
    choose_key, kind_key, random_key = jax.random.split(key, 3)
    chosen = jax.random.bernoulli(choose_key, rate, tokens.shape) & (tokens != 0)
    kind = jax.random.uniform(kind_key, tokens.shape)
    random_tokens = jax.random.randint(random_key, tokens.shape, 1, vocab_size, tokens.dtype)
    corrupted = jnp.where(kind < 0.8, mask_id(vocab_size), jnp.where(kind < 0.9, random_tokens, tokens))
    return jnp.where(chosen, corrupted, tokens), chosen


def token_loss(logits: jax.Array, targets: jax.Array, weight: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy and accuracy over the positions of weight 1 (0 when there is none)."""
    weight = weight.astype(jnp.float32)
    count = jnp.maximum(weight.sum(), 1.0)
    loss = (optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weight).sum() / count
    accuracy = ((jnp.argmax(logits, -1) == targets) * weight).sum() / count
    return loss, accuracy


def make_objective(settings: Settings, vocab_size: int):
    """(model, batch, key) -> (loss, accuracy) of `settings.pretrain.objective`, for `steps.make_train_step`."""
    p = settings.pretrain

    def masked(model, batch, key):
        mask_key, dropout_key = jax.random.split(key)
        tokens = batch["inputs"]
        corrupted, chosen = mask_tokens(mask_key, tokens, p.mask_rate, vocab_size)
        logits = model(corrupted, deterministic=False, rngs=nnx.Rngs(dropout_key))
        return token_loss(logits, tokens, chosen)

    def causal(model, batch, key):
        tokens = batch["inputs"]
        logits = model(tokens, deterministic=False, rngs=nnx.Rngs(key))
        targets = tokens[..., 1:]
        return token_loss(logits[..., :-1, :], targets, targets != 0)

    return {"masked": masked, "causal": causal}[p.objective]


def build_model(settings: Settings, task) -> Any:
    """key -> the pretraining model (`models.pretraining.TokenPredictor`) of `settings` for `task`."""
    return lambda key: build_token_predictor(settings, vocab_size=task.vocab_size, rngs=nnx.Rngs(key))


def transfer_encoder(pretrained: TrainState, state: TrainState) -> TrainState:
    """The fine-tuning state `state` with its encoder's parameters and state taken from the pretraining
    state `pretrained`; the classifier head stays as initialised, the step is 0 and the optimizer
    state is `state`'s (fresh)."""
    params, rest = state.params, state.rest
    params["encoder"] = pretrained.params["encoder"]
    if "encoder" in rest:
        rest["encoder"] = pretrained.rest["encoder"]
    return state.replace(params=params, rest=rest)


def stage_record(settings: Settings, step: int, steps_per_second: float | None, last_loss: float | None,
                 num_parameters: int) -> dict[str, Any]:
    """The pretraining stage's record, `STAGE_RECORD` (and "pretrain" in the run's results.json):
    what it ran and its compute, reported apart from the fine-tuning budget."""
    p = settings.pretrain
    return {
        "status": "complete",
        "objective": p.objective,
        "num_steps": step,
        "mask_rate": p.mask_rate if p.objective == "masked" else None,
        "learning_rate": settings.pretrain_optimizer.learning_rate,
        "warmup_steps": p.warmup_steps,
        "batch_size": settings.batch_size,
        "examples_seen": step * settings.batch_size,
        "steps_per_second": steps_per_second,
        "seconds": step / steps_per_second if steps_per_second else None,
        "final_train_loss": last_loss,
        "num_parameters": int(num_parameters),
        "split": "train",
    }
