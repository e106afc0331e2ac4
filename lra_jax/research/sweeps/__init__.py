"""Training sweeps: the plan of runs, their execution (local or Slurm, behind one Executor), the selection of a
grid point on validation, carried runs, device sharing, and the full-scale LRA stage built on them."""
