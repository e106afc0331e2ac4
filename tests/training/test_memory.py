"""lra_jax.training.memory: a CPU train step is held to 1.5x XLA's temporaries and 256 MiB, not to the estimate."""

import types

import pytest

from lra_jax.config import settings as config_settings
from lra_jax.config import task_defaults
from lra_jax.errors import ConfigError
from lra_jax.training import memory

GIB = 2**30


class Compiled:
    """A compiled step as the check reads it: its `memory_analysis()`."""

    def __init__(self, temp: float, arguments: float = 0.1, outputs: float = 0.1, aliased: float = 0.1):
        self.analysis = types.SimpleNamespace(
            temp_size_in_bytes=int(temp * GIB), argument_size_in_bytes=int(arguments * GIB),
            output_size_in_bytes=int(outputs * GIB), alias_size_in_bytes=int(aliased * GIB))

    def memory_analysis(self):
        return self.analysis


def full_scale_listops():
    return config_settings.from_config(task_defaults.get_config("listops", attention=dict(name="softmax")))


def test_the_host_step_is_one_and_a_half_times_the_temporaries_the_outputs_not_aliased_and_256_mib():
    step = Compiled(temp=10, arguments=1, outputs=1.5, aliased=1)
    assert memory.host_step_bytes(step) == int(15 * GIB + 0.5 * GIB + 256 * 2**20)
    assert memory.compiled_estimate(step) == int(11.5 * GIB)


def test_full_scale_softmax_listops_fits_its_estimate_but_is_refused_on_a_host_that_cannot_hold_it(monkeypatch):
    """XLA:CPU's figures for the full-scale softmax ListOps step (batch 32), against 20 GiB available."""
    step = Compiled(temp=18_809_938_904 / GIB, arguments=120_039_684 / GIB, outputs=119_784_234 / GIB,
                    aliased=119_783_556 / GIB)
    monkeypatch.setattr(memory, "available_memory", lambda: (20 * GIB, "this machine's available memory"))
    monkeypatch.setattr(memory, "_resident_bytes", lambda: GIB)
    assert memory.compiled_estimate(step) < 20 * GIB  # what the check held it to
    with pytest.raises(ConfigError) as refused:
        memory.check_fits(step, full_scale_listops())
    message = str(refused.value)
    assert message.startswith("the train step needs about 27.5 GiB of host memory (1.0 GiB this process holds and "
                              "1.5x XLA's 17.5 GiB of temporaries) but this machine has 21.0 GiB for it"), message
    for fix in ("--config.grad_accum_steps=k (now 1", "--config.batch_size (now 32)", "--config=<file>:listops,mini",
                "a GPU or TPU"):
        assert fix in message
    monkeypatch.setattr(memory, "available_memory", lambda: (27 * GIB, "this machine's available memory"))
    memory.check_fits(step, full_scale_listops())  # 26.5 GiB added: fits
