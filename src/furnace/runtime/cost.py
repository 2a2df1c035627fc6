"""The one alpha-beta cost model of Furnace: messages, collectives and compute over a `Topology`.

Every modelled time in the package comes from here: the network emulator (`netem`), the
simulators built on `simulator`, FasterMoE's performance model, the eigensolver's scaling
model and Ape's DSA time model. A system that needs a time it cannot express with these
functions adds the function here, not its own formula.

The models:

- point to point (Hockney, "The communication challenge for MPP", Parallel Computing 1994):
  ``m`` messages carrying ``b`` bytes in all take ``m * alpha + b / beta``;
- collectives (Thakur, Rabenseifner and Gropp, "Optimization of collective communication
  operations in MPICH", IJHPCA 2005, section 4): ring algorithms follow the byte model of
  `furnace.runtime.comm.traffic`, binomial trees pay ``ceil(log2 p)`` full-size steps per
  phase; a group runs at the pace of its slowest link class (oversubscribed inter-group
  links included, see `Topology.inter_group`);
- hierarchical all-reduce: reduce-scatter inside each node, all-reduce of one node-share
  across nodes, all-gather inside each node (the two-level scheme of NCCL and of
  BaGuaLu's design note C.3);
- compute (Williams, Waterman and Patterson, "Roofline", CACM 2009): a kernel takes the
  longer of its FLOPs at the device's peak and its bytes at the memory bandwidth; where a
  model assumes nothing overlaps (Ape's DSA time model, ICS '22 section 6.9), the sum of
  each unit's operations at its rate and the bytes at the memory bandwidth.

Byte counts are whole bytes in the collectives, as in `furnace.runtime.comm.traffic`; a
fractional size (a share of a buffer that the group does not divide) is rounded up, since
the rank with the largest share paces the ring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

    from .comm import Traffic
    from .topology import Device, Topology

__all__ = [
    "Algorithm",
    "LinkLike",
    "alpha_beta",
    "collective_time",
    "direct_exchange_time",
    "group_collective_time",
    "hierarchical_all_reduce_time",
    "link_time",
    "link_time_array",
    "log_levels",
    "roofline_time",
    "serial_compute_time",
    "traffic_time",
    "tree_depth",
]

Algorithm = Literal["ring", "tree"]
ALGORITHMS: tuple[str, ...] = ("ring", "tree")
# ops whose ring and tree algorithms differ in this model; the others have one algorithm
_TREE_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
# the ops of `furnace.runtime.comm.OPS` that a whole group takes part in
COLLECTIVES: tuple[str, ...] = (*_TREE_OPS, "all_to_all_single", "barrier")


class LinkLike(Protocol):
    """Anything with an alpha and a beta: `furnace.runtime.topology.Link` or a model's own."""

    @property
    def latency_s(self) -> float: ...

    @property
    def bandwidth_Bps(self) -> float: ...


def alpha_beta(num_bytes: float, *, latency_s: float, bandwidth_Bps: float,
               messages: float = 1.0) -> float:
    """``messages * latency_s + num_bytes / bandwidth_Bps``: the Hockney model."""
    if bandwidth_Bps <= 0:
        raise ValueError(f"bandwidth_Bps must be > 0, got {bandwidth_Bps}")
    if num_bytes < 0 or messages < 0:
        raise ValueError(f"num_bytes and messages must be >= 0, got {num_bytes}, {messages}")
    return messages * latency_s + num_bytes / bandwidth_Bps


def link_time(link: LinkLike, num_bytes: float, messages: float = 1.0) -> float:
    """Seconds for ``messages`` messages carrying ``num_bytes`` in all over ``link``."""
    return alpha_beta(num_bytes, latency_s=link.latency_s, bandwidth_Bps=link.bandwidth_Bps,
                      messages=messages)


def link_time_array(link: LinkLike, num_bytes: npt.ArrayLike,
                    messages: npt.ArrayLike = 1.0) -> npt.NDArray[np.float64]:
    """`link_time` elementwise over arrays of byte and message counts, in float64.

    The same arithmetic in the same order as `link_time`, so an element equals the scalar
    call on it. The values are not checked (this sits in the inner loop of FasterMoE's
    shadow search); callers mask out empty transfers themselves.
    """
    if link.bandwidth_Bps <= 0:
        raise ValueError(f"bandwidth_Bps must be > 0, got {link.bandwidth_Bps}")
    return (np.asarray(messages, dtype=np.float64) * link.latency_s
            + np.asarray(num_bytes, dtype=np.float64) / link.bandwidth_Bps)


