"""Kernel benchmark: forward + backward time of each Pallas kernel against its XLA forms.

    python -m lra_jax.tools.kernel_bench                # n = 1K..16K, head dims 32 and 64
    python -m lra_jax.tools.kernel_bench --lengths=1024,4096 --head-dims=64 --only=flash
    python -m lra_jax.tools.bench --kernels             # the same, from the main bench

For every length n and head dim d it times jit(value_and_grad) of sum(out * r)
(one forward and one backward) for

    flash         jax.nn.dot_product_attention (implementation "xla", and "cudnn" on
                  GPU), the softmax variant's XLA form, and the flash Pallas kernel;
                  both of the last two also with attention dropout 0.1 (training at
                  the full-scale configs' rate)
    block_sparse  the local (window 128) and BigBird (block 64) variants' XLA forms
                  and the same variants with impl="pallas"
    linear        the two-einsum XLA form (elu + 1 features) and the fused kernel

with ragged padding (every second sequence 3/4 long). Each entry records the
median time over `--repeats` runs after a warm-up, the compile-time temp memory
XLA reports, or the error (e.g. out of memory for dense attention at 16K).
Results go to experiments/results/kernels-<device>.json, naming the device.
Pallas entries are skipped without a GPU (interpreting them measures nothing)
unless --interpret is given.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from lra_jax import provenance
from lra_jax.attention import registry
from lra_jax.kernels import pallas_available
from lra_jax.kernels.flash.api import flash_attention
from lra_jax.kernels.linear.api import linear_attention
from lra_jax.kernels.masking import Mask
from lra_jax.measure.kernel_timing import time_fwd_bwd
from lra_jax.tools import parse_command_line


KERNELS = ("flash", "block_sparse", "linear")


def _variant(name: str, impl: str, heads: int, d: int, n: int, dropout_rate: float = 0.0, **settings):
    layer = registry.build(name, dim=heads * d, num_heads=heads, rngs=nnx.Rngs(0), impl=impl, max_len=n,
                           dropout_rate=dropout_rate, **settings)
    training = dropout_rate > 0
    return lambda q, k, v, mask: layer.attend(q, k, v, mask, deterministic=not training,
                                              rngs=nnx.Rngs(dropout=0) if training else None)


def candidates(kernel: str, heads: int, d: int, n: int, with_pallas: bool, interpret: bool):
    """(label, fn(q, k, v, mask) -> out) pairs for one kernel family."""
    out = []
    if kernel == "flash":
        # The key padding as lengths: cuDNN takes no [b, 1, 1, n] mask (it wants a bias of [.., n, n]).
        dpa = lambda impl: lambda q, k, v, mask: jax.nn.dot_product_attention(
            q, k, v, key_value_seq_lengths=mask.sum(-1, dtype=jnp.int32), implementation=impl)
        out.append(("dot_product_attention[xla]", dpa("xla")))
        if jax.default_backend() == "gpu":
            out.append(("dot_product_attention[cudnn]", dpa("cudnn")))
        out.append(("softmax[xla]", _variant("softmax", "xla", heads, d, n)))
        out.append(("softmax[xla,dropout=0.1]", _variant("softmax", "xla", heads, d, n, dropout_rate=0.1)))
        if with_pallas:
            for rate in (0.0, 0.1):
                out.append((f"flash[pallas{f',dropout={rate}' if rate else ''}]",
                            lambda q, k, v, mask, rate=rate: flash_attention(
                                q, k, v, Mask(key_mask=mask), impl="pallas", interpret=interpret, dropout_rate=rate,
                                dropout_seed=jnp.zeros((1,), jnp.uint32) if rate else None)))
    elif kernel == "block_sparse":
        for name, settings in (("local", {"window": 128}), ("bigbird", {"block": 64})):
            out.append((f"{name}[xla]", _variant(name, "xla", heads, d, n, **settings)))
            if with_pallas:
                out.append((f"{name}[pallas]", _variant(name, "pallas", heads, d, n, **settings)))
    elif kernel == "linear":
        for impl in ("xla", "pallas") if with_pallas else ("xla",):
            out.append((f"linear[{impl}]", lambda q, k, v, mask, impl=impl: linear_attention(
                q, k, v, Mask(key_mask=mask), impl=impl, interpret=interpret)))
    return out


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("only", ",".join(KERNELS), "comma list of " + ", ".join(KERNELS), flag_values=values)
    flags.DEFINE_string("lengths", "1024,2048,4096,8192,16384", "comma list of sequence lengths n",
                        flag_values=values)
    flags.DEFINE_string("head-dims", "32,64", "comma list of head dims d", flag_values=values)
    flags.DEFINE_integer("batch", 4, "sequences per batch", flag_values=values)
    flags.DEFINE_integer("heads", 4, "attention heads", flag_values=values)
    flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "dtype of q, k and v", flag_values=values)
    flags.DEFINE_integer("repeats", 10, "timed runs per entry (the median is recorded)", flag_values=values)
    flags.DEFINE_bool("interpret", False, "time Pallas in the interpreter (no GPU)", flag_values=values)
    flags.DEFINE_string("out", None, "JSON path (default experiments/results/kernels-<device>.json)",
                        flag_values=values)


def main(argv: list[str] | None = None) -> dict:
    args, _ = parse_command_line("lra_jax.tools.kernel_bench", __doc__, define_flags, argv)
    head_dims = args["head-dims"].value

    device = jax.devices()[0]
    device_name = f"{device.platform}-{getattr(device, 'device_kind', 'unknown')}".replace(" ", "_")
    with_pallas = pallas_available() or args.interpret
    dtype = jnp.dtype(args.dtype)
    results = []
    for n in (int(x) for x in args.lengths.split(",")):
        for d in (int(x) for x in head_dims.split(",")):
            rng = np.random.default_rng(0)
            q, k, v = (jnp.asarray(rng.standard_normal((args.batch, n, args.heads, d)), dtype) for _ in range(3))
            lengths = np.where(np.arange(args.batch) % 2, 3 * n // 4, n)
            mask = jnp.asarray(np.arange(n)[None, :] < lengths[:, None])
            for kernel in args.only.split(","):
                for label, fn in candidates(kernel, args.heads, d, n, with_pallas, args.interpret):
                    entry = {"kernel": kernel, "impl": label, "n": n, "head_dim": d}
                    try:
                        entry.update(time_fwd_bwd(fn, q, k, v, mask, args.repeats))
                    except Exception as error:  # noqa: BLE001  (OOM and unsupported paths are results too)
                        entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                    print(json.dumps(entry), flush=True)
                    results.append(entry)

    report = {
        "device": device_name,
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "versions": provenance.library_versions(),
        "batch": args.batch,
        "heads": args.heads,
        "dtype": args.dtype,
        "pallas": "compiled" if pallas_available() else ("interpret" if args.interpret else "skipped"),
        "measure": "median seconds of one jitted forward + backward",
        "results": results,
    }
    path = pathlib.Path(args.out or f"experiments/results/kernels-{device_name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return report


def cli() -> None:
    """The command (`python -m lra_jax.tools.kernel_bench`, `lra-kernel-bench`)."""
    main()


if __name__ == "__main__":
    cli()
