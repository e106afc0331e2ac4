"""The research library, below the commands of `lra_jax.tools` and above `lra_jax.measure` and the trainer.

Four sub-packages, bottom up (each imports only those before it, and this package's two shared modules,
`choices` and `progress`):

    benchmarks     timing and memory of train steps on this machine's device (bench cells, their report)
    compilation    lowering and compiling steps for accelerator targets, the roofline, Table 2's model
    sweeps         planning, running and selecting training sweeps, locally or on Slurm, and the full-scale stage
    reports        the chart, the results tables and the generated docs pages, made from what the others wrote

Nothing here imports a command. The folder `experiments/` at the repository root holds the data these
modules write (runs, results, charts); the code lives here.
"""
