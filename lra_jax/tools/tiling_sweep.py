"""Time the dense flash kernel at each tiling on the local GPU: what the chosen blocks cost.

    python -m lra_jax.tools.tiling_sweep                   # head dims 64 and 128, n 4096, float32, dropout 0.1

The Triton kernels' blocks are chosen without trial compiles (`lra_jax.kernels.tiling`,
`flash.pallas_gpu.choose_dense_tiling`). This times one jitted forward + backward of the dense
flash kernel (`lra_jax.measure.kernel_timing`) at every (B_q, B_k, warps, stages) in the grid that fits
the GPU's shared memory, every second sequence 3/4 long, and marks the tiling the library chooses.
Results: experiments/results/tilings-<device>.json. Needs a GPU (interpreted kernels time nothing).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from lra_jax import provenance
from lra_jax.kernels import pallas_available, tiling
from lra_jax.kernels.flash import pallas_gpu
from lra_jax.measure.kernel_timing import time_fwd_bwd

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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128", help="powers of two >= 16")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--dropout-rate", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None, help="JSON path (default experiments/results/tilings-<device>.json)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
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
                  "heads": args.heads, "dtype": args.dtype, "dropout_rate": args.dropout_rate,
                  "shared_memory": limit, "measure": "median seconds of one jitted forward + backward",
                  "complete": complete, "results": results}
        path.write_text(json.dumps(report, indent=1))
        return report

    for d in (int(x) for x in args.head_dims.split(",")):
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
                entry.update(time_fwd_bwd(kernel_at(tiles, args.dropout_rate), q, k, v, mask, args.repeats))
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
