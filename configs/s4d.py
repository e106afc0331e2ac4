"""S4D (Gu, Gupta, Goel, Ré 2022): the diagonal state-space yardstick, not attention, on an LRA task.

    python -m lra_jax.train --config=configs/s4d.py:listops,mini --workdir=runs/s4d-mini
    python -m lra_jax.train --config=configs/s4d.py:pathx         # full-scale Path-X, the paper's settings

The layer is bidirectional S4D-Lin with state size N = 64, GELU and a GLU output projection
(lra_jax/attention/recurrent/ssm.py). Its A and log step sizes train with no weight decay under the main
schedule, scaled so that their peak rate is min(`optimizer.ssm_max_learning_rate` = 0.001, the main
peak), the authors' rule; every other parameter at `optimizer.learning_rate` with the task's weight
decay. The SSM rate is derived when the optimizer is built (`optimizer.ssm_learning_rate`), so it
follows a `--config.optimizer.learning_rate` override or a sweep's learning-rate grid.

Full scale follows the S4D paper's LRA settings, as in the authors' configs
(github.com/state-spaces/s4, configs/experiment/lra/s4-lra-{listops,imdb,aan,cifar,pathfinder,pathx}.yaml):
depth, width H, dropout, learning rate, weight decay, batch size and epochs per task below, SSM
learning rate 0.001 (Path-X 0.0005), Delta in [0.001, 0.1] (Path-X [0.0001, 0.1]), AdamW with
cosine decay after one epoch of warm-up, mean pooling, a linear decoder, no feed-forward
sublayer (`model.mlp_dim = 0`: the layer's GLU is the position-wise part). What differs from
the paper: our shared encoder normalises with pre-LayerNorm (the paper mostly BatchNorm, several
tasks post-norm) and adds positions (learned or sinusoidal, as the task's other variants); the paper's
Text length is 4096 bytes. Its published scores are in experiments/reference/s4d_paper.json.

ListOps and Image keep the paper's batch of 50, which the trainer cannot split over 4 or 8 devices
(a v5e 2x2 or v4 2x2x1 slice, 4 or 8 GPUs): there pass `--config.batch_size=48`, the batch
`python -m lra_jax.tools.compile` compiles for such a slice.

Mini scale keeps each task's mini model and optimiser, as for every variant, with the S4D layer
in place of attention (and the same SSM rule).

Results: docs/s4d.md and experiments/charts/lra_results.md (mini ListOps and Pathfinder, from
`python -m lra_jax.tools.sweep --variants=s4d --tasks=listops,pathfinder --scales=mini --root=experiments/mini-lra`).
"""

from lra_jax.config import task_defaults

RECIPE = ("layers", "width", "dropout", "rate", "decay", "batch", "epochs", "examples")  # width: H
PAPER = {
    "listops": (8, 128, 0.0, 0.01, 0.05, 50, 40, 96_000),
    "text": (6, 256, 0.0, 0.01, 0.05, 16, 32, 25_000),
    "retrieval": (6, 256, 0.0, 0.01, 0.05, 64, 20, 147_086),
    "image": (6, 512, 0.1, 0.01, 0.05, 50, 200, 45_000),
    "pathfinder": (6, 256, 0.0, 0.004, 0.03, 64, 200, 160_000),
    "pathx": (6, 256, 0.0, 0.0005, 0.05, 16, 50, 160_000),
}
# The cap on A's and Delta's peak rate; with Path-X's main rate 0.0005 it gives the paper's 0.0005 there.
SSM_MAX_LEARNING_RATE = 0.001


def get_config(arg: str | None = None):
    task, scale = task_defaults.parse(arg)
    attention = dict(name="s4d", state_size=64, dt_min=0.001, dt_max=0.1, bidirectional=True, glu=True)
    if scale == "full" and task == "pathx":
        attention["dt_min"] = 0.0001
    config = task_defaults.get_config(arg, attention=attention)
    if scale == "full":
        task_defaults.state_space_recipe(config, **dict(zip(RECIPE, PAPER[task])))
    with config.unlocked():
        if scale == "full" and task == "text":
            config.max_len = 4096
        config.optimizer.ssm_max_learning_rate = SSM_MAX_LEARNING_RATE
    return config
