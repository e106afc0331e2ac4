"""Nystromformer (Xiong et al. 2021) with segment-mean landmarks and a value convolution, on an LRA task.

    python -m lra_jax.train --config=configs/nystromformer.py:listops,mini --workdir=runs/nystromformer-mini
    python -m lra_jax.train --config=configs/nystromformer.py              # full-scale ListOps

`num_landmarks` m: 64 at full scale (the authors' LRA configs try 32-256), 16 at mini. `conv_kernel`:
35, the depthwise value convolution of the authors' LRA configs (mlpen/Nystromformer, LRA/code/lra_config.py).
`pinv_iterations`: 6, the paper's.

One run, one machine: mini ListOps test accuracy 0.353 (majority class 0.167; 2-core CPU, seed 0; from
`python -m lra_jax.tools.sweep --variants=nystromformer --tasks=listops --root=experiments/mini-lra`); full-scale ListOps:
not yet measured.
"""

from lra_jax.config import task_defaults


def get_config(arg: str | None = None):
    _, scale = task_defaults.parse(arg)
    return task_defaults.get_config(arg, attention=dict(name="nystromformer", num_landmarks=16 if scale == "mini" else 64,
                                               pinv_iterations=6, conv_kernel=35))
