"""Which grid point a (task, scale, variant) reports: chosen on validation accuracy, never on test.

A sweep with a grid (`sweep --grid=optimizer.learning_rate=1e-3,5e-3 --seeds=0,1,2`) lays out its runs as

    <root>/<task>-<scale>/<variant>/<point>/seed<k>/results.json      point: "key=value[,key=value]"

and a sweep without one as `<root>/<task>-<scale>/<variant>/seed<k>`. For every cell (task, scale,
variant) the grid points are compared on their mean validation accuracy over the seeds that every
point has finished (so a two-stage sweep, the grid on one seed and then more seeds at the chosen point,
keeps comparing on that one seed after the others finish). A point with a diverged seed is out. Points
tied on that mean (within `TIE`) are decided by `tie_order`: the run outside a grid first, then the
smaller values, key by key (the lower learning rate), never the order of directory names. The
chosen point reports its test accuracy as mean and sample standard deviation (ddof 1) over all its
finished seeds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections import defaultdict

from lra_jax.training import run_result

SEED_DIR = re.compile(r"seed(-?\d+)$")


@dataclasses.dataclass(frozen=True)
class Result:
    """One run's results.json, reduced to what selection and the chart need."""
    task: str
    scale: str | None
    variant: str
    point: str  # "" outside a grid
    seed: int
    val_accuracy: float | None  # None: diverged
    test_accuracy: float | None
    diverged_at_step: int | None
    path: str
    pretrain: str = "none"  # results.json's "pretrain_objective": "none" from scratch, "masked" self-pretrained
    pretrain_steps: int | None = None  # the pretraining stage's steps and seconds (results.json "pretrain"),
    pretrain_seconds: float | None = None  # its compute, reported apart from fine-tuning; None from scratch
    pretrain_loss: float | None = None  # its last logged training loss: how far the objective got
    device: str | None = None  # results.json "devices": "<count> x <kind>", e.g. "1 x NVIDIA H200"
    dtype: str | None = None  # the compute dtype (config.model.dtype)
    steps_per_second: float | None = None
    num_train_steps: int | None = None
    commit: str | None = None  # the lra_jax commit that ended the run; "...+changes": uncommitted code
    majority_rate: float | None = None  # results.json "test_majority_class_rate": the test set's chance rate

    @property
    def train_seconds(self) -> float | None:
        """The training's compute, steps ÷ the measured steps/s (compilation and evaluation excluded)."""
        if not self.num_train_steps or not self.steps_per_second:
            return None
        return self.num_train_steps / self.steps_per_second

    @property
    def uncommitted(self) -> bool:
        """Whether the run was made from code with uncommitted changes (not reproducible from a commit)."""
        return (self.commit or "").endswith("+changes")

    @property
    def diverged(self) -> bool:
        return self.test_accuracy is None


def grid_point(results_path: str) -> str:
    """'.../<variant>/lr=0.1,wd=0/seed0/results.json' -> 'lr=0.1,wd=0'; '' where no directory of the
    form key=value sits above the seed directory."""
    run_dir = os.path.dirname(results_path)
    parent = os.path.basename(os.path.dirname(run_dir))
    return parent if SEED_DIR.search(os.path.basename(run_dir)) and "=" in parent else ""


