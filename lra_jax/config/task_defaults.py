"""Per-task LRA defaults and the `full` | `mini` scales; every variant config starts here.

A config file's argument after the colon picks task and scale:
`configs/linformer.py:text,mini`. The default is full-scale ListOps.

Full scale follows the LRA code (Tay et al. 2021, github.com/google-research/long-range-arena,
lra_benchmarks/*/configs) with the model sizes the LRA paper reports; where the two disagree the
function's docstring says which one is used. Mini scale is a small model on short sequences that
trains in a few minutes on a 2-core CPU; it is for smoke tests and laptops, not for comparisons.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from lra_jax.data.tasks import TASKS
from lra_jax.models.model_settings import ModelSettings

# Settings added after runs were recorded: a config without the key (a saved config.json, a config
# file of one's own) reads as having this value, which behaves as those runs did. `_common` sets them
# from here: the one place these defaults live (`lra_jax.config.settings` reads a config with them).
OPTIONAL = {"optimizer.skip_nonfinite_updates": 0, "grad_accum_steps": 1, "keep_checkpoints": 2,
            "val_examples": 0, "pretrain.objective": "none", "pretrain.num_steps": 0, "pretrain.mask_rate": 0.15,
            "pretrain.learning_rate": 0.0, "pretrain.warmup_steps": 0, "attention.causal": False}
SCALES = ("full", "mini")


def parse(arg: str | None) -> tuple[str, str]:
    """'text,mini' -> ('text', 'mini'); an empty argument means full-scale ListOps."""
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


def _common(task: str, scale: str) -> ml_collections.ConfigDict:
    """Settings every task has; the task functions below fill in their values."""
    c = ml_collections.ConfigDict()
    c.task = task
    c.scale = scale
    c.seed = 0
    c.data = dict(
        data_dir="",  # where the official data is; empty: the task's default (see its docstring)
        cache_dir="",  # generated and decoded data lives here; empty: $LRA_JAX_CACHE or ~/.cache/lra_jax
    )
    c.model = dataclasses.asdict(ModelSettings())  # the LRA paper's full-scale model (its docstring)
    # schedule "rsqrt": LRA's constant * linear_warmup * rsqrt_decay; "cosine": * cosine_decay.
    # skip_nonfinite_updates=k > 0 skips up to k consecutive updates with a non-finite gradient
    # (optax.apply_if_finite); 0 stops the run at the first one.
    c.optimizer = dict(schedule="rsqrt", learning_rate=0.05, warmup_steps=8_000, weight_decay=0.1, b1=0.9,
                       b2=0.98, eps=1e-9, grad_clip_norm=0.0,
                       skip_nonfinite_updates=OPTIONAL["optimizer.skip_nonfinite_updates"])
    # batch_size is the global batch of one update; grad_accum_steps = k computes it as k
    # micro-batches of batch_size / k, for a device that cannot hold the whole batch
    # (`python -m lra_jax.tools.compile` prints the k that fits a target); evaluation runs in
    # batches of batch_size / k too.
    c.grad_accum_steps = OPTIONAL["grad_accum_steps"]
    c.keep_checkpoints = OPTIONAL["keep_checkpoints"]  # last checkpoints kept: an older one is the fallback when the newest is damaged
    c.eval_every = 500
    c.val_examples = OPTIONAL["val_examples"]  # validate on this many examples drawn once from the val split (0: all of it)
    c.checkpoint_every = 500
    c.log_every = 50
    # Self-pretraining on the task's own training split before fine-tuning (docs/self-pretraining.md):
    # objective "none" | "masked" (BERT-style masked tokens) | "causal" (next token; causal variants only).
    # num_steps pretraining steps of batch_size examples on the optimizer's schedule, with its own peak
    # learning_rate (0: the fine-tuning one) and warmup_steps; mask_rate: the share of real tokens predicted.
    c.pretrain = {key.partition(".")[2]: value for key, value in OPTIONAL.items() if key.startswith("pretrain.")}
    return c


def _mini_model(c: ml_collections.ConfigDict, **changes) -> None:
    """Two small unscanned layers without dropout: minutes on a 2-core CPU."""
    c.model.update(num_layers=2, num_heads=4, emb_dim=64, mlp_dim=128, dropout_rate=0.0,
                   attention_dropout_rate=0.0, scan_layers=False, remat=False)
    c.model.update(changes)
    c.eval_every = c.checkpoint_every = 250
    c.log_every = 25


def listops(scale: str) -> ml_collections.ConfigDict:
    """ListOps: 10-way classification of nested MIN/MAX/MED/SM expressions (data generated locally).

    data_dir: the official lra_release/listops-1000 folder; empty: generate with `data.generator`.
    """
    c = _common("listops", scale)
    c.max_len = 2000
    c.data.generator = dict(num_train=96_000, num_val=2_000, num_test=2_000, min_length=500, max_length=2_000,
                            max_depth=10, max_args=10, seed=0)
    c.model.update(num_heads=8, emb_dim=512, mlp_dim=1024)
    c.batch_size = 32
    c.num_train_steps = 5_000
    c.optimizer.update(warmup_steps=1_000)
    if scale == "mini":
        c.max_len = 128
        c.data.generator.update(num_train=10_000, num_val=1_000, num_test=1_000, min_length=20, max_length=128)
        _mini_model(c)
        c.num_train_steps = 1_500
        c.optimizer.update(warmup_steps=200, weight_decay=0.01)
    return c


def text(scale: str) -> ml_collections.ConfigDict:
    """Text: IMDb sentiment from bytes (TFDS imdb_reviews), 2 classes.

    data_dir: the TFDS data dir holding imdb_reviews; empty: TFDS's default (~/tensorflow_datasets).
    Get it with `python -m lra_jax.data.prepare --task=text`.
    """
    c = _common("text", scale)
    c.max_len = 1000  # the LRA paper also reports 4000: --config.max_len=4000
    c.batch_size = 32
    c.num_train_steps = 20_000
    if scale == "mini":
        # The first 256 bytes of each review and one layer, so that the mini sweep fits a CPU
        # (`python -m lra_jax.tools.sweep --tasks=text --estimate` prints each run's projected time).
        c.max_len = 256
        _mini_model(c, num_layers=1)
        c.val_examples = 2_000  # of the 25,000 test reviews (val = test); the test score uses all
        c.num_train_steps = 1_000
        c.optimizer.update(warmup_steps=200, weight_decay=0.01)
    return c


def retrieval(scale: str) -> ml_collections.ConfigDict:
    """Retrieval: do two ACL Anthology papers cite each other? Bytes, two documents per example.

    data_dir: the folder with new_aan_pairs.{train,eval,test}.tsv (lra_release/lra_release/tsv_data).
    Get it with `python -m lra_jax.data.prepare --task=retrieval`. max_len is per document.
    The LRA code warms up for 8000 steps of a 5000-step run: the peak rate is never reached. Kept as is.
    """
    c = _common("retrieval", scale)
    c.max_len = 4000
    c.model.update(emb_dim=128, mlp_dim=512)
    c.batch_size = 32
    c.num_train_steps = 5_000
    if scale == "mini":
        # 128 bytes per document (title and the start of the abstract), one layer (two documents of 256
        # bytes and two layers: ~25 minutes a run with full attention on one CPU core).
        c.max_len = 128
        _mini_model(c, num_layers=1)
        c.val_examples = 2_000
        c.num_train_steps = 1_000
        c.optimizer.update(warmup_steps=200, weight_decay=0.01)
    return c


def _image_task(c: ml_collections.ConfigDict, *, train_examples: int, epochs: int) -> None:
    """The LRA image tasks' optimiser: AdamW, 1 epoch warm-up, cosine decay, no weight decay."""
    steps_per_epoch = train_examples // c.batch_size
    c.num_train_steps = steps_per_epoch * epochs
    c.optimizer.update(schedule="cosine", warmup_steps=steps_per_epoch, weight_decay=0.0)
    c.eval_every = c.checkpoint_every = steps_per_epoch


