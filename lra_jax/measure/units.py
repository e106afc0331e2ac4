"""Bytes and durations as the reports print them."""

from __future__ import annotations

GIB = 2**30


def gib(n: float | None, spec: str = ".2f", missing: str = "-") -> str:
    """`n` bytes in GiB formatted by `spec`; `missing` for None."""
    return missing if n is None else format(n / GIB, spec)


def duration(seconds: float | None, missing: str = "-") -> str:
    """0.0053 -> '5.3 ms', 41.04 -> '41 s', 150 -> '2.5 min', 204915 -> '56.9 h'; `missing` for None."""
    if seconds is None:
        return missing
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 90:
        return f"{seconds:.3g} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h"
