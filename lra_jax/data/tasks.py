"""The LRA tasks: what the model needs to know about each, and where its data comes from.

`TASKS` is the one list of task names; every other list (the configs' tasks, `prepare`'s) is
derived from it. Token id 0 is padding in every task; the model's mask is `tokens != 0`.
A task's `load` takes the typed `DataSettings` (built and checked from the config by
`lra_jax.config.settings`) and the sequence length, never the config itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np

from lra_jax.data import (
    image,
    listops,
    listops_generator,
    pathfinder,
    pathfinder_generator,
    retrieval,
    text,
)
from lra_jax.errors import ConfigError, DataError

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")  # in the LRA paper's order

Split = tuple[np.ndarray, np.ndarray]  # tokens int [N, max_len] (dual: [N, 2, max_len]), labels int32 [N]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """An LRA task.

    Attributes:
      name: registry name, as in `configs/<variant>.py:<name>`.
      vocab_size: token ids are in [0, vocab_size); 0 is padding.
      num_classes: number of labels.
      dual: True when an example is a pair of sequences (Retrieval).
      load: (DataSettings, max_len) -> {"train", "val", "test"} splits.
    """

    name: str
    vocab_size: int
    num_classes: int
    dual: bool
    load: Callable[[DataSettings, int], dict[str, Split]]


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """`config.data`, typed; the defaults here are those of a config that does not set the key.

    Attributes:
      data_dir: the official data (see each task's config docstring); "": the task's default.
      cache_dir: generated data and decoded arrays; "": `default_cache_dir()`.
      generator: the generator's settings (ListOps, Pathfinder, Path-X), used when data_dir is "".
      downsample: Image: f > 1 averages f x f pixel blocks.
      split_seed: Pathfinder: the seed of the train/val/test split of one folder.
    """

    data_dir: str = ""
    cache_dir: str = ""
    generator: dict | None = None
    downsample: int = 1
    split_seed: int = 0

    def cache(self) -> str:
        return self.cache_dir or default_cache_dir()


def default_cache_dir() -> str:
    """Where generated datasets and decoded split arrays are kept: $LRA_JAX_CACHE, else ~/.cache/lra_jax."""
    return os.environ.get("LRA_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lra_jax"))


def _load_listops(data: DataSettings, max_len: int) -> dict[str, Split]:
    """The official files of data.data_dir, or (data_dir "") those generated from data.generator."""
    data_dir = data.data_dir or listops_generator.generate(data.cache(), **(data.generator or {}))
    return listops.read_splits(data_dir, cache_dir=data.cache(), max_len=max_len)


def _load_text(data: DataSettings, max_len: int) -> dict[str, Split]:
    return text.load_splits(data.data_dir, max_len=max_len, cache_dir=data.cache())


def _load_retrieval(data: DataSettings, max_len: int) -> dict[str, Split]:
    return retrieval.load_splits(data.data_dir, max_len=max_len, cache_dir=data.cache())


def _load_image(data: DataSettings, max_len: int) -> dict[str, Split]:
    return image.load_splits(data.data_dir, max_len=max_len, cache_dir=data.cache(),
                             downsample_factor=data.downsample)


def _pathfinder_loader(task: str) -> Callable[[DataSettings, int], dict[str, Split]]:
    def load(data: DataSettings, max_len: int) -> dict[str, Split]:
        """An official difficulty folder (data.data_dir), or (data_dir "") images generated from data.generator."""
        data_dir = data.data_dir
        if not data_dir:
            if not data.generator:
                raise DataError(f"{task}: --config.data.data_dir is empty and config.data.generator is not set; "
                                "set one of them")
            data_dir = pathfinder_generator.generate(data.cache(), task, **data.generator)
        return pathfinder.read_splits(data_dir, cache_dir=data.cache(), max_len=max_len,
                                      split_seed=data.split_seed, task=task)

    return load


_SPECS = (
    TaskSpec("listops", listops.VOCAB_SIZE, listops.NUM_CLASSES, False, _load_listops),
    TaskSpec("text", 257, 2, False, _load_text),
    TaskSpec("retrieval", 257, 2, True, _load_retrieval),
    TaskSpec("image", 257, 10, False, _load_image),
    TaskSpec("pathfinder", 257, 2, False, _pathfinder_loader("pathfinder")),
    TaskSpec("pathx", 257, 2, False, _pathfinder_loader("pathx")),
)
_TASKS = {spec.name: spec for spec in _SPECS}
assert tuple(_TASKS) == TASKS, "every task has one spec, in TASKS' order"


def names() -> list[str]:
    """Known task names."""
    return sorted(_TASKS)


def get_task(name: str) -> TaskSpec:
    """The TaskSpec for `name`; an unknown name lists the known ones."""
    if name not in _TASKS:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    return _TASKS[name]
