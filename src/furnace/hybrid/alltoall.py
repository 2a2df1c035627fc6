"""Topology-aware (two-level) all-to-all for BaGuaLu's expert layers (issue 13, item 3).

What follows the paper and what is reconstruction:

- [paper, via the design note B.2/B.3] The machine: supernodes of 256 nodes on a
  non-blocking fat tree, joined by a 16:3 oversubscribed second level; MoDa shards the
  experts machine-wide, so the expert all-to-all crosses supernodes, and the message
  count at 10^5-10^6 ranks is what makes a topology-aware exchange pay.
- [reconstruction, design note C.5 item 3] The scheme itself. BaGuaLu's code is not
  public; this is the textbook two-level exchange with rank-matched peers. With ``S``
  supernodes of ``R`` ranks, rank ``(s, j)`` (supernode ``s``, local index ``j``):

  1. inter-supernode stage: rank ``(s, j)`` sends to its rank-matched peer ``(t, j)`` of
     every other supernode ``t`` everything it has for supernode ``t``, in one message
     (the rows for supernode ``t`` are already contiguous in the send buffer, so the
     "aggregation per destination supernode" costs no copy);
  2. intra-supernode scatter: rank ``(t, j)`` now holds, from every source ``(s, j)``,
     the rows for each ``(t, i)``; it regroups them by ``i`` and sends each ``(t, i)``
     its rows (from all ``S`` sources ``(s, j)``) in one message. A last local
     permutation puts the received rows in source-rank order, as the flat exchange does.

  A rank then sends ``S - 1`` messages across supernodes instead of ``W - R``, carrying
  the same inter-supernode bytes (an all-to-all's bytes cannot be combined), and pays
  an extra intra-supernode hop for everything that crossed.
- [reconstruction] Counts are exchanged first, along the same two stages, with fixed
  message sizes, so no rank's participation depends on its local data (design note
  C.6). After that, both sides of every message know its size, and empty messages are
  skipped on both sides at once (a zero-size split costs no message, as in the flat
  exchange's byte model, `furnace.runtime.comm.traffic`).

Every message is a point-to-point op of a `furnace.runtime.comm.Communicator`, one per
link level (named "intra_node", "inter_node", "inter_group"), so the `CommLog` tells the
levels apart and a `NetworkEmulator` paces each message on its own link. The flat
exchange is the same machinery with one stage (a linear all-to-all: ``W - 1`` messages).

The cost model (`modelled_time`): each rank's link is a FIFO (the emulator's model,
`furnace.runtime.netem`), so a rank's sends are serial and an exchange takes the sum over
its messages of ``alpha + bytes / beta`` of each message's link (`furnace.runtime.cost`).
For a uniform ``m`` bytes per (source, destination) pair, with ``n`` ranks per node:

    T_flat(m) = (n-1) l1(m) + (R-n) l2(m) + (W-R) l3(m)
    T_hier(m) = (S-1) l3(R m) + (n-1) l1(S m) + (R-n) l2(S m)

with ``lk(b) = alpha_k + b / beta_k``. Both are linear in ``m``; hierarchical saves
``(R-1)(S-1) alpha_3`` of latency and costs ``(S-1)((n-1)/beta_1 + (R-n)/beta_2) m`` of
extra intra-supernode bytes, so it wins below

    m* = (R-1) alpha_3 / ((n-1)/beta_1 + (R-n)/beta_2)

(`model_crossover_bytes`). The 16:3 taper slows both schemes alike in this model (their
inter-supernode bytes are equal), so it moves the times, not the crossover.

The exchange is differentiable (`hierarchical_all_to_all` builds an autograd Function):
its backward runs the stages in reverse, each with its send and receive sizes swapped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch

from furnace.runtime.comm import CommHandle, CommLog, Communicator
from furnace.runtime.cost import link_time
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import sunway_oceanlight
from furnace.runtime.timing import round_robin
from furnace.runtime.topology import Link, LinkLevel, Topology

__all__ = [
    "LEVELS",
    "AllToAllTimingConfig",
    "ExchangePlan",
    "LevelTraffic",
    "Scheme",
    "SupernodeAllToAll",
    "SupernodeLayout",
    "TrafficByLevel",
    "closed_form_traffic",
    "emulated_supernode_topology",
    "exchange_timings",
    "logged_traffic",
    "measured_crossover",
    "model_crossover_bytes",
    "model_crossover_closed_form",
    "modelled_time",
]

Scheme = Literal["flat", "hierarchical"]
SCHEMES: tuple[Scheme, ...] = ("flat", "hierarchical")
# the link levels a message between two different ranks can cross, fastest first
LEVELS: tuple[LinkLevel, ...] = ("intra_node", "inter_node", "inter_group")
COUNTS_GROUP = "counts"  # the Communicator name of the count exchange (not payload)


# --- layout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SupernodeLayout:
    """How ``world_size`` consecutive ranks sit on a topology's supernodes (its groups).

    Rank ``r`` is in supernode ``r // ranks_per_supernode`` with local index
    ``r % ranks_per_supernode``; the topology must put exactly that many ranks in each.
    """

    world_size: int
    ranks_per_supernode: int
    ranks_per_node: int

    @classmethod
    def of(cls, topology: Topology, world_size: int) -> SupernodeLayout:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        per_node = min(topology.ranks_per_node, world_size)
        if topology.nodes_per_group is None:
            per_group = world_size
        else:
            per_group = min(topology.ranks_per_node * topology.nodes_per_group, world_size)
        if world_size % per_group or per_group % per_node:
            raise ValueError(
                f"{world_size} ranks do not fill whole {topology.group_label}s of "
                f"{per_group} ranks ({per_node} per node) on {topology.name}")
        return cls(world_size, per_group, per_node)

    @property
    def num_supernodes(self) -> int:
        return self.world_size // self.ranks_per_supernode

    def supernode(self, rank: int) -> int:
        return rank // self.ranks_per_supernode

    def local(self, rank: int) -> int:
        return rank % self.ranks_per_supernode

    def rank(self, supernode: int, local: int) -> int:
        return supernode * self.ranks_per_supernode + local


# --- plans -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stage:
    """One exchange: the rows of the buffer go to ``peers`` in order, ``send_rows[k]`` to
    ``peers[k]``; what comes back is concatenated in the same peer order; then its blocks
    are reordered: ``blocks`` lists (start, rows) of the received buffer in output order
    (None: kept as received). Blocks, not row indices, so a plan's size does not grow
    with the rows."""

    peers: tuple[int, ...]
    send_rows: tuple[int, ...]
    recv_rows: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class ExchangePlan:
    """Everything one rank needs to run an exchange: sizes per stage, agreed by all ranks.

    Attributes:
        scheme: "flat" or "hierarchical".
        input_split_sizes: rows this rank sends to each rank (the caller's splits).
        output_split_sizes: rows this rank receives from each rank, in source order.
        stages: the exchanges to run, in order.
    """

    scheme: Scheme
    input_split_sizes: tuple[int, ...]
    output_split_sizes: tuple[int, ...]
    stages: tuple[_Stage, ...]


def _blocks(sizes: Sequence[int]) -> list[int]:
    """Start offsets of consecutive blocks of the given sizes."""
    starts, acc = [], 0
    for size in sizes:
        starts.append(acc)
        acc += size
    return starts


def _regroup(sizes: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """The blocks, in b-major order (b then a), of a buffer laid out a-major (blocks of
    sizes[a][b], a then b): (start, rows) in the a-major buffer."""
    flat = [size for row in sizes for size in row]
    starts = _blocks(flat)
    width = len(sizes[0]) if sizes else 0
    return tuple((starts[a * width + b], sizes[a][b])
                 for b in range(width) for a in range(len(sizes)))


def _gather_blocks(x: torch.Tensor, blocks: Sequence[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([x.narrow(0, start, rows) for start, rows in blocks])


def _ungather_blocks(y: torch.Tensor, blocks: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The inverse of `_gather_blocks`: the blocks tile the source, so put them back in
    source order."""
    offsets = _blocks([rows for _, rows in blocks])
    order = sorted(range(len(blocks)), key=lambda k: blocks[k][0])
    return torch.cat([y.narrow(0, offsets[k], blocks[k][1]) for k in order])


# --- the exchange ------------------------------------------------------------------------


class SupernodeAllToAll:
    """One rank's flat and hierarchical all-to-all over the world group on a topology.

    Args:
        topology: where the ranks sit; its groups (``nodes_per_group`` nodes) are the
            supernodes.
        log: where every op goes (a fresh `CommLog` if omitted).
        network: a `NetworkEmulator` pacing every message (None: real time only).

    Payload messages are logged under their link level's name ("intra_node",
    "inter_node", "inter_group"); the count exchange under "counts".
    """

    def __init__(self, topology: Topology, *, log: CommLog | None = None,
                 network: NetworkEmulator | None = None) -> None:
        self.topology = topology
        self.log = log if log is not None else CommLog()
        self.counts = Communicator(log=self.log, network=network, name=COUNTS_GROUP)
        self.rank = self.counts.rank
        self.layout = SupernodeLayout.of(topology, self.counts.world_size)
        self.comms = {level: Communicator(log=self.log, network=network, name=level)
                      for level in LEVELS}

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def _level_comm(self, peer: int) -> Communicator:
        level = self.topology.level(self.rank, peer)
        if level == "self":
            raise ValueError("a rank does not message itself")
        return self.comms[level]

    def _counts_comm(self, peer: int) -> Communicator:
        return self.counts

    # ops, in the same order on every rank whatever the data (design note C.6)
    def _exchange(self, x: torch.Tensor, stage: _Stage,
                  comm_for: Callable[[int], Communicator]) -> torch.Tensor:
        if sum(stage.send_rows) != x.shape[0]:
            raise ValueError(f"stage sends {sum(stage.send_rows)} rows, buffer has "
                             f"{x.shape[0]}")
        chunks = list(torch.split(x, list(stage.send_rows)))
        received: list[torch.Tensor] = []
        handles: list[CommHandle[Any]] = []
        for k, peer in enumerate(stage.peers):
            if peer == self.rank:
                received.append(chunks[k])
            else:
                buf = x.new_empty((stage.recv_rows[k], *x.shape[1:]))
                if stage.recv_rows[k]:
                    handles.append(comm_for(peer).irecv(buf, peer))
                received.append(buf)
        me = stage.peers.index(self.rank)
        n = len(stage.peers)
        # rotate the send order so that no peer is everyone's first destination
        for step in range(1, n):
            k = (me + step) % n
            if stage.send_rows[k]:
                handles.append(comm_for(stage.peers[k]).isend(chunks[k].contiguous(),
                                                              stage.peers[k]))
        for handle in handles:
            handle.wait()
        out = torch.cat(received) if received else x
        if stage.blocks is not None:
            out = _gather_blocks(out, stage.blocks)
        return out

    def _reverse(self, grad: torch.Tensor, stage: _Stage) -> torch.Tensor:
        """The adjoint of one stage: undo its reordering, then exchange back."""
        if stage.blocks is not None:
            grad = _ungather_blocks(grad, stage.blocks)
        back = _Stage(stage.peers, stage.recv_rows, stage.send_rows)
        return self._exchange(grad, back, self._level_comm)

    def run(self, x: torch.Tensor, plan: ExchangePlan) -> torch.Tensor:
        """The exchange without autograd (``x`` rows split by ``plan.input_split_sizes``)."""
        for stage in plan.stages:
            x = self._exchange(x, stage, self._level_comm)
        return x

    def run_reverse(self, grad: torch.Tensor, plan: ExchangePlan) -> torch.Tensor:
        for stage in reversed(plan.stages):
            grad = self._reverse(grad, stage)
        return grad

    def __call__(self, x: torch.Tensor, plan: ExchangePlan) -> torch.Tensor:
        """The differentiable exchange: rows to each rank as planned, received rows in
        source-rank order (what `Communicator.all_to_all_single` returns)."""
        out = _SupernodeExchange.apply(x, self, plan)  # type: ignore[no-untyped-call]
        return cast(torch.Tensor, out)

    # --- plans: the count exchange ---

    def plan(self, input_split_sizes: Sequence[int], scheme: Scheme) -> ExchangePlan:
        """Exchange counts (every rank calls this with its own splits) and plan ``scheme``."""
        splits = tuple(int(s) for s in input_split_sizes)
        if len(splits) != self.world_size or min(splits) < 0:
            raise ValueError(f"need {self.world_size} non-negative input splits, got {splits}")
        if scheme == "flat":
            return self._flat_plan(splits)
        if scheme == "hierarchical":
            return self._hierarchical_plan(splits)
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")

    def _count_exchange(self, rows: list[list[int]], peers: tuple[int, ...]) -> list[list[int]]:
        """Send ``rows[k]`` (a fixed-length count vector) to ``peers[k]``, get theirs."""
        width = len(rows[0])
        sizes = tuple(width for _ in peers)
        data = torch.tensor([c for row in rows for c in row], dtype=torch.int64)
        got = self._exchange(data, _Stage(peers, sizes, sizes), self._counts_comm)
        return got.view(len(peers), width).tolist()

    def _flat_plan(self, splits: tuple[int, ...]) -> ExchangePlan:
        peers = tuple(range(self.world_size))
        received = self._count_exchange([[s] for s in splits], peers)
        out = tuple(row[0] for row in received)
        return ExchangePlan("flat", splits, out, (_Stage(peers, splits, out),))

    def _hierarchical_plan(self, splits: tuple[int, ...]) -> ExchangePlan:
        lay = self.layout
        s_count, r_count = lay.num_supernodes, lay.ranks_per_supernode
        me_s, me_j = lay.supernode(self.rank), lay.local(self.rank)
        # stage 1: to (t, me_j), the rows for supernode t (contiguous), per local index i
        inter_peers = tuple(lay.rank(t, me_j) for t in range(s_count))
        per_dest = [list(splits[lay.rank(t, 0):lay.rank(t, 0) + r_count])
                    for t in range(s_count)]
        # got1[s][i]: rows from (s, me_j) to (me_s, i)
        got1 = self._count_exchange(per_dest, inter_peers)
        # stage 2: to (me_s, i), the rows for it from every (s, me_j), in order of s
        intra_peers = tuple(lay.rank(me_s, i) for i in range(r_count))
        for_local = [[got1[s][i] for s in range(s_count)] for i in range(r_count)]
        # got2[jj][s]: rows from (s, jj) to me
        got2 = self._count_exchange(for_local, intra_peers)
        stage1 = _Stage(inter_peers, tuple(sum(row) for row in per_dest),
                        tuple(sum(row) for row in got1), _regroup(got1))
        stage2 = _Stage(intra_peers, tuple(sum(row) for row in for_local),
                        tuple(sum(row) for row in got2), _regroup(got2))
        # source rank (s, jj) is s * R + jj: s-major, as stage 2's permutation orders them
        out = tuple(got2[jj][s] for s in range(s_count) for jj in range(r_count))
        return ExchangePlan("hierarchical", splits, out, (stage1, stage2))


class _SupernodeExchange(torch.autograd.Function):
    # ctx is torch's FunctionCtx, which carries the attributes set on it untyped
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, engine: SupernodeAllToAll,
                plan: ExchangePlan) -> torch.Tensor:
        ctx.engine, ctx.plan = engine, plan
        return engine.run(x, plan)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        engine: SupernodeAllToAll = ctx.engine
        return engine.run_reverse(grad_out.contiguous(), ctx.plan), None, None


