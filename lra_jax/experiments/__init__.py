"""The experiments' library, below the commands of `lra_jax.tools` and above `lra_jax.measure` and the
trainer: planning and running sweeps, benchmarking steps, compiling steps for accelerator targets, and the
reports and charts made from their results. Nothing here imports a command.
"""
