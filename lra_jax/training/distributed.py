"""The data-parallel mesh (`make_mesh`), and joining a multi-process run (`train --distributed`): one
process per host, or several on one machine.

Either the cluster is detected (TPU VM; Slurm under `srun`: `jax.distributed.initialize()` finds it;
the batch script of a one-node Slurm job is a one-process run, `slurm_batch_settings`), or all three
of coordinator address, process count and process id are given, as flags or as JAX's environment
variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (flags win). CPU processes
reduce over gloo, so two processes on one machine form a run over localhost.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh

from lra_jax.errors import LraError

ENV = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
       "process_id": "JAX_PROCESS_ID"}
FLAG = {name: f"--{name}" for name in ENV}


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
    """A 1-D data-parallel mesh, axis "data", over `devices` (default: every device of every process)."""
    return Mesh(np.array(devices or jax.devices()), ("data",))


def explicit_settings(coordinator_address: str | None, num_processes: int | None,
                      process_id: int | None) -> dict | None:
    """The coordinator, process count and id from flags, else from the environment; None if none is
    given (detect the cluster). Raises LraError for a partial or malformed setting."""
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    given = {name: value if value is not None else os.environ.get(ENV[name]) or None for name, value in given.items()}
    if all(value is None for value in given.values()):
        return None
    missing = [f"{FLAG[name]} (or {ENV[name]})" for name, value in given.items() if value is None]
    if missing:
        raise LraError(f"a multi-process run needs all of coordinator address, process count and process id; "
                       f"missing {', '.join(missing)}. Give all three, or none to detect the cluster (TPU VM, Slurm)")
    host, _, port = str(given["coordinator_address"]).rpartition(":")
    if not host or not port.isdigit():
        raise LraError(f"coordinator address {given['coordinator_address']!r} is not HOST:PORT; "
                       "use e.g. --coordinator_address=127.0.0.1:23457 (the address of process 0)")
    try:
        count, index = int(given["num_processes"]), int(given["process_id"])
    except ValueError:
        raise LraError(f"process count {given['num_processes']!r} and process id {given['process_id']!r} must be "
                       "integers, e.g. --num_processes=2 --process_id=0") from None
    if count < 1 or not 0 <= index < count:
        raise LraError(f"process id {index} is not in 0..{count - 1} (process count {count}); "
                       "give each process its own id from 0 to the count minus one")
    return {"coordinator_address": given["coordinator_address"], "num_processes": count, "process_id": index}


def slurm_batch_settings() -> dict | None:
    """In a Slurm job's batch script itself (SLURM_JOB_ID set, but not a task of `srun`: no
    SLURM_STEP_NODELIST, which jax's Slurm detection needs): a one-process run on a one-node job;
    None elsewhere (inside `srun` jax finds coordinator, count and id from SLURM_STEP_NODELIST,
    SLURM_NTASKS, SLURM_PROCID). Raises LraError for a multi-node job's batch script."""
    if "SLURM_JOB_ID" not in os.environ or "SLURM_STEP_NODELIST" in os.environ:
        return None
    nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
    if nodes != "1":
        raise LraError(f"train --distributed runs in the batch script of a {nodes}-node Slurm job, as one "
                       f"process: start one process per node with srun, e.g. srun --ntasks={nodes} "
                       "--ntasks-per-node=1 python -m lra_jax.train ... --distributed "
                       "(scripts/slurm_sweep.sbatch does that when the job has several nodes)")
    port = int(os.environ["SLURM_JOB_ID"]) % 4096 + 61440  # a port of the job's own, as jax picks under srun
    return {"coordinator_address": f"127.0.0.1:{port}", "num_processes": 1, "process_id": 0}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: int = 300) -> None:
    """Joins the run (`jax.distributed.initialize`), before anything touches a device."""
    settings = explicit_settings(coordinator_address, num_processes, process_id) or slurm_batch_settings()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes; GPU/TPU ignore it
    try:
        if settings is None:
            jax.distributed.initialize(initialization_timeout=timeout_s)
        else:
            jax.distributed.initialize(**settings, initialization_timeout=timeout_s)
    except (ValueError, RuntimeError) as error:
        where = (f"coordinator {settings['coordinator_address']} as process {settings['process_id']} of "
                 f"{settings['num_processes']}" if settings else "the cluster")
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise LraError(f"could not join {where}: {first_line}. Outside a TPU VM or Slurm job give "
                       "--coordinator_address, --num_processes and --process_id (or JAX_COORDINATOR_ADDRESS, "
                       "JAX_NUM_PROCESSES, JAX_PROCESS_ID), the same address and count to every process") from None