# --- closed-form counts ------------------------------------------------------------------


@dataclass(frozen=True)
class LevelTraffic:
    """Payload bytes and messages one rank sends across one link level."""

    bytes_sent: int = 0
    messages: int = 0


@dataclass(frozen=True)
class TrafficByLevel:
    """One rank's payload traffic per level; intra-supernode is intra- plus inter-node."""

    intra_node: LevelTraffic
    inter_node: LevelTraffic
    inter_group: LevelTraffic

    def level(self, level: LinkLevel) -> LevelTraffic:
        if level not in LEVELS:
            raise ValueError(f"no traffic at level {level!r}")
        return cast(LevelTraffic, getattr(self, level))

    @property
    def intra_supernode(self) -> LevelTraffic:
        return LevelTraffic(self.intra_node.bytes_sent + self.inter_node.bytes_sent,
                            self.intra_node.messages + self.inter_node.messages)

    @property
    def inter_supernode(self) -> LevelTraffic:
        return self.inter_group


def closed_form_traffic(scheme: Scheme, *, message_bytes: int, world_size: int,
                        ranks_per_supernode: int, ranks_per_node: int = 1) -> TrafficByLevel:
    """Bytes and messages one rank sends per level, for ``message_bytes`` per (src, dst).

    With W ranks, R per supernode, n per node and S = W / R supernodes:
    flat sends one message to each other rank: n-1 intra-node, R-n inter-node, W-R
    inter-supernode, of m bytes each. Hierarchical sends S-1 inter-supernode messages of
    R m bytes (stage 1) and n-1 intra-node plus R-n inter-node messages of S m bytes
    (stage 2). A zero ``message_bytes`` sends nothing.
    """
    w, r, n, m = world_size, ranks_per_supernode, ranks_per_node, message_bytes
    if min(w, r, n) < 1 or w % r or r % n or m < 0:
        raise ValueError(f"need W divisible by R divisible by n and m >= 0, got "
                         f"W={w}, R={r}, n={n}, m={m}")
    s = w // r

    def level(messages: int, size: int) -> LevelTraffic:
        return LevelTraffic(messages * size, messages) if size else LevelTraffic()

    if scheme == "flat":
        return TrafficByLevel(level(n - 1, m), level(r - n, m), level(w - r, m))
    if scheme == "hierarchical":
        return TrafficByLevel(level(n - 1, s * m), level(r - n, s * m), level(s - 1, r * m))
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def logged_traffic(log: CommLog, rank: int) -> TrafficByLevel:
    """One rank's payload sends per level, read back from a `SupernodeAllToAll` log."""
    totals = {level: [0, 0] for level in LEVELS}
    for record in log.select("send", rank):
        if record.group in totals:
            totals[record.group][0] += record.bytes_sent
            totals[record.group][1] += record.messages
    return TrafficByLevel(*(LevelTraffic(*totals[level]) for level in LEVELS))


