"""Whether a failed step ran out of device memory, and how much the compiler said it needed.

One test for every command that records a refusal for memory (bench's cells, compile's steps): the
markers of XLA's and the runtimes' messages, except a kernel asking for more shared memory than a GPU
has, which is a kernel error whatever the batch.
"""

from __future__ import annotations

import re

# XLA's status code, the GPU and TPU runtimes' words ("Out of memory while trying to allocate",
# "Ran out of memory in memory space hbm"), and the short form some allocators use.
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM")
NOT_OOM_MARKERS = ("Shared memory size limit exceeded",)  # a Triton kernel's blocks: a kernel error


class OutOfMemory(Exception):
    """The step does not fit: raised by the trainer's memory check or by XLA."""


def is_oom(error: BaseException | str) -> bool:
    """Whether `error` (an exception or its message) is a refusal for device memory."""
    if isinstance(error, OutOfMemory):
        return True
    message = str(error)
    if any(marker in message for marker in NOT_OOM_MARKERS):
        return False
    return any(marker in message for marker in OOM_MARKERS)


def needed_bytes(message: str) -> int | None:
    """The memory a RESOURCE_EXHAUSTED message says the program needs (largest size it names)."""
    sizes = []
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([KMG])i?B?\b", message):
        sizes.append(float(number) * {"K": 2**10, "M": 2**20, "G": 2**30}[unit])
    return int(max(sizes)) if sizes else None
