"""S5 (Smith, Warrington, Linderman 2023): one MIMO diagonal state-space layer computed by a parallel scan,
not attention, on an LRA task.

    python -m lra_jax.train --config=configs/s5.py:listops,mini --workdir=runs/s5-mini
    python -m lra_jax.train --config=configs/s5.py:pathfinder    # full scale, the authors' settings

The layer is bidirectional S5 with HiPPO-N initialised in `blocks` blocks, conjugate symmetry, GELU and a
GLU output projection (lra_jax/attention/recurrent/diagonal.py). Λ and log Δ train with no weight decay at
min(`optimizer.ssm_max_learning_rate`, the main peak), the rest at `optimizer.learning_rate`.

Full scale follows the authors' LRA scripts (github.com/lindermanlab/S5, bin/run_experiments/run_lra_*.sh):
per task the depth, width H, latent size P, blocks J, dropout, learning rate (lr_factor × ssm_lr_base),
SSM learning rate, weight decay, batch and epochs below; Path-X with Δ from 0.0001. What differs: our
shared encoder uses pre-LayerNorm and adds positions (the authors: BatchNorm, no positions), the same
AdamW and cosine schedule for every parameter group (theirs varies by task: B or C with the SSM rate),
and the GLU of S4D's block (theirs: a half-GLU on some tasks).

Mini scale keeps each task's mini model and optimiser, as for every variant, with an S5 layer of
P = 64, J = 4 in place of attention (and the same SSM rate rule).
"""

from lra_jax.config import task_defaults

RECIPE = ("layers", "width", "dropout", "rate", "decay", "batch", "epochs", "examples")
# task: (RECIPE values, latent size P, blocks J, SSM learning rate)
PAPER = {
    "listops": ((8, 128, 0.0, 0.003, 0.04, 50, 40, 96_000), 16, 8, 0.001),
    "text": ((6, 256, 0.1, 0.004, 0.07, 50, 35, 25_000), 192, 12, 0.001),
    "retrieval": ((6, 128, 0.0, 0.002, 0.05, 32, 20, 147_086), 256, 16, 0.001),
    "image": ((6, 512, 0.1, 0.0045, 0.07, 50, 250, 45_000), 384, 3, 0.001),
    "pathfinder": ((6, 192, 0.05, 0.0045, 0.03, 64, 200, 160_000), 256, 8, 0.0009),
    "pathx": ((6, 128, 0.0, 0.0018, 0.06, 32, 75, 160_000), 256, 16, 0.0006),
}


def get_config(arg: str | None = None):
    task, scale = task_defaults.parse(arg)
    attention = dict(name="s5", state_size=64, blocks=4, dt_min=0.001, dt_max=0.1, bidirectional=True, glu=True)
    ssm_rate = 0.001
    if scale == "full":
        recipe, state_size, blocks, ssm_rate = PAPER[task]
        attention.update(state_size=state_size, blocks=blocks, dt_min=0.0001 if task == "pathx" else 0.001)
    config = task_defaults.get_config(arg, attention=attention)
    if scale == "full":
        task_defaults.state_space_recipe(config, **dict(zip(RECIPE, recipe)))
    with config.unlocked():
        config.optimizer.ssm_max_learning_rate = ssm_rate
    return config