# --- the cost model and its crossover ----------------------------------------------------


def modelled_time(scheme: Scheme, topology: Topology, world_size: int,
                  message_bytes: float) -> float:
    """Seconds one rank's exchange takes in the FIFO alpha-beta model (module docstring):
    each message of the closed-form traffic pays its link's alpha and bytes / beta."""
    lay = SupernodeLayout.of(topology, world_size)
    # the model is linear in m; price a real-valued m through the closed form at m = 1
    unit = closed_form_traffic(scheme, message_bytes=1, world_size=world_size,
                               ranks_per_supernode=lay.ranks_per_supernode,
                               ranks_per_node=lay.ranks_per_node)
    seconds = 0.0
    for level in LEVELS:
        tr = unit.level(level)
        if tr.messages:
            seconds += link_time(topology.link_for(level), tr.bytes_sent * message_bytes,
                                 tr.messages)
    return seconds


def model_crossover_bytes(topology: Topology, world_size: int) -> float | None:
    """The message size (bytes per src-dst pair) below which hierarchical is faster in the
    model; None when one scheme wins at every size (e.g. a single supernode).

    Both times are linear in m, so the crossover solves T_flat(m) = T_hier(m) from the
    difference at m = 0 and its slope.
    """
    def gap(m: float) -> float:
        return (modelled_time("flat", topology, world_size, m)
                - modelled_time("hierarchical", topology, world_size, m))

    at_zero = gap(0.0)
    probe = max(1.0, topology.inter_node.bandwidth_Bps * topology.inter_node.latency_s)
    slope = (gap(probe) - at_zero) / probe
    if not (at_zero > 0 and slope < 0):
        return None
    return -at_zero / slope