def read_result(path: str) -> Result:
    """The Result of one results.json, read with its evidence (`run_result.read`); raises OSError, ValueError,
    KeyError or TypeError if malformed (a document that is not a JSON object, such as a list or a number, is a
    ValueError), DamagedResult (one line) where the run's metrics.jsonl or config.json does not back it."""
    r = run_result.read(os.path.dirname(path))
    diverged = r.get("status") == "diverged"
    config = r.get("config", {})
    return Result(task=r["task"], scale=r.get("scale") or config.get("scale"), variant=r["variant"],
                  point=grid_point(path), seed=int(config.get("seed", 0)),
                  val_accuracy=None if diverged else float(r["val_accuracy"]),
                  test_accuracy=None if diverged else float(r["test_accuracy"]),
                  diverged_at_step=r.get("diverged_at_step"), path=path,
                  pretrain=r.get("pretrain_objective") or config.get("pretrain", {}).get("objective", "none"),
                  pretrain_steps=(r.get("pretrain") or {}).get("num_steps"),
                  pretrain_seconds=(r.get("pretrain") or {}).get("seconds"),
                  pretrain_loss=(r.get("pretrain") or {}).get("final_train_loss"),
                  device=_device(r.get("devices")), dtype=config.get("model", {}).get("dtype"),
                  steps_per_second=r.get("steps_per_second"), num_train_steps=r.get("num_train_steps"),
                  commit=(r.get("versions") or {}).get("lra_jax_commit") if isinstance(r.get("versions"), dict) else None,
                  majority_rate=r.get("test_majority_class_rate"))


def _device(devices: dict | None) -> str | None:
    """results.json's "devices" in words: '1 x NVIDIA H200'; None where it is not recorded."""
    if not isinstance(devices, dict) or not devices.get("kind"):
        return None
    return f"{devices.get('count', 1)} x {devices['kind']}"


def load(runs_dir: str, scale: str | None = None) -> list[Result]:
    """Every results.json under `runs_dir` (recursively) of `scale`; an unreadable one (truncated by a
    full disk or a bad copy) is skipped as an unfinished run, with a one-line warning that names it. One that
    its run's records do not back raises DamagedResult: a result is never shown without its evidence."""
    found = []
    for root, _, files in sorted(os.walk(runs_dir)):
        if "results.json" not in files:
            continue
        path = os.path.join(root, "results.json")
        try:
            result = read_result(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            why = f"{type(error).__name__}: {error}".splitlines()[0]
            print(f"warning: skipping {path} as an unfinished run: it is damaged or incomplete ({why})",
                  file=sys.stderr)
            continue
        if scale is None or result.scale == scale:
            found.append(result)
    return found


@dataclasses.dataclass
class Selection:
    """The reported grid point of one cell and its spread over seeds (accuracies as fractions)."""
    point: str
    seeds: list[int]  # finished seeds of the chosen point
    test_mean: float
    test_std: float | None  # sample std (ddof 1); None with one seed
    val_mean: float  # over `seeds`
    compared_on: list[int]  # the seeds the points were compared on
    candidates: dict[str, float]  # point -> its mean val accuracy over `compared_on`
    diverged: list[str]  # points left out because a seed diverged
    pretrain_steps: int | None = None  # of the chosen point's runs (self-pretrained cells; None otherwise)
    pretrain_seconds: float | None = None  # mean over `seeds`; None where a run does not record it
    pretrain_loss: float | None = None  # likewise
    devices: tuple[str, ...] = ()  # of the chosen point's runs, each once (`Result.device`)
    dtypes: tuple[str, ...] = ()  # likewise, their compute dtypes
    steps_per_second: float | None = None  # mean over `seeds`; None where a run does not record it
    train_seconds: float | None = None  # likewise (`Result.train_seconds`)
    uncommitted: int = 0  # of the chosen point's runs, those made from code with uncommitted changes
    seed_tests: tuple[float, ...] = ()  # test accuracy of each of `seeds`, in their order
    seed_majority_rates: tuple[float | None, ...] = ()  # each seed's test majority-class rate (None: not recorded)

    @property
    def n(self) -> int:
        return len(self.seeds)


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof 1; None for a single value)."""
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


TIE = 1e-9  # mean validation accuracies (fractions) closer than this are a tie, broken by `tie_order`


def _setting_order(value: str) -> tuple[int, float | str]:
    """A grid value's place in the tie order: numbers by value, before anything that is not a number."""
    try:
        return 0, float(value)
    except ValueError:
        return 1, value


