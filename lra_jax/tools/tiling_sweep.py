"""Time the dense flash kernel at each tiling on the local GPU: what the chosen blocks cost.

    python -m lra_jax.tools.tiling_sweep                   # head dims 64 and 128, n 4096, float32, dropout 0.1

The Triton kernels' blocks are chosen without trial compiles (`lra_jax.kernels.tiling`,
`flash.pallas_gpu.choose_dense_tiling`). This times one jitted forward + backward of the dense
flash kernel (`lra_jax.measure.kernel_timing`) at every (B_q, B_k, warps, stages) in the grid that fits
the GPU's shared memory, every second sequence 3/4 long, and marks the tiling the library chooses.
Results: experiments/results/tilings-<device>.json. Needs a GPU (interpreted kernels time nothing).
"""

from __future__ import annotations

import itertools
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from lra_jax import provenance
from lra_jax.kernels import pallas_available, tiling
from lra_jax.kernels.flash import pallas_gpu
from lra_jax.measure.kernel_timing import time_fwd_bwd
from lra_jax.tools import parse_command_line


BLOCKS = ((16, 16), (32, 32), (64, 32), (32, 64), (64, 64), (128, 64))
WARPS = (4, 8)


def kernel_at(tiles: tiling.Tiling, rate: float, interpret: bool = False):
    """fn(q, k, v, mask) -> out: the dense Triton kernel at `tiles` (n a multiple of both blocks; padded
    query rows are left as the kernel leaves them, the api zeroes them)."""
    seed = pallas_gpu.dropout_state(jnp.array([7], jnp.uint32) if rate else None)

    def fn(q, k, v, mask):
        inputs = pallas_gpu.KernelInputs.dense(mask.astype(jnp.int32), q.shape[1], seed)
        static = pallas_gpu.KernelStatic(1 / math.sqrt(q.shape[-1]), tiles, dropout_rate=rate, interpret=interpret)
        return pallas_gpu.attention(q, k, v, inputs, static)
    return fn


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, on `values` (`parse_command_line`)."""
    flags.DEFINE_string("head-dims", "64,128", "powers of two >= 16", flag_values=values)
    flags.DEFINE_integer("n", 4096, "sequence length", flag_values=values)
    flags.DEFINE_integer("batch", 8, "sequences per batch", flag_values=values)
    flags.DEFINE_integer("heads", 4, "attention heads", flag_values=values)
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "dtype of q, k and v", flag_values=values)
    flags.DEFINE_float("dropout-rate", 0.1, "attention dropout rate of the kernel", flag_values=values)
    flags.DEFINE_integer("repeats", 7, "timed runs per tiling (the median is recorded)", flag_values=values)
    flags.DEFINE_string("out", None, "JSON path (default experiments/results/tilings-<device>.json)",
                        flag_values=values)


def main(argv: list[str] | None = None) -> dict:
    args, _ = parse_command_line("lra_jax.tools.tiling_sweep", __doc__, define_flags, argv)
    head_dims, dropout_rate = args["head-dims"].value, args["dropout-rate"].value
    if not pallas_available():
        sys.exit("error: the tiling sweep times compiled Triton kernels and needs a GPU (jax.default_backend() "
                 f"is {jax.default_backend()!r})")

    device = jax.devices()[0]
    device_name = f"{device.platform}-{device.device_kind}".replace(" ", "_")
    limit = tiling.shared_memory()
    versions = provenance.library_versions()
    results = []
    path = pathlib.Path(args.out or f"experiments/results/tilings-{device_name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)

    def save(complete: bool) -> dict:  # after every tiling: a sweep cut short keeps what it timed
        report = {"device": device_name, "versions": versions, "n": args.n, "batch": args.batch,
                  "heads": args.heads, "dtype": args.dtype, "dropout_rate": dropout_rate,
                  "shared_memory": limit, "measure": "median seconds of one jitted forward + backward",
                  "complete": complete, "results": results}
        path.write_text(json.dumps(report, indent=1))
        return report

    for d in (int(x) for x in head_dims.split(",")):
        rng = np.random.default_rng(0)
        q, k, v = (jnp.asarray(rng.standard_normal((args.batch, args.n, args.heads, d)), args.dtype) for _ in range(3))
        lengths = np.where(np.arange(args.batch) % 2, 3 * args.n // 4, args.n)
        mask = jnp.asarray(np.arange(args.n)[None, :] < lengths[:, None])
        chosen = pallas_gpu.choose_dense_tiling(64, 64, d)
        for (bq, bk), warps, stages in itertools.product(BLOCKS, WARPS, tiling.STAGES):
            needed = pallas_gpu.shared_memory_bytes(bq, bk, d, stages)
            if needed > limit:
                continue
            tiles = tiling.Tiling(bq, bk, warps, stages, needed)
            entry = {"head_dim": d, "block_q": bq, "block_k": bk, "num_warps": warps, "num_stages": stages,
                     "chosen": (bq, bk, warps, stages) == (chosen.block_q, chosen.block_k, chosen.num_warps,
                                                            chosen.num_stages)}
            try:
                entry.update(time_fwd_bwd(kernel_at(tiles, dropout_rate), q, k, v, mask, args.repeats))
            except Exception as error:  # noqa: BLE001  (a tiling the compiler refuses is a result too)
                entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            print(json.dumps(entry), flush=True)
            results.append(entry)
            save(complete=False)
    report = save(complete=True)
    print(f"wrote {path}")
    return report


def cli() -> None:
    """The command (`python -m lra_jax.tools.tiling_sweep`, `lra-tiling-sweep`)."""
    main()


if __name__ == "__main__":
    cli()