def image(scale: str) -> ml_collections.ConfigDict:
    """Image: CIFAR-10 as 1024 grayscale pixel tokens (TFDS cifar10), 10 classes.

    data_dir: the TFDS data dir holding cifar10; empty: TFDS's default. Get it with
    `python -m lra_jax.data.prepare --task=image`. data.downsample f > 1 averages f x f pixel blocks
    (1024 / f^2 tokens; the mini scale uses 2). Model size from the LRA paper (1 layer, 8 heads,
    emb 128, MLP 128); the LRA code at HEAD uses 1 head and emb 32 for its base config.
    """
    c = _common("image", scale)
    c.max_len = 1024
    c.model.update(num_layers=1, num_heads=8, emb_dim=128, mlp_dim=128, dropout_rate=0.3,
                   attention_dropout_rate=0.2)
    c.data.downsample = 1  # whole 32x32 images
    c.batch_size = 256
    c.optimizer.update(learning_rate=5e-4)
    _image_task(c, train_examples=45_000, epochs=200)
    if scale == "mini":
        # 16x16 images (2x2 pixel blocks averaged, `data.downsample`) and mini Pathfinder's model: at
        # 32x32 a run of full attention takes well over an hour on one CPU core; this takes minutes.
        c.data.downsample = 2
        c.max_len = 16 * 16
        _mini_model(c, num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2, positions="sinusoidal",
                    cls_token=False, pooling="mean")
        c.batch_size = 32
        c.val_examples = 2_000
        c.num_train_steps = 1_000
        c.optimizer.update(learning_rate=1e-3, warmup_steps=150)
        c.eval_every = c.checkpoint_every = 250
    return c


def _pathfinder_generator(image_size: int, num_examples: int) -> dict:
    return dict(image_size=image_size, contour_length=14, num_distractors=2, marker_value=255,
                num_examples=num_examples, seed=0)


