"""The optimizer and its learning-rate schedules: LRA's AdamW recipe, built from `OptimizerSettings`.

`make_optimizer(settings.optimizer)` is shared by the trainer and by the commands that compile a
train step without running it (`lra_jax.tools.compile`, `lower`). Every function takes the typed,
checked `OptimizerSettings` (`lra_jax.config.settings` reads them from a config).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lra_jax.attention.core import SSMParam
from lra_jax.config.settings import OptimizerSettings


def lra_schedule(learning_rate: float, warmup_steps: int) -> optax.Schedule:
    """LRA's "constant * linear_warmup * rsqrt_decay": lr * min(1, s/w) / sqrt(max(s, w))."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warmup = jnp.minimum(1.0, step / max(warmup_steps, 1))
        return learning_rate * warmup * jax.lax.rsqrt(jnp.maximum(step, max(warmup_steps, 1)))

    return schedule


def cosine_schedule(learning_rate: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
    """LRA's image tasks, "constant * linear_warmup * cosine_decay":
    lr * min(1, s/w) * (1 + cos(pi * p)) / 2 with p = max(0, s - w) / total_steps."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warmup = jnp.minimum(1.0, step / max(warmup_steps, 1))
        progress = jnp.clip(jnp.maximum(step - warmup_steps, 0.0) / max(total_steps, 1), 0.0, 1.0)
        return learning_rate * warmup * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))

    return schedule


def make_schedule(opt: OptimizerSettings, learning_rate: float | None = None) -> optax.Schedule:
    """The learning-rate schedule `optimizer.schedule` names, at `learning_rate`
    (default `optimizer.learning_rate`)."""
    rate = opt.learning_rate if learning_rate is None else learning_rate
    if opt.schedule == "rsqrt":
        return lra_schedule(rate, opt.warmup_steps)
    return cosine_schedule(rate, opt.warmup_steps, opt.total_steps)


def peak_learning_rate(opt: OptimizerSettings) -> float:
    """The largest rate the schedule reaches: lr / sqrt(warm-up) for rsqrt, lr for cosine."""
    return opt.learning_rate / math.sqrt(max(opt.warmup_steps, 1)) if opt.schedule == "rsqrt" else opt.learning_rate


def ssm_learning_rate(opt: OptimizerSettings) -> float:
    """The base rate of the state-space parameters: the schedule's, scaled so that its peak is
    min(`optimizer.ssm_max_learning_rate`, the main peak), the S4 authors' rule (0.001 on LRA). Derived
    when the optimizer is built, so it follows any override of the main rate."""
    return opt.learning_rate * min(1.0, opt.ssm_max_learning_rate / peak_learning_rate(opt))


def make_optimizer(opt: OptimizerSettings) -> optax.GradientTransformation:
    """AdamW with the configured schedule, optional global-norm clipping and, with
    `optimizer.skip_nonfinite_updates` = k > 0, up to k consecutive non-finite updates skipped.

    A config with `optimizer.ssm_max_learning_rate` (configs/s4d.py) trains state-space parameters
    (`SSMParam`) with their own AdamW: the same schedule at `ssm_learning_rate`, no weight decay.
    """

    def adamw(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
        return optax.adamw(make_schedule(opt, learning_rate), b1=opt.b1, b2=opt.b2, eps=opt.eps,
                           weight_decay=weight_decay)

    tx = adamw(opt.learning_rate, opt.weight_decay)
    if opt.ssm_max_learning_rate is not None:
        tx = optax.multi_transform({"default": tx, "ssm": adamw(ssm_learning_rate(opt), 0.0)}, parameter_groups)
    if opt.grad_clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), tx)
    if opt.skip_nonfinite_updates:
        tx = optax.apply_if_finite(tx, max_consecutive_errors=opt.skip_nonfinite_updates)
    return tx


def parameter_groups(params):
    """The optimizer group of each parameter: "ssm" for an `SSMParam`, else "default"."""
    return jax.tree.map(lambda v: "ssm" if isinstance(v, SSMParam) else "default", params,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))

