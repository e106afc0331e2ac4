"""The contract every Pallas implementation of a kernel op keeps, written once.

Each op's test class subclasses `KernelContract`, naming its table (`op`, a `dispatch.KernelOp`) and
its calls (`cases`, each a `Case`). tests/kernels/conftest.py runs every test below once for each
(case, implementation) pair whose implementation the table declares able to run the case (dropout,
causality, dtype, the Pallas interpreter), with that implementation's plan forced: so a kernel is
tested on every call it would be planned for, including those its op's `plan` would give to another
kernel (our Mosaic flash kernel without dropout, which `auto` runs as splash).

What holds for every implementation and case, against the op's XLA form (`op.xla`, the reference):
  - the output and the gradients of a random projection of it with respect to every input agree
    within float32 reassociation, interpreted on CPU and compiled where the accelerator is present;
  - nothing is NaN or infinite, and the rows no real key reaches (padded queries, a sequence of
    padding only, a real query without a real key) are exactly 0;
  - with bfloat16 inputs, the result is within bfloat16 rounding of the XLA form on the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from helpers import assert_close, reassociation_tol
from lra_jax.kernels.dispatch import Implementation, KernelOp, KernelPlan
from lra_jax.kernels.masking import Mask

DROPOUT_SEED = np.array([2024], np.uint32)
# The platform whose kernels each Pallas backend serves (interpreted on CPU here).
PLATFORM = {"triton": "gpu", "mosaic": "tpu"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One call of a kernel op.

    inputs: dtype -> (arrays, zero_rows): the differentiated operands (numpy, so no compile per shape)
      and the [b, n] query rows whose output must be exactly 0, or None where the op has no padding.
    call: (plan, *arrays) -> output: the op's entry point with this case's mask and settings.
    terms: the most terms one output sums (the reassociation tolerance's count).
    dropout, causal: what the case asks of an implementation (its table's `dropout` and `causal`).
    backends: the Pallas backends it runs on. The tile-walking cases, sized for Mosaic's 128-tiles,
      are Mosaic's; Triton's blocks of 16 and 32 are walked by the small cases.
    fast: in the fast tier (`pytest -m "not slow"`) for the Triton kernel; every other pair is `slow`.
    """

    inputs: Callable[[np.dtype], tuple[tuple[np.ndarray, ...], np.ndarray | None]]
    call: Callable
    terms: int
    dropout: bool = False
    causal: bool = False
    backends: tuple[str, ...] = ("triton", "mosaic")
    fast: bool = False

    def runs_on(self, implementation: Implementation, dtype: str = "float32", interpreted: bool = True) -> bool:
        return (implementation.backend in self.backends and (implementation.interpret or not interpreted)
                and (implementation.dropout or not self.dropout) and (implementation.causal or not self.causal)
                and dtype in implementation.dtypes)


def attention_case(entry: Callable, b: int, n: int, h: int, d: int, lengths, *, pattern: dict | None = None,
                   causal: bool = False, every_query_real: bool = False, dropout_rate: float = 0.0,
                   backends=("triton", "mosaic"), fast: bool = False, **settings) -> Case:
    """A call of an attention op (`entry(q, k, v, mask, plan=, ...)`): q, k, v [b n h d] standard normal, the
    keys of row i real up to lengths[i], `pattern` (a band, segments, global tokens, a block matrix: `Mask`
    fields) and `causal` on top, `settings` (blocks, scale, feature map) passed on.

    every_query_real: queries past a row's length are real too (they see no real key where the length is 0).
    """
    key_mask = np.arange(n)[None, :] < np.asarray(lengths)[:, None]
    query_mask = np.ones_like(key_mask) if every_query_real else key_mask
    mask = Mask(key_mask=key_mask, query_mask=query_mask, causal=causal, **(pattern or {}))
    if dropout_rate:
        settings = dict(settings, dropout_rate=dropout_rate, dropout_seed=DROPOUT_SEED)

    def inputs(dtype):
        rng = np.random.default_rng(0)
        zero_rows = ~query_mask | (np.asarray(lengths) == 0)[:, None]  # the diagonal is allowed: others see a key
        return tuple(rng.standard_normal((b, n, h, d)).astype(dtype) for _ in range(3)), zero_rows

    return Case(inputs, lambda plan, q, k, v: entry(q, k, v, mask, plan=plan, **settings), terms=n,
                dropout=dropout_rate > 0, causal=causal, backends=tuple(backends), fast=fast)


def forced_plan(implementation: Implementation, case: Case, interpret: bool = True) -> KernelPlan:
    """The plan that runs `implementation` whatever `plan` would choose."""
    platform = PLATFORM.get(implementation.backend, "cpu")
    return KernelPlan(implementation, platform, interpret=interpret, dropout=case.dropout)


def output_and_grads(case: Case, plan: KernelPlan, arrays) -> tuple[np.ndarray, list[np.ndarray]]:
    """(y, d<y, r>/d(every input)) of one call, jitted, in float32; r is a fixed random projection."""
    shape = jax.eval_shape(lambda *x: case.call(plan, *x), *arrays).shape
    r = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    loss = lambda *x: jnp.sum(case.call(plan, *x).astype(jnp.float32) * r)  # noqa: E731
    run = jax.jit(lambda *x: (case.call(plan, *x), jax.grad(loss, argnums=tuple(range(len(x))))(*x)))
    out, grads = run(*arrays)
    return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads]


