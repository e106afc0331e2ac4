"""Steps lowered and compiled for accelerator targets (compile-only TPU and GPU devices): the compile matrix,
fit planning, the roofline, the TPU cost model's loops and the LRA paper's Table 2 from compiled steps."""
