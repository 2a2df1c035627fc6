"""Two-level collectives: a hierarchical all-reduce over node and cross-node process groups,
and a per-link-level byte counter for `Communicator` ops.

The hierarchical all-reduce is the two-level scheme of NCCL and of HugeCTR's hybrid
embedding (design notes `recsys.md` Sec. 2.4 "Crossover", `moe_bagualu.md` C.3): a ring
reduce-scatter inside each node, a ring all-reduce of one ``1/G`` share across the ``N``
nodes (among the ranks with the same local index), then a ring all-gather inside the node.
Each rank then sends ``2 (N-1)/N * n/G`` bytes of an ``n``-byte buffer across nodes, against
up to ``2 (W-1)/W * n`` for one flat ring over all ``W = N G`` ranks, which is what makes an
all-reduce cheaper per byte than an all-to-all on a machine whose inter-node links are the
slow ones. `runtime.cost.hierarchical_all_reduce_time` is its time; this module runs it and
counts its bytes (`hierarchical_all_reduce_bytes`) in the byte model of `comm.traffic`.

`LevelCounter` attributes each op's bytes to link levels as the network emulator does
(`NetworkEmulator.duration`): a direct exchange by each peer's level, a ring collective at
the slowest level of its group.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

from .comm import CommHandle, CommLog, Communicator, Traffic, TrafficObserver, traffic

if TYPE_CHECKING:
    from .netem import NetworkEmulator
    from .topology import LinkLevel, Topology

__all__ = ["HierarchicalAllReduce", "LevelCounter", "hierarchical_all_reduce_bytes",
           "is_two_level", "two_level_groups"]


def is_two_level(ranks_per_node: int, world_size: int) -> bool:
    """Whether nodes of ``ranks_per_node`` split ``world_size`` ranks into two levels (more
    than one node, more than one rank per node); otherwise one flat group."""
    return 1 < ranks_per_node < world_size


def _check_shape(ranks_per_node: int, world_size: int) -> int:
    if not (isinstance(ranks_per_node, int) and 1 <= ranks_per_node <= world_size
            and world_size % ranks_per_node == 0):
        raise ValueError(f"ranks_per_node must divide the {world_size} ranks, got "
                         f"{ranks_per_node!r}")
    return world_size // ranks_per_node


def two_level_groups(ranks_per_node: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """This rank's node group (ranks ``n G .. n G + G-1``) and its cross-node group (the
    ranks with its local index on every node), over the default group.

    Every rank creates every group, node groups first, in rank order: ``new_group`` is
    collective over the whole world even for groups a rank is not in.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = _check_shape(ranks_per_node, world)
    mine: dict[str, dist.ProcessGroup] = {}
    for n in range(nodes):
        ranks = list(range(n * ranks_per_node, (n + 1) * ranks_per_node))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["node"] = group
    for local in range(ranks_per_node):
        ranks = list(range(local, world, ranks_per_node))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["cross"] = group
    return mine["node"], mine["cross"]


def hierarchical_all_reduce_bytes(num_elements: int, element_bytes: int, *,
                                  ranks_per_node: int, num_nodes: int) -> tuple[int, int]:
    """Bytes one rank sends in `HierarchicalAllReduce` of ``num_elements``: (inside its node,
    across nodes). The buffer is padded to a multiple of ``ranks_per_node`` elements."""
    g, n = int(ranks_per_node), int(num_nodes)
    if g < 1 or n < 1 or num_elements < 0:
        raise ValueError(f"need ranks_per_node, num_nodes >= 1 and num_elements >= 0, got "
                         f"{g}, {n}, {num_elements}")
    share = math.ceil(num_elements / g) * element_bytes
    inside = (traffic("reduce_scatter", rank=0, world_size=g, nbytes=share).bytes_sent
              + traffic("all_gather", rank=0, world_size=g, nbytes=share).bytes_sent)
    across = traffic("all_reduce", rank=0, world_size=n, nbytes=share).bytes_sent
    return inside, across


class HierarchicalAllReduce:
    """Sum all-reduce over the default group in three logged, emulated steps (module doc).

    Args:
        node_group, cross_group: from `two_level_groups`.
        log, network, name, on_traffic: as for `Communicator`; all three steps are logged under
            ``name``, so a phase's bytes are the sum of its steps.

    ``all_reduce(tensor, async_op=True)`` posts the reduce-scatter and returns a handle;
    the cross-node all-reduce and the all-gather run when it is waited on.
    """

    def __init__(self, node_group: dist.ProcessGroup, cross_group: dist.ProcessGroup, *,
                 log: CommLog | None = None, network: NetworkEmulator | None = None,
                 name: str = "allreduce", on_traffic: TrafficObserver | None = None) -> None:
        self.log = log if log is not None else CommLog()
        self.node = Communicator(node_group, log=self.log, network=network, name=name,
                                 on_traffic=on_traffic)
        self.cross = Communicator(cross_group, log=self.log, network=network, name=name,
                                  on_traffic=on_traffic)
        self.name = name

    def all_reduce(self, tensor: torch.Tensor, *,
                   async_op: bool = False) -> torch.Tensor | CommHandle[torch.Tensor]:
        """In-place sum over every rank; returns ``tensor`` (or a handle whose wait does)."""
        flat = tensor.reshape(-1)
        g = self.node.world_size
        padded = flat.new_zeros(math.ceil(flat.numel() / g) * g)
        padded[:flat.numel()] = flat
        scattered = self.node.reduce_scatter(padded, async_op=True)

        def finish() -> torch.Tensor:
            share = self.cross.all_reduce(scattered.wait())
            gathered = self.node.all_gather(share)
            tensor.copy_(gathered[:flat.numel()].view_as(tensor))
            return tensor

        handle = CommHandle(finish)
        return handle if async_op else handle.wait()


class LevelCounter:
    """Bytes and messages this rank sends, per key and link level, attributed as the
    emulator does (module doc); a `Communicator` ``on_traffic`` observer (the per-peer
    split it needs is not in the `CommLog` records).

    Args:
        topology: the machine whose levels ranks are placed on.
        by: key the counts by the op's name ("op") or by the communicator's ("group").
    """

    def __init__(self, topology: Topology, *, by: Literal["op", "group"] = "op") -> None:
        self.topology = topology
        self.by = by
        self.bytes: dict[str, dict[str, int]] = {}
        self.messages: dict[str, dict[str, int]] = {}

    def __call__(self, op: str, tr: Traffic, comm: Communicator) -> None:
        global_ranks = comm.global_ranks
        key = op if self.by == "op" else comm.name
        by_bytes = self.bytes.setdefault(key, {})
        by_messages = self.messages.setdefault(key, {})
        if tr.pattern == "ring":
            level = self.topology.slowest_level(global_ranks)
            if level is not None and tr.steps:
                by_bytes[level] = by_bytes.get(level, 0) + tr.bytes_sent
                by_messages[level] = by_messages.get(level, 0) + tr.messages
            return
        for peer, sent, _ in tr.peers:
            lvl: LinkLevel = self.topology.level(global_ranks[comm.rank], global_ranks[peer])
            if lvl == "self" or not sent:
                continue
            by_bytes[lvl] = by_bytes.get(lvl, 0) + sent
            by_messages[lvl] = by_messages.get(lvl, 0) + 1
