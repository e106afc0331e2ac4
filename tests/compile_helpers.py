"""Compile rows and targets without a compiler (a fake target, a row as the compile command writes it), and
the real targets where their compiler is installed: shared by the compile tests
(tests/research/compilation/test_compile.py) and the modeled sweep's (tests/research/sweeps/test_sweep_modeled.py)."""

from __future__ import annotations

import dataclasses

import pytest

from lra_jax.measure import accelerators
from lra_jax.research.choices import config_files
from lra_jax.research.compilation import compile_step, lowering

GIB = 2**30


def make_row(**changes):
    row = compile_step.Row(variant="softmax", task="listops", target="tpu-v5e:2x2", mode="train", result="ok",
                          global_batch=32, devices=4, per_device_batch=8, device_memory=16 * GIB,
                          memory={"argument": GIB, "output": GIB, "alias": GIB, "temp": 2 * GIB, "total": 3 * GIB},
                          flops=2e12, kernels="pallas-mosaic-splash x4", compile_seconds=12.0)
    return dataclasses.replace(row, **changes)


@dataclasses.dataclass(frozen=True)
class FakeTarget:
    name: str = "tpu-v5e:2x2"
    platform: str = "tpu"
    devices: tuple = (0, 1, 2, 3)
    gpu_kind: str | None = None
    memory_per_device: int = 16 * GIB


def target_or_skip(name: str):
    reason = accelerators.available()["tpu" if name.startswith("tpu") else "cuda"]
    if reason:
        pytest.skip(f"compiling for {name} needs its compiler: {reason}")
    return accelerators.get(name)


def mini(variant: str, task: str = "listops"):
    return lowering.load_config(config_files()[variant], task, "mini")
