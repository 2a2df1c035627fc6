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
  longer of its FLOPs at the device's peak and its bytes at the memory bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
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
    "log_levels",
    "roofline_time",
    "traffic_time",
    "tree_depth",
]

Algorithm = Literal["ring", "tree"]
ALGORITHMS: tuple[str, ...] = ("ring", "tree")
# ops whose ring and tree algorithms differ in this model; the others have one algorithm
_TREE_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")


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
    return messages * latency_s + num_bytes / bandwidth_Bps


def link_time(link: LinkLike, num_bytes: float, messages: float = 1.0) -> float:
    """Seconds for ``messages`` messages carrying ``num_bytes`` in all over ``link``."""
    return alpha_beta(num_bytes, latency_s=link.latency_s, bandwidth_Bps=link.bandwidth_Bps,
                      messages=messages)


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
    p = int(group_size)
    if p < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if p == 1:
        return 0.0
    if algorithm == "tree" and op in _TREE_OPS:
        depth = tree_depth(p)
        if op in ("broadcast", "reduce"):
            return link_time(link, depth * num_bytes, depth)
        if op == "all_reduce":
            # binomial reduce to rank 0, then binomial broadcast back
            return link_time(link, 2 * depth * num_bytes, 2 * depth)
        # recursive doubling (all_gather) or halving (reduce_scatter): the ring's bytes
        return link_time(link, (p - 1) * num_bytes, depth)
    from .comm import traffic

    if op == "all_to_all_single":
        tr = traffic(op, rank=0, world_size=p, send_bytes=[int(num_bytes)] * p,
                     recv_bytes=[int(num_bytes)] * p)
    else:
        tr = traffic(op, rank=0, world_size=p, nbytes=int(num_bytes))
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
                  dtype: str = "float32") -> float:
    """The roofline: the longer of ``flops`` at the device's peak for ``dtype`` and
    ``bytes_moved`` at its memory bandwidth."""
    compute = flops / device.flops(dtype) if flops else 0.0
    memory = bytes_moved / device.memory_bandwidth_Bps if bytes_moved else 0.0
    return max(compute, memory)


def log_levels(group_size: int) -> float:
    """``log2 p`` levels of a latency-bound reduction (0 on one rank); the real-valued form
    that fitted models use, where `tree_depth` is the integer step count."""
    return math.log2(group_size) if group_size > 1 else 0.0