def model_crossover_closed_form(topology: Topology, world_size: int) -> float | None:
    """m* = (R-1) alpha_inter_group / ((n-1)/beta_intra_node + (R-n)/beta_inter_node)."""
    lay = SupernodeLayout.of(topology, world_size)
    r, n = lay.ranks_per_supernode, lay.ranks_per_node
    if lay.num_supernodes < 2 or r < 2:
        return None
    extra = ((n - 1) / topology.intra_node.bandwidth_Bps
             + (r - n) / topology.inter_node.bandwidth_Bps)
    return (r - 1) * topology.inter_group.latency_s / extra


# --- emulated machine and timing ---------------------------------------------------------


def emulated_supernode_topology(*, ranks_per_node: int = 2, nodes_per_supernode: int = 2,
                                intra_node_Bps: float = 200e6, inter_node_Bps: float = 20e6,
                                intra_node_latency_s: float = 0.2e-3,
                                inter_node_latency_s: float = 1e-3) -> Topology:
    """The Sunway preset shrunk to a few local ranks, with links slow enough to emulate.

    Keeps ``sunway-oceanlight``'s shape (supernodes joined by a 16:3 oversubscribed
    level) and replaces its links by emulation-scale ones: millisecond latencies, so
    that gloo's own cost on loopback is small against the modelled time. The figures
    are emulation settings, not the machine's.
    """
    base = sunway_oceanlight()
    return base.replace(
        name="sunway-oceanlight (emulated, shrunk)",
        ranks_per_node=ranks_per_node,
        nodes_per_group=nodes_per_supernode,
        intra_node=Link(name="emulated intra-node", latency_s=intra_node_latency_s,
                        bandwidth_Bps=intra_node_Bps),
        inter_node=Link(name="emulated supernode fat tree", latency_s=inter_node_latency_s,
                        bandwidth_Bps=inter_node_Bps),
        source="shape of sunway-oceanlight (16:3 taper between supernodes); links are "
        "emulation settings",
        notes=(),
    )


