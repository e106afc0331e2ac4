"""`sweep --estimate --target` (lra_jax.research.sweeps.sweep_modeled): chip-hours from the TPU compiler's
modeled step time, with fake targets and rows; the last test compiles for a real TPU target and is
skipped without libtpu (`[tpu]`)."""

from __future__ import annotations

import dataclasses

from compile_helpers import FakeTarget, make_row, mini, target_or_skip

from lra_jax.research.compilation import compile_step, roofline
from lra_jax.research.sweeps import sweep_modeled, sweep_plan
from lra_jax.measure import accelerators


@dataclasses.dataclass(frozen=True)
class Chip:
    coords: tuple


def test_sweep_estimate_for_a_target_gives_modeled_chip_hours(monkeypatch, capsys):
    runs = sweep_plan.plan("softmax,linformer", "listops", ["mini"], ["0", "1"], "/nonexistent-root")
    monkeypatch.setattr(accelerators, "get", lambda name: FakeTarget(devices=tuple(Chip((x, 0, 0)) for x in range(4))))
    compiled = []

    def fake_compile(variant, label, config, target, modes=compile_step.MODES):
        compiled.append(variant)
        modeled = (dict(modeled_seconds=0.5, roofline_seconds=0.4) if variant == "linformer"
                   else dict(modeled_note=compile_step.NOT_MODELED))
        return [make_row(variant=variant, **modeled)]

    monkeypatch.setattr(compile_step, "compile_config", fake_compile)
    lines = []
    assert sweep_modeled.estimate_sweep(runs, "tpu-v5e:2x2", log=lines.append) == 0
    assert compiled == ["softmax", "linformer"]  # once per shape: seeds share one compilation
    steps = sweep_plan.train_config(runs[-1].command).num_train_steps
    assert lines[-1].startswith(f"total: {2 * steps * 0.5 * 4 / 3600:.2f} chip-hours modeled")
    assert "not counted: 2 runs without a modeled time that passed its roofline check" in lines[-1]
    assert "modeled for tpu-v5e:2x2, 4 chips; not measured" in lines[0]


def test_sweep_estimate_models_unrolled_layers_per_micro_batch_and_leaves_out_loops(monkeypatch):
    """The cost model counts a loop body once: the estimate compiles each run with its layers unrolled and
    one micro-batch, multiplies by the accumulation, and does not count a time that still has loops."""
    runs = sweep_plan.plan("softmax,linformer", "listops", ["mini"], ["0"], "/nonexistent-root")
    monkeypatch.setattr(accelerators, "get", lambda name: FakeTarget(devices=(Chip((0, 0, 0)),)))
    planned, train_config = sweep_plan.train_config(runs[0].command), sweep_plan.train_config

    def accumulating(command):
        config = train_config(command)
        config.grad_accum_steps = 2
        return config

    monkeypatch.setattr(sweep_plan, "train_config", accumulating)
    seen = []

    def fake_compile(variant, label, config, target, modes=compile_step.MODES):
        seen.append((config.model.scan_layers, config.batch_size, config.get("grad_accum_steps", 1)))
        return [make_row(variant=variant, modeled_seconds=0.5, roofline_seconds=0.4, loops=3 if variant == "softmax" else 0)]

    monkeypatch.setattr(compile_step, "compile_config", fake_compile)
    lines = []
    assert sweep_modeled.estimate_sweep(runs, "tpu-v5e:2x2", log=lines.append) == 0
    assert seen == [(False, planned.batch_size // 2, 1)] * 2, lines
    softmax, linformer = lines[1:3]
    assert "3 loop(s) in the step" in softmax and " 1000.00 " in linformer
    assert "not counted: 1 runs without a modeled time" in lines[-1]


def test_modeling_config_unrolls_the_layers_and_takes_one_micro_batch():
    config = mini("linformer")
    config.model.scan_layers, config.model.remat, config.grad_accum_steps = True, True, 4
    modeled, factor = sweep_modeled.modeling_config(config)
    assert factor == 4 and modeled.batch_size == config.batch_size // 4 and modeled.grad_accum_steps == 1
    assert not modeled.model.scan_layers and modeled.model.remat  # the same recomputation
    assert config.model.scan_layers and config.grad_accum_steps == 4  # the run's config is left as it was


def test_the_tpu_cost_model_counts_a_loop_once_so_a_scanned_step_is_a_lower_bound():
    """Mini Linformer with scanned layers and two accumulated micro-batches: the compiled row says its
    modeled time is a lower bound; the modeling config has no loop left and models more time."""
    target = target_or_skip("tpu-v5e:1x1")
    config = mini("linformer")
    config.model.scan_layers, config.grad_accum_steps = True, 2
    (scanned,) = compile_step.compile_config("linformer", "listops", config, target, modes=("train",))
    assert scanned.result == "ok" and scanned.loops >= 2, scanned  # layers, micro-batches
    assert scanned.modeled_note.startswith("a lower bound")
    assert "loop(s) in the step" in roofline.check(dataclasses.asdict(scanned))["reason"]  # never printed
    modeling, factor = sweep_modeled.modeling_config(config)
    (unrolled,) = compile_step.compile_config("linformer", "listops", modeling, target, modes=("train",))
    assert unrolled.loops == 0 and unrolled.modeled_note is None
    assert factor * unrolled.modeled_seconds > 1.5 * scanned.modeled_seconds
