"""What the tests share: small per-variant settings, random inputs with padding, scaled comparisons.

Import it as `from helpers import ...` from any folder of tests/ (pytest puts tests/ on the path when it
loads tests/conftest.py; chart_helpers, compile_helpers and distributed_helpers import the same way);
fixtures stay in conftest.py, which is never imported as a module.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from flax import nnx

from lra_jax.attention import registry
from lra_jax.config import task_defaults

# The repository root, for the tests in tests/ and in its sub-folders alike (tests/<layer>/...).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One variant of each kind: full softmax, a block-sparse pattern, a kernelized sum, a token mixer and a
# state space. The fast tier runs the attention contract on these; CI's oldest stack runs the suites marked
# `every_variant` on these alone (tests/conftest.py).
REPRESENTATIVE = ("softmax", "local", "linear", "mixer", "s4d")

# The one table of small per-variant settings (defaults otherwise), for the contract suite and
# the model tests, which run sequences of 20-40 tokens: a window, rank, bucket count or block
# smaller than n, so the checks exercise each approximation rather than a degenerate limit.
SMALL = {
    "local": dict(window=3),
    "linformer": dict(k=8),
    "performer": dict(num_features=16),
    "strided": dict(stride=4),
    "longformer": dict(window=3, num_global=2),
    "bigbird": dict(block=4, num_random_blocks=2),
    "reformer": dict(chunk_size=4, num_buckets=4, num_hashes=2),
    "routing": dict(num_clusters=3, window=12),
    "sinkhorn": dict(block=4),
    "nystromformer": dict(num_landmarks=8, conv_kernel=3),
    "taylor": dict(scale=1.0),
    "lightweight_conv": dict(kernel_size=5),
    "dynamic_conv": dict(kernel_size=5),
    "s4d": dict(state_size=8),
    "lru": dict(state_size=8, r_min=0.5),
    "s5": dict(state_size=8, blocks=2),
    "s6": dict(state_size=4, expand=1, chunk=8),
    "gla": dict(chunk=8, gate_rank=4),  # chunks of 8 over 24-32 tokens: the chunked form with several chunks
    "ssd": dict(state_size=4, expand=1, head_size=8, chunk=8),
    "hyena": dict(filter_features=4, filter_hidden=16),
    "mega": dict(ema_dim=4, shared_dim=8, chunk=8),  # Mega-chunk: several chunks over 24-32 tokens
}

# float32 machine epsilon (2^-23): tolerances below are multiples of it, scaled to the
# magnitudes compared and to the length of the sums that a different order could change.
F32_EPS = float(np.finfo(np.float32).eps)


def reassociation_tol(terms: int, depth: int) -> float:
    """Relative tolerance for float32 results computed in another order (jit vs eager, a scan,
    another thread count, a float64 reference): a sum of `terms` terms may move by terms * eps
    of its scale when reassociated (the worst-case bound), and a result chains `depth` such sums
    (projections, scores, normaliser, weighted sum, iterations). Use it with `assert_close`."""
    return depth * terms * F32_EPS


def build_small(name: str, *, dim: int, num_heads: int, seed: int = 0, **settings) -> nnx.Module:
    """Variant `name` with its `SMALL` settings, overridden or extended by `settings`."""
    return registry.build(name, dim=dim, num_heads=num_heads, rngs=nnx.Rngs(seed), **{**SMALL.get(name, {}), **settings})


def ragged_mask(n: int, lengths) -> np.ndarray:
    """bool [b n]: row i is True on its first lengths[i] positions."""
    return np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def x_and_mask(n: int, lengths, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal x [b n dim] (padded positions hold noise too) and the ragged mask [b n]."""
    x = np.random.default_rng(seed).standard_normal((len(lengths), n, dim)).astype(np.float32)
    return x, ragged_mask(n, lengths)


