"""Routers for `MoELayer`, one per file on `BaseGate`; `make_gate` builds one by name.

`EmulatedRanksGate` is not in `GATES`: it wraps another gate to route one process's batch
as if it came from several ranks.
"""

from __future__ import annotations

from .base import BaseGate, GateContext, GateOutput, as_gate_output
from .emulated_ranks import EmulatedRanksGate
from .gshard import GShardGate
from .noisy import NoisyGate
from .swipe import SwipeGate
from .switch import SwitchGate
from .topk import NaiveGate
from .topology import TopologyGate
from .zero import ZeroGate

GATES: dict[str, type[BaseGate]] = {
    "naive": NaiveGate,
    "noisy": NoisyGate,
    "gshard": GShardGate,
    "switch": SwitchGate,
    "swipe": SwipeGate,
    "topology": TopologyGate,
    "zero": ZeroGate,
}


def make_gate(name: str, d_model: int, num_experts: int, top_k: int, **kwargs) -> BaseGate:
    """A gate by name (see `GATES`); keyword arguments go to its constructor."""
    try:
        cls = GATES[name]
    except KeyError:
        raise ValueError(f"unknown gate {name!r}; known: {sorted(GATES)}") from None
    return cls(d_model, num_experts, top_k, **kwargs)


__all__ = [
    "GATES",
    "BaseGate",
    "EmulatedRanksGate",
    "GShardGate",
    "GateContext",
    "GateOutput",
    "NaiveGate",
    "NoisyGate",
    "SwipeGate",
    "SwitchGate",
    "TopologyGate",
    "ZeroGate",
    "as_gate_output",
    "make_gate",
]
