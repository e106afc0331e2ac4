"""glibc malloc settings for train steps on the CPU: huge pages, and freed memory kept for the next step.

XLA:CPU takes each execution's temporaries from malloc and frees them when the step ends. By default
glibc serves a block above its mmap threshold (32 MiB at most) by a fresh mmap and unmaps it on free,
so every step maps its temporaries anew and faults each 4 KiB page of them in again: a softmax layer's
forward and backward at length 2048 (batch 8) faults 262,000 pages a step, 1 GiB, at about 2.5 us each.

    glibc.malloc.hugetlb=1             large blocks are backed by transparent huge pages (2 MiB)
    glibc.malloc.arena_max=1           every thread allocates from the main heap,
    glibc.malloc.mmap_max=0            which grows by brk instead of mapping large blocks
    glibc.malloc.trim_threshold=2^40   and is not given back to the kernel

With the last three, freed temporaries stay mapped and the next step reuses them; the process keeps
its peak host memory until it exits (a training loop needs it again at the next step anyway). glibc
reads them once, at process start (GLIBC_TUNABLES, glibc >= 2.35 for hugetlb), so they are set in the
environment of a process about to be started. With one compute thread (`taskset -c 0`) the reuse is
complete; with several, malloc's free lists fragment and some steps still map fresh memory.

Two executables taking turns (the bench's dropout rates) would keep both steps' temporaries: the
second's blocks do not fit the first's freed holes below the arrays allocated since, so the heap
grows by the second step's temporaries (a `softmax` cell at 4K, batch 8, 13 GiB a step, was killed
for memory on this 24 GiB machine).
`release_freed` (glibc's malloc_trim) hands the freed pages back before the other executable runs,
so the process holds one step's temporaries at a time, as a training run does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time

HUGE_PAGES = ("glibc.malloc.hugetlb=1",)
KEEP_FREED = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold=1099511627776")


def tunables(current: str, *, huge_pages: bool, keep_freed: bool) -> str:
    """GLIBC_TUNABLES `current` ("a=1:b=2") with the settings asked for added; ours replace the same names."""
    ours = [*(HUGE_PAGES if huge_pages else ()), *(KEEP_FREED if keep_freed else ())]
    names = {setting.split("=")[0] for setting in ours}
    kept = [setting for setting in current.split(":") if setting and setting.split("=")[0] not in names]
    return ":".join([*kept, *ours])


def keeps_freed(environ: dict[str, str] | None = None) -> bool:
    """Whether malloc keeps freed memory mapped in a process with `environ` (default: this one's, which
    glibc read at its start): GLIBC_TUNABLES holds all of KEEP_FREED."""
    environ = os.environ if environ is None else environ
    return set(KEEP_FREED) <= set(environ.get("GLIBC_TUNABLES", "").split(":"))


def release_freed(settle_seconds: float = 0.1) -> bool:
    """Returns the heap's free pages to the kernel (glibc's `malloc_trim(0)`: whole free pages anywhere in
    the heap, not only at its top), after `settle_seconds`: XLA:CPU frees an execution's temporaries
    on its own thread just after the outputs are ready, so a trim right after `block_until_ready`
    misses them (a 1 GiB temporary: kept by a trim at once, released by one 1 ms later).
    True if glibc released memory; False where there is no glibc or nothing to release."""
    trim = _malloc_trim()
    if trim is None:
        return False
    time.sleep(settle_seconds)
    return bool(trim(0))


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # no C library by that name, or not glibc (musl, macOS)
        return None
