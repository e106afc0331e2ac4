"""Chunked gated linear attention (GLA, SSD): a Pallas scan kernel and its reference.

The op is `api` (`GATED_SCAN`, `gated_scan`); like every kernel package, this one imports nothing itself.
"""
