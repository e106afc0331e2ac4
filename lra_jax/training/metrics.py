"""Run metrics to JSON lines (`metrics.jsonl`) and TensorBoard event files in the workdir."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys

from tensorboardX import SummaryWriter


@contextlib.contextmanager
def naming_the_file(path: str):
    """Gives an OSError raised inside (a write or flush of an open file, which names none) `path` as its
    filename, so a full disk is reported with the file it stopped (`trainer.train_and_evaluate`)."""
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, path) from error


class MetricsWriter:
    """`write(step, {"train/loss": 0.7, ...})` appends one JSON line and one scalar per key.

    A run resumed at step s first drops the JSON lines of steps after s, written
    before the interruption and about to be written again, and the test metrics (written again at
    the end); a damaged line (a truncated file) is reported in one line, dropped with the lines
    after it, and the file as it was kept as metrics.jsonl.damaged. With `enabled=False` (every process
    of a multi-process run but the first) it writes nothing.
    """

    def __init__(self, workdir: str | os.PathLike, start_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        path = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(path):
            lines, damaged = read_lines(path)
            if damaged:
                shutil.copyfile(path, f"{path}.damaged")
                print(f"warning: {damaged}; the lines before it are kept, the file as it was is in "
                      f"{path}.damaged", file=sys.stderr, flush=True)
            # test metrics are written once training is over, and again by a run that resumes
            kept = [json.dumps(line) + "\n" for line in lines
                    if line["step"] <= start_step and not any(key.startswith("test/") for key in line)]
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
        with naming_the_file(self.jsonl.name):
            self.jsonl.write(json.dumps({"step": step, **line}, allow_nan=False) + "\n")
            self.jsonl.flush()
        with naming_the_file(self.tensorboard.logdir):
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()

    def close(self) -> None:
        """Closes both files; TensorBoard's too when the log's close raises (a full disk fails its flush)."""
        if not self.enabled:
            return
        try:
            self.jsonl.close()
        finally:
            self.tensorboard.close()


def read_lines(path: str | os.PathLike) -> tuple[list[dict], str | None]:
    """The JSON objects of a metrics.jsonl up to its first damaged line, and one line naming that
    damage (None when the file is whole)."""
    lines = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                if not isinstance(line, dict) or not isinstance(line.get("step"), int):
                    raise ValueError("no integer 'step'")
            except ValueError as error:
                return lines, f"{path} line {number} is damaged ({error})"
            lines.append(line)
    return lines, None


def whole(workdir: str | os.PathLike) -> bool:
    """Whether the workdir's metrics.jsonl has no damaged line (True when there is none)."""
    path = os.path.join(workdir, "metrics.jsonl")
    return not os.path.exists(path) or read_lines(path)[1] is None
