"""A run's initial train state: its random streams, the model and optimizer built and initialised on the
mesh, and the attention settings the model was built with.

Shared by the trainer and the commands that compile or time a train step without training
(`lra_jax.measure.step_timing`, `lra_jax.tools.throughput`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lra_jax.attention import registry
from lra_jax.config.settings import Settings
from lra_jax.data import tasks
from lra_jax.models.classifier import build_model
from lra_jax.training import optimizer, pretrain
from lra_jax.training.train_state import TrainState

# The run's random streams, each the seed's key folded with its number (fixed: a resumed run draws the same).
STREAMS = {"init": 0, "dropout": 1, "pretrain_init": 2, "pretrain": 3}


def run_key(config: Settings, stream: str) -> jax.Array:
    """The key of the run's random stream `stream` (`STREAMS`): "dropout" is fine-tuning's (folded with
    the step), "pretrain" the pretraining stage's masks and dropout, "*init" the models' parameters."""
    return jax.random.fold_in(jax.random.key(config.seed), STREAMS[stream])


def create_train_state(config: Settings, task: tasks.TaskSpec, mesh: Mesh, *, pretraining: bool = False):
    """Builds the model and optimizer; returns (graphdef, optimizer, state replicated on `mesh`).

    state: a `TrainState` (step, params, rest, opt_state).
    `pretraining`: the pretraining stage's model (`models.pretraining.TokenPredictor`) and optimizer
    (`Settings.pretrain_optimizer`) instead of the classifier's. A run that pretrains gives its
    classifier the [MASK] id too, so that the pretrained encoder fits it.
    Initialisation is jitted: one compilation instead of many small eager ones. The caller has checked
    that the batch splits over the mesh (`config.settings.check_devices`, once per command).
    """
    stream = "pretrain_init" if pretraining else "init"
    if pretraining:
        build = pretrain.build_model(config, task)
    else:
        vocab_size = task.vocab_size + int(config.pretrain.objective != "none")
        build = lambda key: build_model(config, vocab_size=vocab_size,  # noqa: E731
                                        num_classes=task.num_classes, rngs=nnx.Rngs(key), dual=task.dual)
    # configuration errors surface here, before any compilation
    graphdef = nnx.split(nnx.eval_shape(build, run_key(config, stream)), nnx.Param, ...)[0]
    tx = optimizer.make_optimizer(config.pretrain_optimizer if pretraining else config.optimizer)

    def init():  # the key is made inside: a process-local array cannot enter a multi-process program
        _, params, rest = nnx.split(build(run_key(config, stream)), nnx.Param, ...)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, rest=rest, opt_state=tx.init(params))

    return graphdef, tx, jax.jit(init, out_shardings=NamedSharding(mesh, PartitionSpec()))()


def attention_settings(graphdef: nnx.GraphDef, state: TrainState) -> dict[str, Any]:
    """The settings the model's attention layers were built with, defaults and derived values
    included (`registry.layer_settings`): what ran, where the config may say None; under
    "kernels", the kernel each attention layer runs (`registry.layer_kernels`)."""
    model = nnx.merge(graphdef, state.params, state.rest)
    return {**registry.layer_settings(model), "kernels": registry.layer_kernels(model)}
