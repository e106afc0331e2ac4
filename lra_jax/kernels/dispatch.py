"""The one place a kernel is chosen: each op's table of implementations, and `plan` over it.

Each kernel op (`FLASH`, `BLOCK_SPARSE`, `LINEAR`, `GATED_SCAN`, in each kernel package's `api`) is
a `KernelOp`: its implementations in order of preference, each a name (as runs record it), the callable
that runs it and what it supports (Pallas backend, platforms, attention dropout, dtypes, interpreter).
`plan(impl, target, op, ...)` picks one for a target and returns it in a `KernelPlan`; the op's
entry point runs `plan.implementation` and decides nothing again. An attention variant names its
op once (`TokenMixer.kernel_op`) and passes its layer's plan to the op. What `plan` picks for each op,
impl and platform is generated from these declarations into docs/kernels.md
(`lra_jax.research.reports.kernel_table`), the one copy of that table.

An op without a kernel for the target's backend (linear attention, the gated scan on TPU), or whose kernels there
lack what the call needs (dropout, a dtype, a setting the variant says it cannot serve), runs XLA,
and the plan says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from lra_jax.kernels.target import Target, current_target, pallas_backend, platform_of, resolve_impl

# Names of the kernels, as runs record them.
XLA, TRITON, SPLASH = "xla", "pallas-triton", "pallas-mosaic-splash"
MOSAIC_FLASH = "pallas-mosaic-flash"  # our TPU kernel with attention dropout (flash/pallas_mosaic.py)
MOSAIC_BLOCK_SPARSE = "pallas-mosaic-block-sparse"  # that kernel over a block layout (block_sparse/pallas_mosaic.py)

FLOAT_DTYPES = ("float32", "bfloat16")
EVERY_PLATFORM = ("cpu", "gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to run a kernel op and what it supports.

    run: the op's implementation, `run(q, k, v, inputs, static)` with the op's typed inputs.
    backend: "triton" | "mosaic", the Pallas backend; None for the XLA form.
    platforms: the targets it is chosen for (Triton on "cpu": in the interpreter, for tests).
    dropout: whether it applies the attention dropout itself.
    causal: whether it serves a causal mask (`masking.Mask.causal`).
    dtypes: the q, k, v dtypes it takes.
    interpret: whether it can run in the Pallas interpreter.
    """

    name: str
    run: Callable = dataclasses.field(repr=False, compare=False)
    backend: str | None = None
    platforms: tuple[str, ...] = EVERY_PLATFORM
    dropout: bool = True
    causal: bool = True
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    interpret: bool = True


@dataclasses.dataclass(frozen=True)
class KernelOp:
    """A kernel op's table: its XLA form first, then its Pallas kernels in order of preference."""

    name: str
    implementations: tuple[Implementation, ...]

    def __post_init__(self):
        if not self.implementations or self.implementations[0].backend is not None:
            raise ValueError(f"kernel op {self.name}: the first implementation must be its XLA form")

    @property
    def xla(self) -> Implementation:
        return self.implementations[0]

    def __getitem__(self, name: str) -> Implementation:
        for implementation in self.implementations:
            if implementation.name == name:
                return implementation
        raise KeyError(f"kernel op {self.name} has no implementation {name!r}")

    def kernels(self, backend: str) -> tuple[Implementation, ...]:
        """The op's Pallas kernels on `backend` ("triton" | "mosaic"), preferred first."""
        return tuple(i for i in self.implementations if i.backend == backend)

    @property
    def backends(self) -> frozenset[str]:
        """The Pallas backends the op has a kernel for."""
        return frozenset(i.backend for i in self.implementations if i.backend is not None)


def _variant_code(*args):
    raise TypeError("a variant without a kernel op runs its own jnp code, not its plan's implementation")


NO_KERNEL = KernelOp("none", (Implementation(XLA, _variant_code),))  # the plan of a variant without a kernel


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """What one call or layer runs: the implementation, on which platform, interpreted or not, whether
    the kernel applies the attention dropout, and why not a kernel where the impl asked for one."""

    implementation: Implementation
    platform: str
    interpret: bool = False
    reason: str | None = None
    dropout: bool = False

    @property
    def kernel(self) -> str:
        """The implementation's name, as runs record it ("xla", "pallas-triton", ...)."""
        return self.implementation.name

    @property
    def uses_pallas(self) -> bool:
        return self.implementation.backend is not None


def plan(impl: str, target: Target, op: KernelOp, *, dropout_active: bool = False, dtype: str | None = None,
         causal: bool = False, unsupported: str | None = None) -> KernelPlan:
    """The implementation of `op` a call runs on `target`.

    Args:
      impl: "auto" | "xla" | "pallas" (the config's choice).
      target: the platform the call is built for (`current_target()` at a layer's build time).
      op: the kernel op's table.
      dropout_active: attention dropout in this call.
      dtype: the inputs' dtype name, where known.
      causal: the call's mask is causal.
      unsupported: why the caller's settings keep the kernel from running on this target, or None.
    """
    xla = lambda reason=None: KernelPlan(op.xla, target.platform, reason=reason)  # noqa: E731
    if resolve_impl(impl, platform=target.platform) == "xla":
        return xla()
    backend = pallas_backend(target.platform)
    offered = [i for i in op.kernels(backend) if target.platform in i.platforms]
    if not offered:
        return xla(f"no {backend} kernel for this variant on {target.platform}")
    if dropout_active:
        offered = [i for i in offered if i.dropout]
        if not offered:
            return xla(f"attention dropout is not in the {backend} kernel")
    if causal:
        offered = [i for i in offered if i.causal]
        if not offered:
            return xla(f"a causal mask is not in the {backend} kernel")
    if dtype is not None:
        offered = [i for i in offered if dtype in i.dtypes]
        if not offered:
            return xla(f"the {backend} kernel does not take {dtype}")
    if target.interpret:
        offered = [i for i in offered if i.interpret]
        if not offered:
            return xla(f"the {backend} kernel cannot run in the Pallas interpreter")
    if unsupported:
        return xla(unsupported)
    return KernelPlan(offered[0], target.platform, interpret=target.interpret, dropout=dropout_active)


def call_target(platform: str | None, interpret: bool) -> Target:
    """The target of a direct call: `platform` (default: the current kernel target's) and `interpret`."""
    return Target(current_target().platform if platform is None else platform_of(platform), interpret)


def check_plan(op: KernelOp, plan: KernelPlan, dropout_rate: float = 0.0, causal: bool = False) -> None:
    """Raises where `plan` does not name one of `op`'s implementations (a plan made for another op), or
    names one without attention dropout for a call with dropout, or one that is not causal for a causal mask."""
    if not any(plan.implementation is implementation for implementation in op.implementations):
        raise ValueError(f"the plan's kernel {plan.kernel!r} is not an implementation of the {op.name} op; "
                         f"plan with kernels.plan(..., {op.name.upper()})")
    if dropout_rate > 0 and not plan.implementation.dropout:
        raise ValueError(f"the {plan.kernel} kernel has no attention dropout; plan with dropout_active=True")
    if causal and not plan.implementation.causal:
        raise ValueError(f"the {plan.kernel} kernel does not serve a causal mask; plan with causal=True")
