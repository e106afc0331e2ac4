"""Commands for experiments, built on the library: `python -m lra_jax.tools.<name>`.

Nothing in attention/, kernels/, models/ or data/ imports this package or the trainer.
"""
