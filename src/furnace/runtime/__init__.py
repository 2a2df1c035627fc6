"""Shared runtime of every Furnace system; it depends on none of them.

- `launch`: `run_distributed` (spawned ranks on one machine) and `init_from_env` (torchrun).
- `comm`: `Communicator`, instrumented collectives with a `CommLog` and the byte model.
- `topology`, `presets`: devices, links, machines, with cited constants.
- `netem`: network emulation by sleeping, or a deterministic virtual clock.
- `simulator`: a discrete-event engine with makespan, critical path and Chrome traces.
- `reproduce`: the `furnace reproduce` registry and report writer.
- `testing`: `assert_close`, `seed_all` and the multi-rank harness.
"""

from .comm import (
    CommHandle,
    CommLog,
    CommRecord,
    Communicator,
    Traffic,
    all_reduce_autograd,
    all_to_all_single_autograd,
    traffic,
)
from .launch import DistributedContext, DistributedError, init_from_env, run_distributed
from .netem import NetworkEmulation, NetworkEmulator, VirtualClock
from .presets import PRESETS, emulated_link, get_preset
from .simulator import Resource, Simulator, Task, Timeline
from .topology import Device, Link, Topology, balance_matched

__all__ = [
    "PRESETS",
    "CommHandle",
    "CommLog",
    "CommRecord",
    "Communicator",
    "Device",
    "DistributedContext",
    "DistributedError",
    "Link",
    "NetworkEmulation",
    "NetworkEmulator",
    "Resource",
    "Simulator",
    "Task",
    "Timeline",
    "Topology",
    "Traffic",
    "VirtualClock",
    "all_reduce_autograd",
    "all_to_all_single_autograd",
    "balance_matched",
    "emulated_link",
    "get_preset",
    "init_from_env",
    "run_distributed",
    "traffic",
]
