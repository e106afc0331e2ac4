"""Downloads and prepares the data of the LRA tasks that are not generated locally.

    python -m lra_jax.data.prepare --task=text|retrieval|image|pathfinder|pathx|all [--data_dir=DIR]

Sources:
  * text (`imdb_reviews`) and image (`cifar10`): TFDS builders, prepared with
    `download_and_prepare(file_format="array_record")` so that
    `tfds.data_source` can read them without TensorFlow. Measured with
    tensorflow-datasets 4.9.10: a builder with only Text and ClassLabel
    features (imdb_reviews) prepares without TensorFlow; one with an Image
    feature (cifar10) needs TensorFlow to encode the PNGs
    (`pip install tensorflow-cpu`), reading them back does not.
  * retrieval, pathfinder, pathx: the official LRA release,
    https://storage.googleapis.com/long-range-arena/lra_release.gz (a gzipped
    tar, ~7 GB) unpacked into DIR/lra_release (tsv_data/, pathfinder32/,
    pathfinder128/, listops-1000/, ...).

Each task prints the config override that points training at what it prepared.
A task whose data is already there is not downloaded again.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import urllib.request

from absl import app, flags

from lra_jax.data import retrieval
from lra_jax.data.tasks import TASKS as ALL_TASKS
from lra_jax.errors import DataError

LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
TFDS_TASKS = {"text": "imdb_reviews", "image": "cifar10"}
RELEASE_TASKS = {  # task -> folder inside DIR/lra_release to pass as config.data.data_dir
    "retrieval": "tsv_data",
    "pathfinder": "pathfinder32/curv_contour_length_14",
    "pathx": "pathfinder128/curv_contour_length_14",
}
# the tasks with data to fetch (ListOps is generated), from TFDS first, then from the LRA release
TASKS = tuple(t for source in (TFDS_TASKS, RELEASE_TASKS) for t in ALL_TASKS if t in source)

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", None, [*TASKS, "all"], "Which task's data to prepare.")
flags.DEFINE_string("data_dir", "", "TFDS data_dir for text/image (empty: TFDS default); "
                    "folder to unpack lra_release into for the others (empty: ~/lra_data).")


def default_release_dir() -> str:
    """Where lra_release is unpacked when no --data_dir is given."""
    return os.path.join(os.path.expanduser("~"), "lra_data")


def release_folder(task: str, data_dir: str) -> str:
    """The folder inside the unpacked release that `task` reads."""
    return os.path.join(data_dir or default_release_dir(), "lra_release", RELEASE_TASKS[task])


def release_ready(task: str, data_dir: str) -> bool:
    """True if the release folder of `task` already holds its files."""
    folder = release_folder(task, data_dir)
    if task == "retrieval":
        return all(os.path.isfile(os.path.join(folder, f)) for f in retrieval.FILES.values())
    meta = os.path.join(folder, "metadata")
    return os.path.isdir(meta) and any(n.endswith(".npy") for n in os.listdir(meta))


def override(task: str, data_dir: str) -> str:
    """The flag that points training at the prepared data."""
    if task in TFDS_TASKS:
        return f"--config.data.data_dir={data_dir}" if data_dir else "(none needed: the TFDS default data_dir)"
    return f"--config.data.data_dir={release_folder(task, data_dir)}"


def prepare_tfds(task: str, data_dir: str) -> str:
    """Prepares the TFDS dataset of `task` as ArrayRecord unless it already is; returns a status line."""
    import tensorflow_datasets as tfds  # optional heavy dependency (the [tfds] extra), loaded when used

    name = TFDS_TASKS[task]
    builder = tfds.builder(name, data_dir=data_dir or None, file_format="array_record")
    if builder.is_prepared():
        return f"{task}: {name} already prepared in {builder.data_dir}; {override(task, data_dir)}"
    try:
        builder.download_and_prepare()
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "tensorflow":
            raise DataError(
                f"{task}: preparing TFDS {name!r} needs TensorFlow (to encode its images); "
                "run `pip install tensorflow-cpu` once, then this command again (training does not need it)"
            ) from None
        raise
    return f"{task}: prepared {name} in {builder.data_dir}; {override(task, data_dir)}"


def download_release(data_dir: str) -> None:
    """Downloads lra_release.gz into data_dir and unpacks it there (resuming nothing: a partial file is redone)."""
    root = data_dir or default_release_dir()
    os.makedirs(root, exist_ok=True)
    archive = os.path.join(root, "lra_release.gz")
    if not os.path.isfile(archive):
        partial = archive + ".part"
        print(f"downloading {LRA_RELEASE_URL} to {archive} (~7 GB)", flush=True)
        with urllib.request.urlopen(LRA_RELEASE_URL) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 22)
        os.replace(partial, archive)
    print(f"unpacking {archive} into {root}", flush=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(root, filter="data")


def prepare_one(task: str, data_dir: str) -> str:
    """Prepares one task unless its data is already there; returns its status line."""
    if task in TFDS_TASKS:
        return prepare_tfds(task, data_dir)
    if release_ready(task, data_dir):
        return f"{task}: already in {release_folder(task, data_dir)}; {override(task, data_dir)}"
    download_release(data_dir)
    if not release_ready(task, data_dir):
        raise DataError(f"{task}: {release_folder(task, data_dir)} is still missing after unpacking {LRA_RELEASE_URL}")
    return f"{task}: ready in {release_folder(task, data_dir)}; {override(task, data_dir)}"


def prepare(task: str, data_dir: str) -> list[str]:
    """Prepares `task` ("all": every task, going on past failures); returns one status line per task.

    Raises:
      DataError: naming every task that failed, after trying them all.
    """
    lines, errors = [], []
    for t in TASKS if task == "all" else (task,):
        try:
            lines.append(prepare_one(t, data_dir))
        except DataError as e:
            errors.append(str(e))
    if errors:
        raise DataError("; ".join(errors) + (f" (done: {' | '.join(lines)})" if lines else ""))
    return lines


def main(argv) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected argument {' '.join(argv[1:])!r}: this command takes flags only, "
                 f"--task=<{'|'.join(TASKS)}|all> [--data_dir=DIR]")
    if FLAGS.task is None:
        sys.exit(f"error: --task is required: one of {', '.join(TASKS)}, all")
    try:
        for line in prepare(FLAGS.task, FLAGS.data_dir):
            print(line)
    except DataError as e:
        sys.exit(f"error: {e}")


def cli() -> None:
    """The command (`python -m lra_jax.data.prepare`, `lra-prepare`)."""
    app.run(main)


if __name__ == "__main__":
    cli()
