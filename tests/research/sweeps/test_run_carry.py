"""Runs that outlive one machine (lra_jax.research.sweeps.run_carry): a run stopped on one machine, packed, unpacked
into a fresh root with a fresh data cache and resumed there ends with the metrics.jsonl and results of a run that
never moved; the packed file keeps only the newest checkpoint, refuses what is too large, and is unpacked only
where no newer state exists. Through the stage that unpacks it (`python -m lra_jax.tools.full_scale`), a carried
run arrives bit for bit, and an archive that is truncated, damaged, oversized or holds anything pack does not
write is refused in one line, with nothing of it written."""

import hashlib
import io
import json
import os
import random
import signal
import tarfile

import pytest
from helpers import F32_EPS

from lra_jax.config import task_defaults
from lra_jax.config.settings import from_config
from lra_jax.errors import LraError
from lra_jax.research.sweeps import run_carry
from lra_jax.tools import full_scale
from lra_jax.training import step_metrics, trainer

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
    check_finite, signalled = step_metrics.check_finite, []

    def terminated_after_step_6(step_metrics, step, *args):
        if step == 6 and not signalled:
            signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        check_finite(step_metrics, step, *args)

    monkeypatch.setattr(step_metrics, "check_finite", terminated_after_step_6)
    first = tmp_path / "first"
    assert trainer.train_and_evaluate(from_config(tiny_pathfinder(tmp_path / "cache")), str(first / RUN)) is None
    monkeypatch.setattr(step_metrics, "check_finite", check_finite)
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


# Carried runs are verified, through the stage that unpacks them (`python -m lra_jax.tools.full_scale`): at
# mini scale, on 40 generated images, stopped by its time box right after the data, so no run trains.
STAGE = ["--scale=mini", "--tasks=pathfinder", "--variants=softmax", "--parallel=1", "--runs_per_device=1",
         "--time_box=0.001", "--override=pathfinder:--config.data.generator.num_examples=40"]
NAME = "pathfinder-mini/softmax/seed0"  # RUN as the manifest names it


@pytest.fixture
def stage(tmp_path, monkeypatch, capsys):
    """stage(root) runs the stage's main on `root`; returns (exit status, stdout, stderr)."""
    monkeypatch.setenv("LRA_JAX_CACHE", str(tmp_path / "cache"))

    def run(root):
        with pytest.raises(SystemExit) as exited:
            full_scale.main([f"--root={root}", f"--scratch={tmp_path / 'scratch'}", *STAGE])
        out = capsys.readouterr()
        return exited.value.code, out.out, out.err
    return run


def carried_run(workdir) -> dict[str, bytes]:
    """A stopped run's files (a last checkpoint at step 8, the best at 4), of fixed content; {name in run: bytes}."""
    noise = random.Random(0)
    files = {"config.json": b'{"seed": 0}\n', "metrics.jsonl": b'{"step": 3, "train/loss": 0.69}\n',
             "checkpoints/last/8/state/d/0a1b": noise.randbytes(3000) + bytes(2000),
             "checkpoints/last/8/_CHECKPOINT_METADATA": b'{"step": 8}', "checkpoints/last/4/state/d/0a1b": b"old",
             "checkpoints/best/4/state/d/77ff": noise.randbytes(1500)}
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(workdir, name)), exist_ok=True)
        with open(os.path.join(workdir, name), "wb") as f:
            f.write(data)
    return {n: b for n, b in files.items() if "/last/4/" not in n}  # the older save stays behind


def manifest(files: dict[str, bytes], run: str = NAME, step: int = 8) -> bytes:
    entries = {n: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()}
    return json.dumps({"format": run_carry.FORMAT, "runs": {run: {"step": step, "files": entries}}}).encode()


