"""Non-causal kernelized (linear) attention: a fused Pallas kernel and its reference.

The op is `api` (`LINEAR`, `linear_attention`); like every kernel package, this one imports nothing itself.
"""