def tie_order(point: str) -> tuple:
    """How tied grid points are ordered, first = chosen: the run outside a grid (the config's own
    settings, '') first, then by the values of the point's keys in the order they are written, smaller
    first (numbers by value, not as text: 5e-4 before 0.001). On the learning-rate grids this project
    sweeps, the lower learning rate: with no evidence between them, the more conservative step."""
    pairs = [p.partition("=") for p in re.split(r",(?=[^,=]+=)", point)] if point else []
    return (bool(point), tuple((key, _setting_order(value)) for key, _, value in pairs))


def select(results: list[Result]) -> Selection | None:
    """The grid point with the best mean validation accuracy over the seeds all eligible points have
    finished (`compared_on`); None if every point diverged. Points whose means are within `TIE` of the
    best are tied, and the tie goes by a stated rule, never by the order of directory names: `tie_order`,
    the config's own settings first, then the smaller values (the lower learning rate).

    Test accuracy is read only for the chosen point, after the choice."""
    by_point: dict[str, dict[int, Result]] = defaultdict(dict)
    for r in results:
        if r.seed in by_point[r.point]:
            print(f"warning: {r.path} repeats seed {r.seed} of {by_point[r.point][r.seed].path}; "
                  "the later one is used", file=sys.stderr)
        by_point[r.point][r.seed] = r
    diverged = sorted(p for p, runs in by_point.items() if any(r.diverged for r in runs.values()))
    eligible = {p: runs for p, runs in sorted(by_point.items()) if p not in diverged}
    if not eligible:
        return None
    shared = set.intersection(*(set(runs) for runs in eligible.values()))
    # No seed common to all points (an unfinished sweep): each point on its own seeds.
    candidates = {p: math.fsum(runs[s].val_accuracy for s in (shared or runs)) / len(shared or runs)
                  for p, runs in eligible.items()}
    top = max(candidates.values())
    best = min((p for p, v in candidates.items() if v >= top - TIE), key=tie_order)
    runs = eligible[best]
    seeds = sorted(runs)
    test_mean, test_std = mean_std([runs[s].test_accuracy for s in seeds])

    def seed_mean(field: str) -> float | None:  # over the seeds, of a field every run records
        values = [getattr(runs[s], field) for s in seeds]
        return None if None in values else math.fsum(values) / len(values)

    return Selection(point=best, seeds=seeds, test_mean=test_mean, test_std=test_std,
                     val_mean=math.fsum(runs[s].val_accuracy for s in seeds) / len(seeds),
                     compared_on=sorted(shared), candidates=candidates, diverged=diverged,
                     pretrain_steps=max((runs[s].pretrain_steps or 0 for s in seeds), default=0) or None,
                     pretrain_seconds=seed_mean("pretrain_seconds"), pretrain_loss=seed_mean("pretrain_loss"),
                     devices=tuple(sorted({runs[s].device for s in seeds if runs[s].device})),
                     dtypes=tuple(sorted({runs[s].dtype for s in seeds if runs[s].dtype})),
                     steps_per_second=seed_mean("steps_per_second"), train_seconds=seed_mean("train_seconds"),
                     uncommitted=sum(runs[s].uncommitted for s in seeds),
                     seed_tests=tuple(runs[s].test_accuracy for s in seeds),
                     seed_majority_rates=tuple(runs[s].majority_rate for s in seeds))


def cells(results: list[Result]) -> dict[tuple[str, str | None, str], list[Result]]:
    """(task, scale, variant) -> its results."""
    out = defaultdict(list)
    for r in results:
        out[(r.task, r.scale, r.variant)].append(r)
    return dict(out)


def select_all(results: list[Result]) -> dict[tuple[str, str | None, str], Selection | None]:
    """`select` for every (task, scale, variant) cell."""
    return {cell: select(rs) for cell, rs in sorted(cells(results).items(), key=lambda kv: str(kv[0]))}
