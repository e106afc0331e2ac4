"""Run metrics to JSON lines (`metrics.jsonl`) and TensorBoard event files in the workdir."""

from __future__ import annotations

import json
import math
import os

from tensorboardX import SummaryWriter


class MetricsWriter:
    """`write(step, {"train/loss": 0.7, ...})` appends one JSON line and one scalar per key.

    A run resumed at step s first drops the JSON lines of steps after s, written
    before the interruption and about to be written again. With `enabled=False` (every process
    of a multi-process run but the first) it writes nothing.
    """

    def __init__(self, workdir: str | os.PathLike, start_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        path = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= start_step]
            with open(f"{path}.tmp", "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(f"{path}.tmp", path)
        self.jsonl = open(path, "a", encoding="utf-8")
        self.tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Appends the scalars; a non-finite one is written as null (strict JSON has no NaN)."""
        if not self.enabled:
            return
        scalars = {key: float(value) for key, value in scalars.items()}
        line = {key: value if math.isfinite(value) else None for key, value in scalars.items()}
        self.jsonl.write(json.dumps({"step": step, **line}, allow_nan=False) + "\n")
        self.jsonl.flush()
        for key, value in scalars.items():
            self.tensorboard.add_scalar(key, value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tensorboard.close()
