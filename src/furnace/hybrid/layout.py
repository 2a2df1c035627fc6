"""The process groups of MoDa (BaGuaLu, Ma et al., PPoPP'22): MoE expert parallelism plus
data parallelism, laid out on a `furnace.runtime.topology.Topology`.

Three kinds of group, as the design note (`moe_bagualu.md` C.5) describes MoDa:

- the **world**: every rank; dense parameters (attention, embeddings, norms, head) and the
  gates are replicated on all of them and their gradients are all-reduced over it;
- the **expert-parallel (EP) groups**: ``expert_parallel_size`` (P) ranks that together
  hold one copy of every expert, each rank a different shard; tokens travel between them
  by all-to-all;
- the **expert-data-parallel (EDP) groups**: when P < W, the W / P ranks that hold the
  same expert shard (one per EP group); expert gradients are all-reduced over them.

What follows the paper: MoDa itself (experts sharded by expert parallelism, everything
else data parallel) and BaGuaLu's default of sharding experts machine-wide (P = W), which
its memory forces at 174T parameters. What is our reconstruction (the paper's code is not
public): the rank layout below and the validation rule.

Layout (reconstruction). EP groups are runs of consecutive ranks, ``[k*P, (k+1)*P)``, and
rank ``r`` holds shard ``r % P``; the EDP group of shard ``i`` is ``{i, i+P, i+2P, ...}``.
Ranks are numbered node-major (`Topology.node_of` is ``rank // ranks_per_node``), so
consecutive ranks are the topologically closest ones: the all-to-all, the heaviest and
most latency-bound traffic of a step, stays inside the smallest hierarchy unit that can
hold it, and the gradient all-reduce over EDP groups (once per step, bandwidth-bound)
crosses the slower levels.

Validation rule: P must divide W, and an EP group must never straddle a hierarchy unit
(node, or ``nodes_per_group`` nodes: a Sunway supernode) partially. For every unit size
s (``ranks_per_node``, and ``ranks_per_node * nodes_per_group`` when groups exist) either
P divides s (each EP group lies inside one unit) or s divides P (each EP group is a union
of whole units). A group that covers part of two units would put some of its all-to-all
pairs on the slow level and some not, and its shards would not line up with the units.
A world of whole units is not required (a 3-rank test world on 2-rank nodes is fine).

Group creation is collective (``torch.distributed.new_group`` must be called by every
rank, for every group, in the same order), so `MoDaGroups.create` creates all EP groups,
then all EDP groups, on every rank, and keeps the ones this rank belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from furnace.runtime.comm import CommLog, Communicator
from furnace.runtime.topology import Topology, divisors

__all__ = ["MoDaGroups", "MoDaLayout"]


@dataclass(frozen=True, kw_only=True)
class MoDaLayout:
    """Which ranks form which MoDa group; pure (no process group), validated on creation.

    Args:
        world_size: ranks W.
        expert_parallel_size: ranks P of one expert-parallel group (P = W: experts sharded
            over the whole machine, BaGuaLu's default; P < W: W / P replicas of each shard).
        topology: the machine the ranks run on; its hierarchy constrains P (see the module
            docstring). None: no constraint beyond P dividing W.
    """

    world_size: int
    expert_parallel_size: int
    topology: Topology | None = None

    def __post_init__(self) -> None:
        W, P = self.world_size, self.expert_parallel_size
        if not isinstance(W, int) or W < 1:
            raise ValueError(f"world_size must be a positive int, got {W!r}")
        if not isinstance(P, int) or P < 1:
            raise ValueError(f"expert_parallel_size must be a positive int, got {P!r}")
        if W % P:
            raise ValueError(f"expert_parallel_size={P} must divide world_size={W}; "
                             f"allowed: {self.allowed_sizes(W)}")
        straddled = _straddled_unit(P, _unit_sizes(self.topology))
        if straddled is not None:
            label, size = straddled
            raise ValueError(
                f"expert_parallel_size={P} makes expert-parallel groups straddle "
                f"{label}s of {size} ranks: it must divide {size} or be a multiple of "
                f"it; allowed for world_size={W}: {self.allowed_sizes(W, self.topology)}")

    def unit_sizes(self) -> list[tuple[str, int]]:
        """The hierarchy units an EP group must not straddle, as (name, ranks per unit)."""
        return _unit_sizes(self.topology)

    @staticmethod
    def allowed_sizes(world_size: int, topology: Topology | None = None) -> list[int]:
        """Every expert-parallel size the validation accepts for this world and machine."""
        units = _unit_sizes(topology)
        sizes = divisors(world_size) if world_size >= 1 else []
        return [P for P in sizes if _straddled_unit(P, units) is None]

    @property
    def expert_data_parallel_size(self) -> int:
        """Replicas of each expert shard: W / P."""
        return self.world_size // self.expert_parallel_size

    def ep_groups(self) -> list[tuple[int, ...]]:
        """The expert-parallel groups: consecutive runs of P ranks."""
        P = self.expert_parallel_size
        return [tuple(range(k * P, (k + 1) * P)) for k in range(self.expert_data_parallel_size)]

    def edp_groups(self) -> list[tuple[int, ...]]:
        """The expert-data-parallel groups: the ranks holding shard i, for i < P."""
        P = self.expert_parallel_size
        return [tuple(range(i, self.world_size, P)) for i in range(P)]

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")

    def ep_group_of(self, rank: int) -> tuple[int, ...]:
        self._check_rank(rank)
        return self.ep_groups()[rank // self.expert_parallel_size]

    def edp_group_of(self, rank: int) -> tuple[int, ...]:
        self._check_rank(rank)
        return self.edp_groups()[rank % self.expert_parallel_size]

    def shard_of(self, rank: int) -> int:
        """The expert shard rank ``rank`` holds (its rank within its EP group)."""
        self._check_rank(rank)
        return rank % self.expert_parallel_size


@dataclass(frozen=True)
class MoDaGroups:
    """This rank's three MoDa communicators (build with `MoDaGroups.create`).

    Attributes:
        layout: the rank layout.
        rank: this rank in the world.
        world: the whole world (dense and gate gradients).
        ep: this rank's expert-parallel group (the MoE layers' all-to-all).
        edp: this rank's expert-data-parallel group (expert gradients when P < W).
    """

    layout: MoDaLayout
    rank: int
    world: Communicator
    ep: Communicator
    edp: Communicator

    @classmethod
    def create(cls, layout: MoDaLayout, *, log: CommLog | None = None) -> MoDaGroups:
        """Create the groups of ``layout`` on the default process group (collective: every
        rank calls it with the same layout). The three communicators share ``log``."""
        if not dist.is_initialized():
            raise RuntimeError("MoDaGroups.create needs an initialized process group "
                               "(run_distributed or init_from_env)")
        W = dist.get_world_size()
        if W != layout.world_size:
            raise ValueError(f"the layout is for world_size={layout.world_size}, but the "
                             f"process group has {W} ranks")
        rank = dist.get_rank()
        log = log if log is not None else CommLog()
        world = Communicator(log=log, name="world")
        P = layout.expert_parallel_size
        # every rank creates every group, EP groups first, in list order (new_group is
        # collective); a group equal to the world reuses the default group
        ep_group = _new_groups(layout.ep_groups(), rank, W)
        edp_group = _new_groups(layout.edp_groups(), rank, W)
        ep = world if P == W else Communicator(ep_group, log=log, name="ep")
        edp = world if P == 1 else Communicator(edp_group, log=log, name="edp")
        return cls(layout=layout, rank=rank, world=world, ep=ep, edp=edp)


def _unit_sizes(topology: Topology | None) -> list[tuple[str, int]]:
    if topology is None:
        return []
    units = [("node", topology.ranks_per_node)]
    if topology.nodes_per_group is not None:
        units.append((topology.group_label,
                      topology.ranks_per_node * topology.nodes_per_group))
    return units


def _straddled_unit(size: int, units: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The first unit that groups of ``size`` consecutive ranks would cover partially."""
    for label, ranks in units:
        if ranks % size and size % ranks:
            return label, ranks
    return None


def _new_groups(groups: list[tuple[int, ...]], rank: int,
                world_size: int) -> dist.ProcessGroup | None:
    """Create every group (in order, on every rank); return the one holding ``rank``
    (None when it is the whole world)."""
    mine: dist.ProcessGroup | None = None
    for ranks in groups:
        if len(ranks) == world_size:
            continue
        group = dist.new_group(list(ranks))
        if rank in ranks:
            mine = group
    return mine