@dataclass(frozen=True, kw_only=True)
class AllToAllTimingConfig:
    """A flat-versus-hierarchical timing run (see `exchange_timings`).

    Args:
        topology: the emulated machine.
        message_bytes: sizes per (src, dst) pair to time, each a multiple of 4 (float32).
        rounds: timed rounds per size (each times both schemes, in rotating order).
        warmup: untimed rounds per size.
        mode: "sleep" (emulated wall-clock time) or "virtual" (deterministic clock).
    """

    topology: Topology
    message_bytes: tuple[int, ...]
    rounds: int = 3
    warmup: int = 1
    mode: Literal["sleep", "virtual"] = "sleep"

    def __post_init__(self) -> None:
        if any(m < 4 or m % 4 for m in self.message_bytes):
            raise ValueError(f"message sizes must be positive multiples of 4 bytes, got "
                             f"{self.message_bytes}")
        if self.rounds < 1 or self.warmup < 0:
            raise ValueError("rounds must be >= 1 and warmup >= 0")


def exchange_timings(rank: int, world_size: int,
                     config: AllToAllTimingConfig) -> dict[str, Any]:
    """Per-rank body for `run_distributed`: time both schemes at every size.

    Returns ``{"seconds": {scheme: {size: [per-round seconds]}}, "traffic": {scheme:
    {size: TrafficByLevel}}, "label": "emulated" | "virtual-clock"}`` for this rank. Each
    sample is one exchange after a barrier (unemulated in sleep mode, so it costs no
    modelled time; emulated in virtual mode, so that every rank's clock starts equal).
    Plans (the count exchange) are made before timing: the samples are payload only.
    """
    network = NetworkEmulator(NetworkEmulation(topology=config.topology, mode=config.mode))
    engine = SupernodeAllToAll(config.topology, network=network)
    sync = Communicator(log=CommLog(), name="sync",
                        network=network if config.mode == "virtual" else None)
    seconds: dict[str, dict[int, list[float]]] = {s: {} for s in SCHEMES}
    traffic: dict[str, dict[int, TrafficByLevel]] = {s: {} for s in SCHEMES}
    virtual = config.mode == "virtual"
    for size in config.message_bytes:
        rows = size // 4
        plans = {scheme: engine.plan([rows] * world_size, scheme) for scheme in SCHEMES}
        x = torch.full((rows * world_size,), float(rank))

        def measure(scheme: str, x: torch.Tensor = x, plans: dict[Scheme, ExchangePlan] = plans,
                    size: int = size) -> float:
            sync.barrier()
            engine.log.clear()
            start = network.now() if virtual else time.perf_counter()
            engine.run(x, plans[cast(Scheme, scheme)])
            end = network.now() if virtual else time.perf_counter()
            traffic[scheme][size] = logged_traffic(engine.log, rank)
            return end - start

        samples = round_robin(list(SCHEMES), measure, rounds=config.rounds,
                              warmup=config.warmup)
        for scheme in SCHEMES:
            seconds[scheme][size] = samples[scheme]
    sync.barrier()
    return {"seconds": seconds, "traffic": traffic, "label": network.label}


def measured_crossover(sizes: Sequence[float], flat_s: Sequence[float],
                       hierarchical_s: Sequence[float]) -> float | None:
    """The size where hierarchical stops winning, interpolated on log(size) between the
    last size where it wins and the next; None when the sign never changes that way."""
    ratios = [math.log(h / f) for f, h in zip(flat_s, hierarchical_s)]
    for k in range(len(sizes) - 1):
        if ratios[k] < 0 <= ratios[k + 1]:
            a, b = math.log(sizes[k]), math.log(sizes[k + 1])
            frac = -ratios[k] / (ratios[k + 1] - ratios[k])
            return math.exp(a + frac * (b - a))
    return None
