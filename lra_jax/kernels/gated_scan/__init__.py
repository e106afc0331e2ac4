"""Chunked gated linear attention (GLA, SSD): a Pallas scan kernel and its reference."""

from lra_jax.kernels.gated_scan.api import GATED_SCAN, gated_scan

__all__ = ["GATED_SCAN", "gated_scan"]
