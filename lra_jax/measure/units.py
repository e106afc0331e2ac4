"""Bytes as the reports print them."""

from __future__ import annotations

GIB = 2**30


def gib(n: float | None, spec: str = ".2f", missing: str = "-") -> str:
    """`n` bytes in GiB formatted by `spec`; `missing` for None."""
    return missing if n is None else format(n / GIB, spec)
