"""lra_jax.measure.out_of_memory: one test for a refusal for device memory, for bench and compile alike."""

import pytest

from lra_jax.measure.out_of_memory import OutOfMemory, is_oom, needed_bytes


@pytest.mark.parametrize("message", [
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm.",
    "Out of memory while trying to allocate 17179869184 bytes.",
    "RuntimeError: CUDA error: out of memory",
    "jaxlib.xla_extension.XlaRuntimeError: OOM when allocating tensor",
])
def test_every_runtimes_words_for_device_memory_are_oom(message):
    assert is_oom(message) and is_oom(RuntimeError(message))


def test_a_kernel_over_the_shared_memory_limit_is_a_kernel_error_not_oom():
    message = "RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, available: 232448"
    assert not is_oom(message)


def test_the_memory_check_refusal_and_other_errors():
    assert is_oom(OutOfMemory("the step needs 40 GiB"))  # the trainer's own check, whatever its words
    assert not is_oom(ValueError("batch_size 7 is not divisible by 2 devices"))


def test_needed_bytes_is_the_largest_size_named():
    assert needed_bytes("Used 17.68G of 15.48G hbm. Exceeded hbm capacity by 2.20G.") == int(17.68 * 2**30)
    assert needed_bytes("no size here") is None