def write_archive(path, members: list[tuple[str, bytes | tarfile.TarInfo]]):
    """A tar.gz of (name, content) regular files, or (name, TarInfo) for anything else."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members:
            if isinstance(content, tarfile.TarInfo):
                content.name = name
                tar.addfile(content)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))


def link(kind: bytes, target: str = "/etc/passwd") -> tarfile.TarInfo:
    info = tarfile.TarInfo()
    info.type, info.linkname = kind, target
    return info


def assert_refused(result, root, says: str):
    """One `error:` line naming the archive and `says`, exit 2, no traceback, nothing restored or written."""
    code, out, err = result
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, (code, out[-2000:], err[-2000:])
    assert f"{root}/carried.tar.gz cannot be unpacked" in errors[0] and says in errors[0], errors[0]
    assert "Traceback" not in err and "carried run restored" not in out
    assert os.listdir(root) == ["carried.tar.gz"], "nothing of a refused archive is written"


def test_a_carried_run_travels_bit_for_bit_with_every_file_sized_and_hashed_in_its_manifest(tmp_path, stage, capsys):
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    files = carried_run(first / RUN)
    full_scale.main([f"--root={first}", "--scale=mini", "--tasks=pathfinder", f"--pack={tmp_path / 'full.tar.gz'}"])
    assert f"carried.tar.gz: {NAME}" in capsys.readouterr().out
    with tarfile.open(tmp_path / "full.tar.gz") as tar:  # as committed, then unpacked into the next machine's root
        tar.extractall(fresh, filter="data")
    with tarfile.open(fresh / "carried.tar.gz") as tar:
        assert tar.getnames()[0] == run_carry.MANIFEST
        packed = json.load(tar.extractfile(run_carry.MANIFEST))
    assert packed["runs"][NAME]["files"] == json.loads(manifest(files))["runs"][NAME]["files"]

    code, out, err = stage(fresh)
    assert code == 130 and f"carried run restored: {NAME} at step 8" in out, (out, err)
    restored = {os.path.relpath(os.path.join(parent, n), fresh / RUN).replace(os.sep, "/")
                for parent, _, names in os.walk(fresh / RUN) for n in names}
    assert restored == set(files)
    for name, data in files.items():
        assert (fresh / RUN / name).read_bytes() == data, name
    assert not [n for n in os.listdir(fresh) if n.startswith(".carried-")], "the staging directory is removed"

    run_carry.pack(str(first), [str(first / RUN)], str(tmp_path / "again.tar.gz"))
    run_carry.pack(str(first), [str(first / RUN)], str(tmp_path / "again2.tar.gz"))
    assert (tmp_path / "again.tar.gz").read_bytes() == (tmp_path / "again2.tar.gz").read_bytes(), "repeatable"


def packed(tmp_path) -> bytes:
    carried_run(tmp_path / "packed" / RUN)
    run_carry.pack(str(tmp_path / "packed"), [str(tmp_path / "packed" / RUN)], str(tmp_path / "c.tar.gz"))
    return (tmp_path / "c.tar.gz").read_bytes()


def test_a_truncated_archive_is_one_line_and_restores_nothing(tmp_path, stage):
    data = packed(tmp_path)
    for cut in (len(data) // 2, len(data) - 4):  # in the compressed data; in the gzip trailer (its length)
        root = tmp_path / f"cut{cut}"
        os.makedirs(root)
        (root / "carried.tar.gz").write_bytes(data[:cut])
        assert_refused(stage(root), root, "EOFError")


def test_every_single_bit_flip_in_the_data_or_the_trailer_is_refused(tmp_path, stage):
    # Not the gzip header's time and OS bytes (4-9), nor the unused bits of the last compressed byte: no byte
    # of the content depends on them.
    data = packed(tmp_path)
    n = len(data)
    for position, bit in ((10, 0), (300, 3), (n // 3, 5), (n // 2, 7), (2 * n // 3, 1), (n - 40, 4), (n - 8, 0),
                          (n - 1, 6)):
        root = tmp_path / f"flip{position}"
        os.makedirs(root)
        flipped = bytearray(data)
        flipped[position] ^= 1 << bit
        (root / "carried.tar.gz").write_bytes(bytes(flipped))
        assert_refused(stage(root), root, "")


GOOD = {"config.json": b'{"seed": 0}\n', "checkpoints/last/8/state/data": b"state"}
RESULTS = {"config.json": b'{"seed": 0}\n', "results.json": b'{"test_accuracy": 0.99, "val_accuracy": 0.99}\n'}
STATE = f"{NAME}/checkpoints/last/8/state"


def members(files=GOOD, run=NAME, extra=(), step=8) -> list[tuple[str, bytes | tarfile.TarInfo]]:
    """The manifest of `files` (name in run -> bytes), then the files, then `extra` members."""
    return [(run_carry.MANIFEST, manifest(files, run=run, step=step)), *((f"{run}/{n}", b) for n, b in files.items()),
            *extra]


@pytest.mark.parametrize("case, says", [
    ("../..", "its manifest names a run '../..'"),
    ("pathfinder-mini/../../..", "its manifest names a run 'pathfinder-mini/../../..'"),
    ("absolute", "its manifest names a run '/"),
    ("results only", "results.json is not a file a run carries"),
    ("results only, no hashes", "its manifest is not of format 2 (each file's size and sha256)"),
    ("symbolic link", f"{STATE}/link is a symbolic link; only regular files are carried"),
    ("hard link", f"{STATE}/link is a hard link; only regular files are carried"),
    ("device", f"{STATE}/tty is a device; only regular files are carried"),
    ("a byte changed", f"{STATE}/data does not match its sha256 in the manifest"),
    ("a file not in the manifest", f"{STATE}/extra is not a file its manifest names"),
    ("no manifest first", "its first member is not the manifest carried.json"),
])
def test_an_archive_pack_does_not_write_is_refused_whole(tmp_path, stage, case, says):
    elsewhere = str(tmp_path / "elsewhere" / "run")
    given = {
        "../..": lambda: members(run="../.."),
        "pathfinder-mini/../../..": lambda: members(run="pathfinder-mini/../../.."),
        "absolute": lambda: members(run=elsewhere),
        "results only": lambda: members(RESULTS, step=7),
        "results only, no hashes": lambda: [
            (run_carry.MANIFEST, json.dumps({"runs": {NAME: {"step": 7, "bytes": 80}}}).encode()),
            *members(RESULTS)[1:]],
        "symbolic link": lambda: members(extra=[(f"{STATE}/link", link(tarfile.SYMTYPE))]),
        "hard link": lambda: members(extra=[(f"{STATE}/link", link(tarfile.LNKTYPE, f"{NAME}/config.json"))]),
        "device": lambda: members(extra=[(f"{STATE}/tty", link(tarfile.CHRTYPE, ""))]),
        "a byte changed": lambda: [*members()[:2], (f"{STATE}/data", b"stave")],
        "a file not in the manifest": lambda: members(extra=[(f"{STATE}/extra", b"x")]),
        "no manifest first": lambda: [*members()[1:], members()[0]],
    }[case]()
    root = tmp_path / "root"
    write_archive(root / "carried.tar.gz", given)
    assert_refused(stage(root), root, says)
    assert not (tmp_path / "elsewhere").exists()


def test_an_oversized_member_is_refused_before_a_byte_of_it_is_written(tmp_path, stage, monkeypatch):
    copied = []
    copy = run_carry._copy_member
    monkeypatch.setattr(run_carry, "_copy_member", lambda source, size, path: copied.append(size) or copy(
        source, size, path))
    big = bytes(run_carry.RUN_LIMIT_BYTES + 1)  # a few kilobytes compressed
    honest = {**GOOD, "checkpoints/last/8/state/big": big}
    for case, given, says in (
            ("honest", members(honest), f"{NAME} holds {len(big) + 17} bytes, over the {run_carry.RUN_LIMIT_BYTES} "
                                         "a run may carry"),
            ("lying", [members({**GOOD, "checkpoints/last/8/state/big": b"small"})[0], *members(honest)[1:]],
             f"{STATE}/big is {len(big)} bytes, its manifest says 5")):
        root = tmp_path / case
        write_archive(root / "carried.tar.gz", given)
        assert os.path.getsize(root / "carried.tar.gz") < 20_000
        assert_refused(stage(root), root, says)
    assert copied and max(copied) < len(big), "only the small files before the lying one were copied"


def test_a_run_whose_directory_leads_outside_the_root_through_a_link_is_refused(tmp_path, stage):
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    write_archive(root / "carried.tar.gz", members())
    os.symlink(outside, root / "pathfinder-mini")
    code, out, err = stage(root)
    assert code == 2 and f"run {NAME} resolves outside {root} through a link" in err, (out, err)
    assert os.listdir(outside) == [] and sorted(os.listdir(root)) == ["carried.tar.gz", "pathfinder-mini"]
