"""Runs that outlive one machine (lra_jax.research.sweeps.run_carry): a run stopped on one machine, packed, unpacked
into a fresh root with a fresh data cache and resumed there ends with the metrics.jsonl and results of a run that
never moved; the packed file keeps only the newest checkpoint, refuses what is too large, and is unpacked only
where no newer state exists."""

import json
import os
import signal
import tarfile

import pytest
from helpers import F32_EPS

from lra_jax.config import task_defaults
from lra_jax.config.settings import from_config
from lra_jax.errors import LraError
from lra_jax.research.sweeps import run_carry
from lra_jax.training import trainer

RUN = os.path.join("pathfinder-mini", "softmax", "seed0")


def tiny_pathfinder(cache_dir):
    """Mini Pathfinder (cosine schedule) with 320 generated 16x16 images and a one-layer, 16-wide model."""
    config = task_defaults.get_config("pathfinder,mini", attention=dict(name="softmax"))
    config.data.cache_dir = str(cache_dir)
    config.data.generator.num_examples = 320
    config.model.update(num_layers=1, num_heads=2, emb_dim=16, mlp_dim=32, dropout_rate=0.1,
                        attention_dropout_rate=0.1)
    config.batch_size = 16
    config.num_train_steps = 12
    config.optimizer.warmup_steps = 3
    config.update(eval_every=4, checkpoint_every=4, log_every=3)
    return config


def lines(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.one_stack("newest")  # packing and unpacking are this package's Python; the device machine runs newest
def test_a_run_carried_to_a_fresh_machine_ends_as_one_that_never_moved(tmp_path, monkeypatch):
    straight = str(tmp_path / "straight" / RUN)
    expected = trainer.train_and_evaluate(from_config(tiny_pathfinder(tmp_path / "cache")), straight)

    # the first machine: SIGTERM after step 6 (past a checkpoint, the best one and a log line)
    check_finite, signalled = trainer.check_finite, []

    def terminated_after_step_6(step_metrics, step, *args):
        if step == 6 and not signalled:
            signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        check_finite(step_metrics, step, *args)

    monkeypatch.setattr(trainer, "check_finite", terminated_after_step_6)
    first = tmp_path / "first"
    assert trainer.train_and_evaluate(from_config(tiny_pathfinder(tmp_path / "cache")), str(first / RUN)) is None
    monkeypatch.setattr(trainer, "check_finite", check_finite)
    packed, left = run_carry.pack(str(first), [str(first / RUN)], str(tmp_path / "carried.tar.gz"))
    assert packed == [RUN] and left == []
    with tarfile.open(tmp_path / "carried.tar.gz") as tar:
        names = tar.getnames()
    last = {n.split("/checkpoints/last/")[1].split("/")[0] for n in names if "/checkpoints/last/" in n}
    assert last == {"6"}, "only the newest last checkpoint travels, the one the run stopped at"
    assert any("/checkpoints/best/4/" in n for n in names)

    # the next machine: a fresh root and a fresh data cache (the images generated again)
    second = tmp_path / "second"
    assert run_carry.unpack(str(second), str(tmp_path / "carried.tar.gz")) == [f"{RUN} at step 6"]
    resumed = trainer.train_and_evaluate(from_config(tiny_pathfinder(tmp_path / "cache2")), str(second / RUN))

    a, b = lines(straight), lines(str(second / RUN))
    assert [sorted(line) for line in b] == [sorted(line) for line in a] and len(a) > 4
    for x, y in zip(a, b):
        for key in x:  # the same compiled step on the same batches from a bit-exact checkpoint
            assert y[key] == pytest.approx(x[key], rel=8 * F32_EPS, abs=1e-6), (x["step"], key)
    assert (resumed["test_accuracy"], resumed["val_accuracy"]) == (expected["test_accuracy"], expected["val_accuracy"])


def fake_run(workdir, steps=(4, 8), best=4, size=100):
    for kind, numbers in (("last", steps), ("best", (best,))):
        for n in numbers:
            os.makedirs(os.path.join(workdir, "checkpoints", kind, str(n), "state"))
            with open(os.path.join(workdir, "checkpoints", kind, str(n), "state", "data"), "wb") as f:
                f.write(b"x" * size)
    for name in run_carry.RECORD_FILES:
        with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
            f.write("{}\n")


def test_pack_keeps_what_fits_says_why_the_rest_stays_and_unpack_never_overwrites_newer_state(tmp_path, monkeypatch):
    root = tmp_path / "root"
    small, large, fresh = (str(root / "cell" / v / "seed0") for v in ("small", "large", "fresh"))
    fake_run(small)
    fake_run(large, size=3000)
    os.makedirs(fresh)
    monkeypatch.setattr(run_carry, "RUN_LIMIT_BYTES", 2000)
    carried, left = run_carry.pack(str(root), [small, large, fresh], str(tmp_path / "c.tar.gz"))
    assert carried == ["cell/small/seed0"]
    assert [line.split(":")[0] for line in left] == ["cell/large/seed0", "cell/fresh/seed0"]
    assert "resumes only on this machine" in left[0] and "no checkpoint yet" in left[1]

    target = tmp_path / "target"
    fake_run(str(target / "cell" / "small" / "seed0"), steps=(12,))  # this machine went further: it wins
    assert run_carry.unpack(str(target), str(tmp_path / "c.tar.gz")) == []
    assert sorted(os.listdir(target / "cell" / "small" / "seed0" / "checkpoints" / "last")) == ["12"]
    assert run_carry.unpack(str(tmp_path / "elsewhere"), str(tmp_path / "c.tar.gz")) == ["cell/small/seed0 at step 8"]
    assert run_carry.unpack(str(tmp_path / "elsewhere"), str(tmp_path / "missing.tar.gz")) == []

    (tmp_path / "bad.tar.gz").write_text("not a tar file", encoding="utf-8")
    with pytest.raises(LraError, match="bad.tar.gz cannot be unpacked"):
        run_carry.unpack(str(tmp_path / "x"), str(tmp_path / "bad.tar.gz"))