def tree_depth(group_size: int) -> int:
    """Steps of a binomial tree over ``group_size`` ranks: ``ceil(log2 p)``."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return (group_size - 1).bit_length()


def traffic_time(tr: Traffic, link: LinkLike) -> float:
    """One op's `Traffic` on one link class: ``steps * alpha + max(sent, received) / beta``.

    A rank sends and receives at once (full duplex), so the larger direction paces it.
    """
    if tr.steps == 0:
        return 0.0
    return link_time(link, max(tr.bytes_sent, tr.bytes_received), tr.steps)


def direct_exchange_time(levels: Iterable[tuple[LinkLike, float, float]], steps: int) -> float:
    """A direct exchange whose peers sit behind several link classes, all used in parallel.

    ``levels``: per link class, (link, bytes sent over it, bytes received over it). The
    slowest class decides.
    """
    if steps == 0:
        return 0.0
    return max((link_time(link, max(sent, received), steps) for link, sent, received in levels),
               default=0.0)


def collective_time(op: str, num_bytes: float, group_size: int, link: LinkLike, *,
                    algorithm: Algorithm = "ring") -> float:
    """Seconds for one collective over ``group_size`` ranks that all use ``link``.

    ``num_bytes`` is the size argument of `furnace.runtime.comm.traffic`: the buffer for
    all_reduce, broadcast and reduce; one rank's share for all_gather and reduce_scatter;
    the bytes one rank sends to each peer for all_to_all. Ring times are exactly
    ``traffic_time`` of that byte model. Trees (binomial; recursive doubling or halving for
    all_gather and reduce_scatter) trade bandwidth for ``ceil(log2 p)`` latency steps.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of the collectives {COLLECTIVES}, got {op!r}")
    p = int(group_size)
    if p < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if num_bytes < 0:
        raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
    if p == 1:
        return 0.0
    # whole bytes, rounded up (module docstring); an integral size is left as it is
    size = math.ceil(num_bytes)
    if algorithm == "tree" and op in _TREE_OPS:
        depth = tree_depth(p)
        if op in ("broadcast", "reduce"):
            return link_time(link, depth * size, depth)
        if op == "all_reduce":
            # binomial reduce to rank 0, then binomial broadcast back
            return link_time(link, 2 * depth * size, 2 * depth)
        # recursive doubling (all_gather) or halving (reduce_scatter): the ring's bytes
        return link_time(link, (p - 1) * size, depth)
    from .comm import traffic

    if op == "all_to_all_single":
        tr = traffic(op, rank=0, world_size=p, send_bytes=[size] * p, recv_bytes=[size] * p)
    else:
        tr = traffic(op, rank=0, world_size=p, nbytes=size)
    return traffic_time(tr, link)


def group_collective_time(op: str, num_bytes: float, ranks: Sequence[int], topology: Topology,
                          *, algorithm: Algorithm = "ring") -> float:
    """`collective_time` for the group ``ranks`` of ``topology``, at its slowest link class."""
    level = topology.slowest_level(ranks)
    if level is None:
        return 0.0
    return collective_time(op, num_bytes, len(ranks), topology.link_for(level),
                           algorithm=algorithm)


def hierarchical_all_reduce_time(num_bytes: float, *, ranks_per_node: int, num_nodes: int,
                                 intra: LinkLike, inter: LinkLike) -> float:
    """Two-level all-reduce: ring reduce-scatter in the node, ring all-reduce of one
    ``1 / ranks_per_node`` share across nodes, ring all-gather in the node."""
    local, nodes = int(ranks_per_node), int(num_nodes)
    if local < 1 or nodes < 1:
        raise ValueError(f"ranks_per_node and num_nodes must be >= 1, got {local}, {nodes}")
    share = num_bytes / local
    inside = collective_time("reduce_scatter", share, local, intra)
    across = collective_time("all_reduce", share, nodes, inter)
    return 2 * inside + across


def roofline_time(device: Device, flops: float, bytes_moved: float = 0.0,
                  dtype: torch.dtype | str = "float32") -> float:
    """The roofline: the longer of ``flops`` at the device's peak for ``dtype`` and
    ``bytes_moved`` at its memory bandwidth."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes_moved must be >= 0, got {flops}, {bytes_moved}")
    # looked up even for no FLOPs, so a dtype the device lacks is an error either way
    peak = device.flops(dtype)
    compute = flops / peak
    memory = bytes_moved / device.memory_bandwidth_Bps if bytes_moved else 0.0
    return max(compute, memory)


def serial_compute_time(ops_at_rates: Iterable[tuple[float, float]], bytes_moved: float = 0.0,
                        memory_bandwidth_Bps: float | None = None) -> float:
    """No overlap: the sum of each unit's operations at its rate, then ``bytes_moved`` at
    ``memory_bandwidth_Bps``.

    ``ops_at_rates``: (operations, operations per second) per unit, summed in that order. A
    unit with no operations costs nothing and needs no rate; memory traffic needs a
    bandwidth. Where compute and traffic do overlap, `roofline_time` is the model.
    """
    seconds = 0.0
    for ops, rate in ops_at_rates:
        if ops < 0:
            raise ValueError(f"operation counts must be >= 0, got {ops}")
        if ops == 0:
            continue
        if rate <= 0:
            raise ValueError(f"a unit with work needs a rate > 0, got {rate}")
        seconds += ops / rate
    if bytes_moved < 0:
        raise ValueError(f"bytes_moved must be >= 0, got {bytes_moved}")
    if bytes_moved:
        if memory_bandwidth_Bps is None or memory_bandwidth_Bps <= 0:
            raise ValueError(f"memory traffic needs a bandwidth > 0, got {memory_bandwidth_Bps}")
        seconds += bytes_moved / memory_bandwidth_Bps
    return seconds


def log_levels(group_size: int) -> float:
    """``log2 p`` levels of a latency-bound reduction (0 on one rank); the real-valued form
    that fitted models use, where `tree_depth` is the integer step count."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return math.log2(group_size) if group_size > 1 else 0.0
