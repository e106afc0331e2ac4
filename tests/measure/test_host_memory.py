"""`host_memory`'s tunables: with them a CPU step reuses its temporaries instead of faulting them in again."""

import os
import subprocess
import sys

import pytest

from lra_jax.measure import host_memory

# One process per case: glibc reads its tunables at process start. The step's temporary (x @ x.T,
# 64 MiB) is above glibc's largest mmap threshold, so by default every call maps its 16,384 pages
# anew and faults them in. One compute thread, as in the bench's `taskset -c 0` protocol.
PROBE = """
import os, resource, statistics
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import jax, jax.numpy as jnp
step = jax.jit(lambda x: jnp.tanh(x @ x.T) @ x)
x = jnp.ones((4096, 64), jnp.float32)
for _ in range(2):
    step(x).block_until_ready()
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults))
"""


def _faults_per_step(tunables: str) -> float:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": tunables}
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return float(result.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables: Linux only")
@pytest.mark.slow
def test_with_freed_memory_kept_a_cpu_step_faults_almost_no_pages_in():
    default = _faults_per_step("")
    if default < 1000:
        pytest.skip(f"this machine faults only {default:.0f} pages a step by default (THP 'always', or not glibc)")
    kept = _faults_per_step(host_memory.tunables("", huge_pages=False, keep_freed=True))
    assert kept <= 0.01 * default, f"{kept:.0f} page faults a step with freed memory kept, {default:.0f} without"


# With freed memory kept, a 256 MiB block freed below a block still in use stays resident (glibc
# can only trim the heap's top); `release_freed` hands its pages back. Prints resident MiB: with the
# block, after freeing it, after release_freed.
RELEASE = """
import os
import numpy as np
from lra_jax.measure import host_memory
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
block = np.ones(2**28, np.uint8)
above = np.ones(2**20, np.uint8)
with_block = resident()
del block
freed = resident()
released = host_memory.release_freed(settle_seconds=0)
print(with_block, freed, resident(), released)
"""


# An XLA step's 256 MiB temporary (8192^2 float32), freed by the runtime's thread after the outputs
# are ready: release_freed, called right after, still hands it back. Prints resident MiB before, after.
RELEASE_AFTER_STEP = """
import os
import jax, jax.numpy as jnp
from lra_jax.measure import host_memory
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
step = jax.jit(lambda x: jnp.tanh(x @ x.T) @ x)
x = jnp.ones((8192, 64), jnp.float32)
for _ in range(3):
    jax.block_until_ready(step(x))
before = resident()
host_memory.release_freed()
print(before, resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables and malloc_trim: Linux only")
@pytest.mark.slow
def test_release_freed_right_after_a_step_returns_its_temporaries():
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "GLIBC_TUNABLES": host_memory.tunables("", huge_pages=False, keep_freed=True)}
    result = subprocess.run([sys.executable, "-c", RELEASE_AFTER_STEP], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    before, after = map(float, result.stdout.split()[-2:])
    if before - after < 1 and not host_memory.release_freed():
        pytest.skip("no glibc malloc_trim here")
    assert before - after > 200, f"{before:.0f} MiB resident before release_freed, {after:.0f} after"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables and malloc_trim: Linux only")
def test_release_freed_returns_a_freed_block_that_kept_memory_holds():
    env = {**os.environ, "GLIBC_TUNABLES": host_memory.tunables("", huge_pages=False, keep_freed=True)}
    result = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    with_block, freed, released, trimmed = result.stdout.split()
    if trimmed != "True":
        pytest.skip("no glibc malloc_trim here")
    assert float(with_block) - float(freed) < 16, "kept memory should hold the freed block"
    assert float(freed) - float(released) > 240, f"release_freed left {released} MiB resident of {freed}"


def test_tunables_replace_our_names_and_keep_the_others():
    current = "glibc.malloc.hugetlb=0:glibc.malloc.tcache_count=0"
    assert host_memory.tunables(current, huge_pages=False, keep_freed=False) == current
    assert host_memory.tunables(current, huge_pages=True, keep_freed=False) == (
        "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1")
    assert host_memory.tunables("", huge_pages=True, keep_freed=True).split(":") == [
        *host_memory.HUGE_PAGES, *host_memory.KEEP_FREED]


def test_keeps_freed_reads_all_of_the_keep_settings_from_the_tunables():
    kept = host_memory.tunables("", huge_pages=True, keep_freed=True)
    assert host_memory.keeps_freed({"GLIBC_TUNABLES": kept})
    assert not host_memory.keeps_freed({"GLIBC_TUNABLES": host_memory.tunables("", huge_pages=True, keep_freed=False)})
    assert not host_memory.keeps_freed({"GLIBC_TUNABLES": kept.replace("glibc.malloc.mmap_max=0", "")})
    assert not host_memory.keeps_freed({})
