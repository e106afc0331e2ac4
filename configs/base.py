"""Per-task LRA defaults and the `full` | `mini` scales; every variant config starts here.

A config file's argument after the colon picks task and scale:
`configs/linformer.py:listops,mini`. The default is full-scale ListOps.

Full scale follows the LRA code (Tay et al. 2021, github.com/google-research/long-range-arena,
lra_benchmarks/listops/configs) with the model size the LRA paper reports for ListOps.
Mini scale is a small model on short generated sequences that trains in a few minutes
on a 2-core CPU and clearly learns; it is for smoke tests and laptops, not for comparisons.
"""

from __future__ import annotations

import ml_collections

TASKS = ("listops",)
SCALES = ("full", "mini")


def parse(arg: str | None) -> tuple[str, str]:
    """'listops,mini' -> ('listops', 'mini'); an empty argument means full-scale ListOps."""
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    task = next((p for p in parts if p not in SCALES), "listops")
    scale = next((p for p in parts if p in SCALES), "full")
    unknown = [p for p in parts if p not in SCALES and p != task]
    if task not in TASKS or unknown:
        raise ValueError(
            f"config argument {arg!r}: expected 'TASK[,SCALE]' with TASK in {', '.join(TASKS)} "
            f"and SCALE in {', '.join(SCALES)}, e.g. configs/linformer.py:listops,mini"
        )
    return task, scale


def listops(scale: str) -> ml_collections.ConfigDict:
    """ListOps: 10-way classification of nested MIN/MAX/MED/SM expressions."""
    c = ml_collections.ConfigDict()
    c.task = "listops"
    c.scale = scale
    c.seed = 0
    c.max_len = 2000
    c.data = dict(
        data_dir="",  # official lra_release/listops-1000; empty: generate with `generator`
        cache_dir="",  # generated data lives here; empty: $LRA_JAX_CACHE or ~/.cache/lra_jax
        generator=dict(num_train=96_000, num_val=2_000, num_test=2_000, min_length=500,
                       max_length=2_000, max_depth=10, max_args=10, seed=0),
    )
    c.model = dict(num_layers=4, num_heads=8, emb_dim=512, mlp_dim=1024, dropout_rate=0.1,
                   attention_dropout_rate=0.1, positions="learned", cls_token=True, pooling="cls",
                   dtype="float32",
                   # Layers in one lax.scan, recomputed in the backward pass: the same function in
                   # ~1/3 of the memory (Linformer, batch 32: 25 -> 9 GB). Set both False for speed
                   # where memory is plentiful.
                   scan_layers=True, remat=True)
    c.batch_size = 32
    c.num_train_steps = 5_000
    c.optimizer = dict(learning_rate=0.05, warmup_steps=1_000, weight_decay=0.1, b1=0.9, b2=0.98,
                       eps=1e-9, grad_clip_norm=0.0)
    c.eval_every = 500
    c.checkpoint_every = 500
    c.log_every = 50
    if scale == "mini":
        c.max_len = 128
        c.data.generator.update(num_train=10_000, num_val=1_000, num_test=1_000, min_length=20,
                                max_length=128, max_depth=10, max_args=10)
        c.model.update(num_layers=2, num_heads=4, emb_dim=64, mlp_dim=128, dropout_rate=0.0,
                       attention_dropout_rate=0.0, scan_layers=False, remat=False)
        c.batch_size = 32
        c.num_train_steps = 1_500
        c.optimizer.update(learning_rate=0.05, warmup_steps=200, weight_decay=0.01)
        c.eval_every = 250
        c.checkpoint_every = 250
        c.log_every = 25
    return c


def get_config(arg: str | None = None, attention: dict | None = None) -> ml_collections.ConfigDict:
    """The locked config of task/scale `arg` with `attention` = {"name": ..., **settings}.

    Locked: an override of a key that does not exist fails with a suggestion.
    """
    task, scale = parse(arg)
    config = {"listops": listops}[task](scale)
    config.attention = dict(name="softmax", impl="xla")
    config.attention.update(attention or {})
    config.lock()
    return config
