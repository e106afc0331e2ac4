"""The LRA tasks: what the model needs to know about each, and where its data comes from.

Token id 0 is padding in every task; the model's mask is `tokens != 0`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import ml_collections
import numpy as np

from lra_jax.errors import ConfigError, DataError

Split = tuple[np.ndarray, np.ndarray]  # tokens int [N, max_len] (dual: [N, 2, max_len]), labels int32 [N]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """An LRA task.

    Attributes:
      name: registry name, as in `configs/<variant>.py:<name>`.
      vocab_size: token ids are in [0, vocab_size); 0 is padding.
      num_classes: number of labels.
      dual: True when an example is a pair of sequences (Retrieval).
      load: config -> {"train", "val", "test"} splits.
    """

    name: str
    vocab_size: int
    num_classes: int
    dual: bool
    load: Callable[[ml_collections.ConfigDict], dict[str, Split]]


def default_cache_dir() -> str:
    """Where generated datasets and decoded split arrays are kept: $LRA_JAX_CACHE, else ~/.cache/lra_jax."""
    return os.environ.get("LRA_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "lra_jax"))


def _load_listops(config: ml_collections.ConfigDict) -> dict[str, Split]:
    """The official files of config.data.data_dir, or (data_dir "") those generated from config.data.generator."""
    from lra_jax.data import listops, listops_generator

    cache_dir = config.data.cache_dir or default_cache_dir()
    data_dir = config.data.data_dir or listops_generator.generate(cache_dir, **config.data.generator.to_dict())
    return listops.read_splits(data_dir, cache_dir=cache_dir, max_len=config.max_len)


def _listops_spec() -> TaskSpec:
    from lra_jax.data import listops

    return TaskSpec("listops", listops.VOCAB_SIZE, listops.NUM_CLASSES, False, _load_listops)


def _load_text(config: ml_collections.ConfigDict) -> dict[str, Split]:
    from lra_jax.data import text

    return text.load_splits(config.data.data_dir, max_len=config.max_len,
                            cache_dir=config.data.cache_dir or default_cache_dir())


def _load_retrieval(config: ml_collections.ConfigDict) -> dict[str, Split]:
    from lra_jax.data import retrieval

    return retrieval.load_splits(config.data.data_dir, max_len=config.max_len,
                                 cache_dir=config.data.cache_dir or default_cache_dir())


def _load_image(config: ml_collections.ConfigDict) -> dict[str, Split]:
    from lra_jax.data import image

    return image.load_splits(config.data.data_dir, max_len=config.max_len,
                             cache_dir=config.data.cache_dir or default_cache_dir(),
                             downsample_factor=config.data.get("downsample", 1))


def _pathfinder_loader(task: str) -> Callable[[ml_collections.ConfigDict], dict[str, Split]]:
    def load(config: ml_collections.ConfigDict) -> dict[str, Split]:
        """An official difficulty folder (config.data.data_dir), or (data_dir "") images generated
        from config.data.generator."""
        from lra_jax.data import pathfinder, pathfinder_generator

        cache_dir = config.data.cache_dir or default_cache_dir()
        data_dir, generator = config.data.data_dir, config.data.get("generator")
        if not data_dir:
            if not generator:
                raise DataError(f"{task}: config.data.data_dir is empty and config.data.generator is not set; "
                                "set one of them")
            data_dir = pathfinder_generator.generate(cache_dir, task, **generator.to_dict())
        return pathfinder.read_splits(data_dir, cache_dir=cache_dir, max_len=config.max_len,
                                      split_seed=config.data.get("split_seed", 0), task=task)

    return load


_TASKS: dict[str, Callable[[], TaskSpec]] = {
    "listops": _listops_spec,
    "text": lambda: TaskSpec("text", 257, 2, False, _load_text),
    "retrieval": lambda: TaskSpec("retrieval", 257, 2, True, _load_retrieval),
    "image": lambda: TaskSpec("image", 257, 10, False, _load_image),
    "pathfinder": lambda: TaskSpec("pathfinder", 257, 2, False, _pathfinder_loader("pathfinder")),
    "pathx": lambda: TaskSpec("pathx", 257, 2, False, _pathfinder_loader("pathx")),
}


def names() -> list[str]:
    """Known task names."""
    return sorted(_TASKS)


def get_task(name: str) -> TaskSpec:
    """The TaskSpec for `name`; an unknown name lists the known ones."""
    if name not in _TASKS:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    return _TASKS[name]()