def qkv_and_mask(n: int, lengths, heads: int, head_dim: int, seed: int = 0):
    """Per-head q, k, v [b n h d] (standard normal, numpy: no compile per shape) and the mask [b n]."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((len(lengths), n, heads, head_dim)).astype(np.float32) for _ in range(3))
    return q, k, v, ragged_mask(n, lengths)


def real(x, mask) -> np.ndarray:
    """x [b n ...] with padded positions (mask False) set to 0: the part the contract constrains."""
    mask = np.asarray(mask)
    return np.where(mask.reshape(mask.shape + (1,) * (np.ndim(x) - mask.ndim)), np.asarray(x), 0.0)


def assert_close(actual, desired, tol: float, err_msg: str = "") -> None:
    """|actual - desired| <= tol * max|desired| elementwise, plus rtol=tol: an error relative to
    the scale of the compared values, so entries near zero are not held to a relative bound
    that only reassociated sums would break."""
    desired = np.asarray(desired, np.float64)
    scale = float(np.abs(desired).max()) if desired.size else 0.0
    np.testing.assert_allclose(np.asarray(actual, np.float64), desired, rtol=tol, atol=tol * scale,
                               err_msg=err_msg)


def splits_equal(a: dict, b: dict) -> bool:
    """Two {split: (tokens, labels)} dicts hold the same arrays for every split of `a`."""
    return a.keys() == b.keys() and all(
        np.array_equal(a[s][0], b[s][0]) and np.array_equal(a[s][1], b[s][1]) for s in a)


# For the child processes of the process tests (a SIGTERM, a resume, several processes agreeing, an
# exit status, a sharded step against one device): XLA compiles their CPU programs without LLVM's
# optimisation passes. Most of such a run is compiling its init, train and eval steps, and this
# takes about a quarter less CPU time (test_cli, test_distributed, test_kernel_sharding and
# test_trainer together, one process: 251 -> 193 CPU s on jax 0.10.2, 222 -> 188 s on jax 0.12).
# Nothing those tests check depends on it: every run a test compares with another is compiled the
# same way, in a child process given these flags too.
FAST_COMPILE = "--xla_backend_optimization_level=0"


def child_xla_flags(*flags: str) -> str:
    """XLA_FLAGS for a test's child process: `flags` and FAST_COMPILE."""
    return " ".join((*flags, FAST_COMPILE))


def tiny_config(cache_dir, name: str = "softmax", **settings):
    """ListOps with 256 short generated examples and a one-layer, 16-wide model."""
    config = task_defaults.get_config("listops,mini", attention=dict(name=name, **settings))
    config.max_len = 32
    config.data.cache_dir = str(cache_dir)
    config.data.generator.update(num_train=256, num_val=64, num_test=64, min_length=5, max_length=32)
    config.model.update(num_layers=1, num_heads=2, emb_dim=16, mlp_dim=32, dropout_rate=0.1,
                        attention_dropout_rate=0.1)
    config.batch_size = 16
    config.num_train_steps = 12
    config.eval_every = 6
    config.checkpoint_every = 6
    config.log_every = 3
    return config


def slow_except(cases, keep) -> list:
    """`cases` for `pytest.mark.parametrize` (or a fixture's params) split between the suite's two tiers:
    a case in `keep` stays in the fast tier, `pytest -m "not slow"`, and so does a case of several
    values (a tuple) whose first value is in `keep`; every other case is marked `slow` and runs only in
    the full suite, `pytest`. A case that is already a `pytest.param` keeps its id and marks. (A tuple
    is read as the values of several arguments: not for one argument whose values are tuples.)"""
    out = []
    for case in cases:
        if isinstance(case, type(pytest.param())):
            values, marks, id_ = case.values, list(case.marks), case.id
        else:
            values, marks, id_ = (case if isinstance(case, tuple) else (case,)), [], None
        if any(values[0] == k or (len(values) > 1 and values == k) for k in keep):
            out.append(case)
        else:
            out.append(pytest.param(*values, marks=[*marks, pytest.mark.slow], id=id_))
    return out
