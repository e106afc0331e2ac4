"""`host_memory`'s tunables: with them a CPU step reuses its temporaries instead of faulting them in again."""

import os
import subprocess
import sys

import pytest

from lra_jax import host_memory

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
def test_with_freed_memory_kept_a_cpu_step_faults_almost_no_pages_in():
    default = _faults_per_step("")
    if default < 1000:
        pytest.skip(f"this machine faults only {default:.0f} pages a step by default (THP 'always', or not glibc)")
    kept = _faults_per_step(host_memory.tunables("", huge_pages=False, keep_freed=True))
    assert kept <= 0.01 * default, f"{kept:.0f} page faults a step with freed memory kept, {default:.0f} without"


def test_tunables_replace_our_names_and_keep_the_others():
    current = "glibc.malloc.hugetlb=0:glibc.malloc.tcache_count=0"
    assert host_memory.tunables(current, huge_pages=False, keep_freed=False) == current
    assert host_memory.tunables(current, huge_pages=True, keep_freed=False) == (
        "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1")
    assert host_memory.tunables("", huge_pages=True, keep_freed=True).split(":") == [
        *host_memory.HUGE_PAGES, *host_memory.KEEP_FREED]
