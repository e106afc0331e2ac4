"""Mamba's selective scan (S6): its op (`api.SELECTIVE_SCAN`), its XLA form and oracle (`reference`) and its
Triton kernel (`pallas_gpu`). Import from the modules; the package imports nothing."""
