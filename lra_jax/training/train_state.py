"""The train state: what a training step carries from one step to the next, and what a checkpoint holds.

A frozen pytree (`flax.struct.dataclass`), so a jitted step takes and returns it whole and donates it.
On disk it is the plain dict `as_tree()` gives ({"step", "params", "rest", "opt_state"}), the layout every
checkpoint has had; `from_tree` reads it back, so checkpoints written before this type existed restore.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class TrainState:
    """step: [] int32, the number of updates applied; params: the model's nnx.Param state; rest: its other
    state (batch statistics, caches, RNG counts); opt_state: the optimizer's (optax) state for `params`."""

    step: jax.Array
    params: Any
    rest: Any
    opt_state: Any

    def as_tree(self) -> dict[str, Any]:
        """The checkpoint's layout: the four fields by name (the arrays themselves, not copies)."""
        return {"step": self.step, "params": self.params, "rest": self.rest, "opt_state": self.opt_state}

    @classmethod
    def from_tree(cls, tree: dict[str, Any]) -> TrainState:
        """The state a checkpoint's tree (`as_tree`'s layout) holds."""
        return cls(step=tree["step"], params=tree["params"], rest=tree["rest"], opt_state=tree["opt_state"])

    @property
    def num_parameters(self) -> int:
        """The model's parameter count: the elements of every array of `params`."""
        return int(sum(x.size for x in jax.tree.leaves(self.params)))
