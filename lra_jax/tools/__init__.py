"""Commands for experiments, each a thin CLI (flags, `main`, `cli`) over its library in
`lra_jax.experiments` (and `lra_jax.measure`): `python -m lra_jax.tools.<name>`.

Nothing in attention/, kernels/, models/ or data/ imports this package or the trainer.
"""