def pathfinder(scale: str) -> ml_collections.ConfigDict:
    """Pathfinder: are the two marked dots joined by a path? 32x32 = 1024 pixel tokens, 2 classes.

    data_dir: one difficulty folder of the official data, e.g. lra_release/pathfinder32/
    curv_contour_length_14 (the hard split the LRA paper reports); empty: generate it with our
    generator (`data.generator`), which writes the same layout. Model from the LRA paper (4 layers,
    4 heads, emb 32, MLP 32, mean pooling; the LRA code's transformer_base uses 1 layer, emb 128).
    """
    c = _common("pathfinder", scale)
    c.max_len = 32 * 32
    c.data.generator = _pathfinder_generator(32, 200_000)
    c.model.update(num_layers=4, num_heads=4, emb_dim=32, mlp_dim=32, positions="sinusoidal",
                   cls_token=False, pooling="mean")
    c.batch_size = 512
    c.optimizer.update(learning_rate=1e-3)
    _image_task(c, train_examples=160_000, epochs=200)
    if scale == "mini":
        # 16x16 images (at 32x32 full attention takes ~6 s a step on 2 CPU cores), grey end markers (with
        # white ones, as in the official images, small models stay at chance far longer), two layers for
        # 2,000 steps at 1e-3: the recipe the search of docs/tasks-and-data.md chose, on which softmax learns
        # in nearly every seed (one layer for 1,000 steps at 5e-3, the earlier recipe, learned in 1 of 3).
        c.max_len = 16 * 16
        c.data.generator.update(image_size=16, contour_length=6, marker_value=128, num_examples=12_000)
        _mini_model(c, num_layers=2, emb_dim=32, mlp_dim=64, num_heads=2, positions="sinusoidal",
                    cls_token=False, pooling="mean")
        c.batch_size = 32
        c.num_train_steps = 2_000
        c.optimizer.update(learning_rate=1e-3, warmup_steps=150)
        c.eval_every = c.checkpoint_every = 250
    return c


def pathx(scale: str) -> ml_collections.ConfigDict:
    """Path-X: Pathfinder at 128x128 = 16384 tokens. Every model in the LRA paper failed it (chance).

    data_dir: e.g. lra_release/pathfinder128/curv_contour_length_14; empty: generate it.
    Mini scale: 32x32 images (1024 tokens, 4x mini Pathfinder's length) with short contours, one layer.
    """
    c = _common("pathx", scale)
    c.max_len = 128 * 128
    c.data.generator = _pathfinder_generator(128, 200_000)
    c.model.update(num_layers=1, num_heads=2, emb_dim=32, mlp_dim=32, cls_token=False, pooling="mean")
    c.batch_size = 64
    c.optimizer.update(learning_rate=1e-3, grad_clip_norm=1.0)
    _image_task(c, train_examples=160_000, epochs=200)
    if scale == "mini":
        c.max_len = 32 * 32
        c.data.generator.update(image_size=32, contour_length=6, num_examples=4_000)
        _mini_model(c, num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2, cls_token=False, pooling="mean")
        c.batch_size = 16
        c.num_train_steps = 600
        c.optimizer.update(learning_rate=2e-3, warmup_steps=60)
        c.eval_every = c.checkpoint_every = 200
    return c


_TASK_CONFIGS = {task: globals()[task] for task in TASKS}  # each task's function is named after it


def get_config(arg: str | None = None, attention: dict | None = None) -> ml_collections.ConfigDict:
    """The locked config of task/scale `arg` with `attention` = {"name": ..., **settings}.

    Locked: an override of a key that does not exist fails with a suggestion.
    """
    task, scale = parse(arg)
    config = _TASK_CONFIGS[task](scale)
    # impl "auto": the variant's Pallas kernel on GPU (Triton) and TPU (splash), XLA on CPU.
    # causal: position i mixes positions <= i only, for next-token pretraining (variants that can).
    config.attention = dict(name="softmax", impl="auto", causal=OPTIONAL["attention.causal"])
    config.attention.update(attention or {})
    config.lock()
    return config


def state_space_recipe(config: ml_collections.ConfigDict, *, layers: int, width: int, dropout: float, rate: float,
                       decay: float, batch: int, epochs: int, examples: int) -> None:
    """A state-space paper's full-scale LRA recipe on `config` (S4D's and S5's authors publish one per task):
    `layers` blocks of width `width` with one head, no feed-forward sublayer (the layer's GLU is the
    position-wise part), mean pooling without a CLS token, `dropout` everywhere, `batch` examples a step for
    `epochs` epochs of `examples`, AdamW at `rate` with weight decay `decay` and cosine decay after one epoch
    of warm-up, evaluated and checkpointed once an epoch."""
    with config.unlocked():
        config.model.update(num_layers=layers, emb_dim=width, num_heads=1, mlp_dim=0, dropout_rate=dropout,
                            attention_dropout_rate=dropout, cls_token=False, pooling="mean")
        config.batch_size = batch
        epoch = examples // batch
        config.num_train_steps = epochs * epoch
        config.eval_every = config.checkpoint_every = epoch
        config.optimizer.update(schedule="cosine", learning_rate=rate, weight_decay=decay, warmup_steps=epoch,
                                b1=0.9, b2=0.999, eps=1e-8)
