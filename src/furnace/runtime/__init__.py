"""Shared runtime of every Furnace system; it depends on none of them.

- `launch`: `run_distributed` (spawned ranks on one machine) and `init_from_env` (torchrun).
- `comm`: `Communicator`, instrumented collectives with a `CommLog` and the byte model.
- `cost`: the one alpha-beta and roofline cost model every modelled time comes from.
- `timing`: the timing harness (warm-up, repeats, min/median/max, threads, child peak memory).
- `training`: the LM training loop (AdamW, schedule, clipping, checkpoints, forked RNG).
- `topology`, `presets`: devices, links, machines, with cited constants.
- `twolevel`: the hierarchical all-reduce and per-link-level byte counts.
- `netem`: network emulation by sleeping, or a deterministic virtual clock.
- `simulator`: a discrete-event engine with makespan, critical path and Chrome traces.
- `reproduce`: the `furnace reproduce` registry and report writer.
- `testing`: `assert_close`, `seed_all` and the multi-rank harness.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Names load on first use (PEP 562): `furnace.runtime.cliargs` and `.atomic` are needed by
# every CLI, including the eigensolver's MPI ranks, which should not pay for importing torch.
_WHERE = {
    "CommHandle": "comm", "CommLog": "comm", "CommRecord": "comm", "Communicator": "comm",
    "Traffic": "comm", "all_reduce_autograd": "comm", "all_to_all_single_autograd": "comm",
    "traffic": "comm",
    "alpha_beta": "cost", "collective_time": "cost", "group_collective_time": "cost",
    "hierarchical_all_reduce_time": "cost", "link_time": "cost", "roofline_time": "cost",
    "traffic_time": "cost",
    "Timing": "timing", "round_robin": "timing", "time_call": "timing",
    "torch_threads": "timing",
    "TrainLoopConfig": "training", "TrainResult": "training", "train_loop": "training",
    "DistributedContext": "launch", "DistributedError": "launch",
    "init_from_env": "launch", "run_distributed": "launch",
    "NetworkEmulation": "netem", "NetworkEmulator": "netem", "VirtualClock": "netem",
    "PRESETS": "presets", "emulated_link": "presets", "get_preset": "presets",
    "Resource": "simulator", "Simulator": "simulator", "Task": "simulator",
    "Timeline": "simulator",
    "Device": "topology", "Link": "topology", "Topology": "topology",
    "balance_matched": "topology",
    "HierarchicalAllReduce": "twolevel", "LevelCounter": "twolevel",
    "hierarchical_all_reduce_bytes": "twolevel", "is_two_level": "twolevel",
    "two_level_groups": "twolevel",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'furnace.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_WHERE))


if TYPE_CHECKING:
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
    from .cost import (
        alpha_beta,
        collective_time,
        group_collective_time,
        hierarchical_all_reduce_time,
        link_time,
        roofline_time,
        traffic_time,
    )
    from .launch import DistributedContext, DistributedError, init_from_env, run_distributed
    from .netem import NetworkEmulation, NetworkEmulator, VirtualClock
    from .presets import PRESETS, emulated_link, get_preset
    from .simulator import Resource, Simulator, Task, Timeline
    from .timing import Timing, round_robin, time_call, torch_threads
    from .topology import Device, Link, Topology, balance_matched
    from .training import TrainLoopConfig, TrainResult, train_loop
    from .twolevel import (
        HierarchicalAllReduce,
        LevelCounter,
        hierarchical_all_reduce_bytes,
        is_two_level,
        two_level_groups,
    )

__all__ = [
    "PRESETS",
    "CommHandle",
    "CommLog",
    "CommRecord",
    "Communicator",
    "Device",
    "DistributedContext",
    "DistributedError",
    "HierarchicalAllReduce",
    "LevelCounter",
    "Link",
    "NetworkEmulation",
    "NetworkEmulator",
    "Resource",
    "Simulator",
    "Task",
    "Timeline",
    "Timing",
    "Topology",
    "Traffic",
    "TrainLoopConfig",
    "TrainResult",
    "VirtualClock",
    "all_reduce_autograd",
    "all_to_all_single_autograd",
    "alpha_beta",
    "balance_matched",
    "collective_time",
    "emulated_link",
    "get_preset",
    "group_collective_time",
    "hierarchical_all_reduce_bytes",
    "hierarchical_all_reduce_time",
    "init_from_env",
    "is_two_level",
    "link_time",
    "roofline_time",
    "round_robin",
    "run_distributed",
    "time_call",
    "torch_threads",
    "traffic",
    "traffic_time",
    "train_loop",
    "two_level_groups",
]