def assert_agrees(got, want, zero_rows, out_tol: float, grad_tol: float) -> None:
    """(output, gradients) of a kernel against the reference's: finite, within the tolerances of each array's
    largest entry, every reference gradient nonzero (there to compare), the rows no real key reaches exactly 0."""
    (out, grads), (want_out, want_grads) = got, want
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)
    assert_close(out, want_out, out_tol, "output")
    for i, (g, ref) in enumerate(zip(grads, want_grads)):
        assert np.abs(ref).max() > 0, f"input {i} has no gradient to compare"
        assert_close(g, ref, grad_tol, f"gradient of input {i}")
    if zero_rows is not None:
        assert (out[zero_rows] == 0).all(), "a row that no real key reaches is not 0"


class KernelContract:
    """Subclass with `op` and `cases` (name -> `Case`); `bfloat16_cases` names the cases run in bfloat16."""

    op: KernelOp
    cases: dict[str, Case]
    bfloat16_cases: tuple[str, ...] = ()

    def _against_the_reference(self, case: Case, implementation: Implementation, interpret: bool):
        arrays, zero_rows = case.inputs(np.float32)
        got = output_and_grads(case, forced_plan(implementation, case, interpret), arrays)
        want = output_and_grads(case, forced_plan(self.op.xla, case), arrays)
        # The kernel sums in blocks what the reference sums at once: float32 sums of <= `terms` terms,
        # ~4 chained forward (scores, max, normaliser, weighted sum) and ~8 with the backward pass,
        # against each array's largest entry. A wrong mask, scale or index is O(1).
        assert_agrees(got, want, zero_rows, reassociation_tol(case.terms, depth=4),
                      reassociation_tol(case.terms, depth=8))

    def test_matches_the_reference(self, case: Case, implementation: Implementation):
        self._against_the_reference(case, implementation, interpret=True)

    def test_compiled_matches_the_reference(self, case: Case, implementation: Implementation):
        # jax's default precision runs float32 dots as TF32 on Ampere and Hopper, in the kernels and in
        # XLA's reference alike (up to ~1e-3 of the scale: TF32's 10-bit mantissa, not a kernel error).
        # Both sides at full float32 precision, the float32 tolerance holds and a wrong mask still shows.
        with jax.default_matmul_precision("float32"):
            self._against_the_reference(case, implementation, interpret=False)

    def test_bfloat16_within_its_rounding(self, case: Case, implementation: Implementation):
        arrays, zero_rows = case.inputs(jnp.bfloat16)
        got = output_and_grads(case, forced_plan(implementation, case), arrays)
        # The same bfloat16 values, upcast, through the reference: the kernel's bfloat16 operands and
        # outputs round to 2^-8 of their scale each, with float32 accumulation inside; a few roundings
        # compound forward (4 x 2^-7) and twice as many backward. A float32 path broken by bfloat16
        # (a -inf mask value, a lost scale) is off by O(1).
        upcast = tuple(np.asarray(x, np.float32) for x in arrays)
        want = output_and_grads(case, forced_plan(self.op.xla, case), upcast)
        eps = float(jnp.finfo(jnp.bfloat16).eps)
        assert_agrees(got, want, zero_rows, 4 * eps, 8 * eps)


def assert_layer_kernel_agrees_with_xla(variant: str, settings: dict, dim: int = 16, n: int = 27) -> None:
    """The layer `variant` with impl="pallas" (its Triton kernel, interpreted) against impl="xla": the loss, the
    input's gradient and every parameter's, on two rows, one padded."""
    from flax import nnx

    from lra_jax.attention import registry
    from lra_jax.kernels.dispatch import TRITON, XLA

    x = np.random.default_rng(3).standard_normal((2, n, dim)).astype(np.float32)
    mask = np.arange(n)[None, :] < np.array([[n], [19]])
    results = []
    for impl in ("xla", "pallas"):
        layer = registry.build(variant, dim=dim, num_heads=2, rngs=nnx.Rngs(0), impl=impl, **settings)
        assert layer.kernel_plan(deterministic=False).kernel == (TRITON if impl == "pallas" else XLA)
        graph, state = nnx.split(layer)
        loss = lambda state, x, graph=graph: jnp.sum(nnx.merge(graph, state)(x, mask, deterministic=True) ** 2)
        results.append(jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(state, x))
    (loss_xla, (params_xla, x_xla)), (loss_pallas, (params_pallas, x_pallas)) = results
    tol = reassociation_tol(n, depth=8)  # a layer's sums in another order, forward and backward
    assert_close(loss_pallas, loss_xla, tol)
    assert_close(x_pallas, x_xla, tol, err_msg="dx")
    for path, g in nnx.to_flat_state(params_pallas):
        assert_close(g.get_value(), dict(nnx.to_flat_state(params_xla))[path].get_value(), tol, err_msg=str(path))
