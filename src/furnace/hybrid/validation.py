"""Validation of BaGuaLu's planner against emulated MoDa steps (issue 13, item 6).

`furnace.hybrid.planner.plan` models memory, FLOPs, all-to-all and gradient-sync bytes and
messages per network level, and communication time. Before the planner projects to
10^5-10^6 ranks, `validate_planner` checks each of those figures against one real MoDa
training step (forward, backward, `MoDa.reduce_gradients`) of the planner's own model,
built as a `furnace.moe.MoETransformerLM`, on W = 2, 4 and 8 gloo ranks laid out as
supernodes x nodes x ranks (2 = 1x1x2, 4 = 2x1x2, 8 = 2x2x2) of the Sunway-shaped
`alltoall.emulated_supernode_topology` (16:3 taper between supernodes), the network on a
virtual clock (`furnace.runtime.netem`, mode "virtual").

Each figure, how it is measured, and what is left over (the planner is the paper's
reconstruction, design note B.2-B.4; this check is ours):

- parameters ("counted"): `MoEModelSpec.total_params` against the LM's parameter count.
  The LM unties its output projection (V H more than the spec's default tied
  embeddings), so its spec sets ``tied_embeddings=False``; every other term (attention
  4H^2 + 4H, norms, gate H E + E, experts 2 H F + F + H, positions S H, final norm) is the
  same by construction, so the counts are equal.
- FLOPs ("counted"): `Plan.flops_total` against `torch.utils.flop_counter.FlopCounterMode`
  over every rank's forward and backward, summed. torch does not count CPU
  scaled-dot-product attention, so it is counted here with torch's own SDPA formulas
  (full S x S, as the planner: no causal halving). Equal.
- all-to-all bytes and messages per level, gradient-sync bytes per level ("counted"): the
  bytes and messages of every `Communicator` op of rank 0 (the planner's view), split by
  link level with the emulator's own attribution (a direct exchange by each peer's level,
  a ring collective at the slowest level of its group). The gate routes uniformly
  (`UniformRoutingGate`: token t's k-th choice is expert (tK + k) mod E on every rank),
  which is the planner's assumption made exact; a learned gate moves other counts.
  The planner is run with the step's own element size (fp32 here, bf16 at scale), with
  ``shard_states=False`` (MoDa all-reduces; it does not shard) and
  ``sync_algorithm="ring"`` (MoDa's world all-reduce is one flat ring, not the two-level
  scheme the planner assumes at scale; their total bytes are equal, their split over
  levels is not). Equal. Not modelled by the planner and not compared: the expert layer's
  all-gather of per-expert counts (a few bytes per layer; its time is in the row's note).
- communication time ("emulated"): the planner's ``a2a_s + sync_s`` against the sum of
  the virtual clock's modelled time of the same ops. Residual: the planner charges one
  latency per message of an exchange (each rank's sends are serial), the emulator one per
  exchange and level (`netem`: peers in parallel); the emulated links are
  bandwidth-bound (microsecond latencies) so this stays a few percent. Tolerance 25%.
- memory ("counted"): `Plan.memory` parameters, gradients and optimizer states (2 + 2 +
  12 bytes per parameter) against `precision.account_memory` of rank 0's sharded model.
  Equal. Activations are not compared (the planner's are bf16 estimates).

Compute time is not compared: the virtual clock charges only the expert GEMMs, and wall
clock on a shared machine is noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from furnace.moe import BaseGate, GateOutput, MoELMConfig, MoETransformerLM
from furnace.runtime.comm import CommLog, Communicator
from furnace.runtime.launch import run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.topology import Topology
from furnace.runtime.twolevel import LevelCounter

from .alltoall import emulated_supernode_topology
from .config import MoEModelSpec, PlanLayout
from .layout import MoDaGroups
from .moda import moda_parallel
from .naive import lm_loss
from .planner import LEVELS, Plan, plan
from .precision import account_memory

__all__ = [
    "EmulatedStep",
    "PlannerValidationError",
    "UniformRoutingGate",
    "ValidationConfig",
    "ValidationRow",
    "assert_validated",
    "build_lm",
    "compare_with_planner",
    "collect_steps",
    "emulate_steps",
    "emulated_topology",
    "flop_counter",
    "format_rows",
    "lm_config_for",
    "plan_for",
    "planner_topology",
    "rank_steps",
    "spec_for",
    "validate_planner",
]

Label = Literal["modelled", "emulated", "counted"]
# the payload ops the planner models; the rest (count exchange) is control traffic
PAYLOAD_OPS = ("all_to_all_single", "all_reduce")


@dataclass(frozen=True, kw_only=True)
class ValidationConfig:
    """The tiny model, the emulated machines and the tolerances of one validation.

    ``planner_bandwidth_scale`` scales the planner's links (not the emulator's): 1 is the
    honest input; anything else is a deliberately wrong one that the check must catch.
    """

    world_sizes: tuple[int, ...] = (2, 4, 8)
    num_layers: int = 2
    d_model: int = 8
    d_hidden: int = 8
    num_experts: int = 8
    top_k: int = 2
    num_heads: int = 2
    seq_len: int = 4
    vocab: int = 16
    rows_per_rank: int = 2
    ranks_per_node: int = 2
    intra_node_Bps: float = 200e6
    inter_node_Bps: float = 20e6
    intra_node_latency_s: float = 1e-6
    inter_node_latency_s: float = 2e-6
    time_tolerance: float = 0.25
    count_tolerance: float = 1e-9
    planner_bandwidth_scale: float = 1.0
    seed: int = 0
    timeout_s: float = 120.0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not self.world_sizes:
            raise ValueError("world_sizes must name at least one world size")
        for w in self.world_sizes:
            whole_nodes = w <= self.ranks_per_node or w % self.ranks_per_node == 0
            if w < 1 or not whole_nodes:
                raise ValueError(f"world size {w} is not a whole number of "
                                 f"{self.ranks_per_node}-rank nodes")
            if self.num_experts % w:
                raise ValueError(f"num_experts={self.num_experts} must divide over W={w}")
            if (self.rows_per_rank * self.seq_len * self.top_k) % self.num_experts:
                raise ValueError("uniform routing needs rows_per_rank * seq_len * top_k to be "
                                 f"a multiple of num_experts={self.num_experts}")
        if not 0 < self.time_tolerance < 1 or not 0 <= self.count_tolerance < 1:
            raise ValueError("tolerances must be in [0, 1)")
        if not self.planner_bandwidth_scale > 0:
            raise ValueError("planner_bandwidth_scale must be > 0")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")

    @property
    def element_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 8


@dataclass(frozen=True)
class ValidationRow:
    """One quantity at one world size: the planner's figure against the measured one."""

    world_size: int
    quantity: str
    modelled: float
    measured: float
    tolerance: float
    label: Label
    note: str = ""

    @property
    def ratio(self) -> float:
        """measured / modelled (1 when both are zero)."""
        if self.modelled == 0:
            return 1.0 if self.measured == 0 else math.inf
        return self.measured / self.modelled

    @property
    def ok(self) -> bool:
        # relative to the modelled figure, floored at 1 (a byte, a FLOP, a second is never
        # the scale: rows with a zero model only pass with a zero measurement)
        scale = max(abs(self.modelled), 1.0) if self.label == "counted" else abs(self.modelled)
        if scale == 0:
            return self.measured == 0
        return abs(self.measured - self.modelled) <= self.tolerance * scale


class PlannerValidationError(AssertionError):
    """The planner disagrees with the emulated runs; the message names each quantity."""


@dataclass
class EmulatedStep:
    """What one MoDa step on ``world_size`` emulated ranks logged and counted (rank 0's
    view, FLOPs summed over ranks)."""

    world_size: int
    lm_params: int
    flops: float
    bytes_by_level: dict[str, dict[str, int]]
    messages_by_level: dict[str, dict[str, int]]
    virtual_time_s: dict[str, float]
    memory_bytes: dict[str, float]
    topology: Topology = field(repr=False)


class UniformRoutingGate(BaseGate):
    """The planner's routing assumption made exact: token t's k-th choice is expert
    (t K + k) mod E on every rank, so each rank sends T K / E rows to every expert. The
    scores are the softmax of the scorer's logits at those experts (the scorer trains)."""

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        T, K, N = logits_TN.shape[0], self.top_k, self.num_experts
        token = torch.arange(T, device=logits_TN.device)[:, None]
        choice = torch.arange(K, device=logits_TN.device)[None, :]
        ids_TK = (token * K + choice) % N
        scores_TK = torch.softmax(logits_TN.gather(1, ids_TK), dim=-1)
        return GateOutput(ids_TK, scores_TK, logits_TN.new_zeros(()))


def lm_config_for(config: ValidationConfig) -> MoELMConfig:
    return MoELMConfig(vocab_size=config.vocab, d_model=config.d_model,
                       num_layers=config.num_layers, num_heads=config.num_heads,
                       seq_len=config.seq_len, num_experts=config.num_experts,
                       top_k=config.top_k, d_hidden=config.d_hidden)


def spec_for(config: ValidationConfig, world_size: int) -> MoEModelSpec:
    """The planner's spec of the LM twin: the same shapes, an untied output projection and
    ``rows_per_rank`` full sequences per rank."""
    return MoEModelSpec(num_layers=config.num_layers, d_model=config.d_model,
                        d_hidden=config.d_hidden, num_experts=config.num_experts,
                        top_k=config.top_k, num_heads=config.num_heads,
                        seq_len=config.seq_len, vocab=config.vocab,
                        tokens_per_step=world_size * config.rows_per_rank * config.seq_len,
                        tied_embeddings=False)


def emulated_topology(config: ValidationConfig, world_size: int) -> Topology:
    """``world_size`` ranks as supernodes x nodes x ranks: supernodes of ``nodes // 2``
    nodes from two nodes on, one node otherwise (2 = 1x1x2, 4 = 2x1x2, 8 = 2x2x2)."""
    nodes = max(1, world_size // config.ranks_per_node)
    supernodes = 2 if nodes >= 2 else 1
    return emulated_supernode_topology(
        ranks_per_node=min(config.ranks_per_node, world_size),
        nodes_per_supernode=nodes // supernodes,
        intra_node_Bps=config.intra_node_Bps, inter_node_Bps=config.inter_node_Bps,
        intra_node_latency_s=config.intra_node_latency_s,
        inter_node_latency_s=config.inter_node_latency_s)


def build_lm(config: ValidationConfig) -> MoETransformerLM:
    """The LM twin with uniform routing, the same weights on every rank."""
    torch.manual_seed(config.seed)
    model = MoETransformerLM(lm_config_for(config))
    for layer in model.moe_layers():
        layer.gate = UniformRoutingGate(config.d_model, config.num_experts, config.top_k)
    return model.to(getattr(torch, config.dtype))


def _cpu_sdpa_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                    **kwargs: Any) -> int:
    # torch's flop_counter formulas are untyped
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))  # type: ignore[no-untyped-call]


def _cpu_sdpa_backward_flops(grad_out_shape: Any, query_shape: Any, key_shape: Any,
                             value_shape: Any, *args: Any, **kwargs: Any) -> int:
    """torch's SDPA backward count less its first term, the kernel's recomputation of the
    scores Q K^T: the planner counts useful FLOPs (backward = twice the forward)."""
    b, h, s_q, d = query_shape
    recomputed = int(2 * b * h * s_q * d * key_shape[2])
    total = sdpa_backward_flop_count(  # type: ignore[no-untyped-call]
        grad_out_shape, query_shape, key_shape, value_shape)
    return int(total) - recomputed


def flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, with the CPU flash-attention kernels it does not know."""
    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
    })


def _sub_world(world_size: int, total: int) -> tuple[dist.ProcessGroup | None,
                                                     list[dist.ProcessGroup]]:
    """Collective over all ``total`` ranks: the process groups of a ``world_size``-rank
    world on ranks ``0 .. world_size - 1`` (the default group when it is all of them)
    and its one-rank expert-data-parallel groups (P = W)."""
    group = None if world_size == total else dist.new_group(list(range(world_size)))
    singles = [dist.new_group([r]) for r in range(world_size)]
    return group, singles


def _rank_step(rank: int, world_size: int, config: ValidationConfig) -> dict[str, Any]:
    """One MoDa step on this rank of a ``world_size``-rank world (ranks ``0 ..
    world_size - 1`` of the spawned job): counted FLOPs, per-level traffic, virtual times.
    Every rank of the job must call it (group creation is collective); the others
    return an empty dict."""
    total = dist.get_world_size()
    group, singles = _sub_world(world_size, total)
    if rank >= world_size:
        return {}
    topology = emulated_topology(config, world_size)
    layout = PlanLayout(world_size=world_size, ep_size=world_size, shard_states=False,
                        recompute=False).moda_layout(topology)
    log = CommLog()
    network = NetworkEmulator(NetworkEmulation(topology=topology, mode="virtual"), rank=rank)
    counter = LevelCounter(topology)
    world = Communicator(group, log=log, network=network, name="world", on_traffic=counter)
    # P = W (BaGuaLu's default): the EP group is the world, the EDP group this rank alone;
    # built here rather than by MoDaGroups.create, whose world is the whole job's
    edp = Communicator(singles[rank], log=log, network=network, name="edp",
                       on_traffic=counter)
    groups = MoDaGroups(layout=layout, rank=rank, world=world, ep=world, edp=edp)
    model = build_lm(config)
    lm_params = sum(p.numel() for p in model.parameters())
    moda = moda_parallel(model, groups)
    paper = account_memory(model).paper
    gen = torch.Generator().manual_seed(config.seed + 1)
    rows = config.rows_per_rank
    seq = torch.randint(0, config.vocab, (world_size * rows, config.seq_len + 1), generator=gen)
    x, y = seq[rank * rows:(rank + 1) * rows, :-1], seq[rank * rows:(rank + 1) * rows, 1:]
    with flop_counter() as flops:
        loss = lm_loss(model, (x, y))
        loss.backward()  # type: ignore[no-untyped-call]
    moda.reduce_gradients()
    times: dict[str, float] = {}
    for record in log.select(rank=rank):
        times[record.op] = times.get(record.op, 0.0) + (record.modelled_s or 0.0)
    return {"lm_params": lm_params, "flops": float(flops.get_total_flops()),
            "bytes": counter.bytes, "messages": counter.messages, "times": times,
            "memory": {"params": paper["half_weights"], "grads": paper["half_grads"],
                       "optimizer": paper["fp32_master"] + paper["adam_m"] + paper["adam_v"]}}


def rank_steps(rank: int, total: int, config: ValidationConfig) -> list[dict[str, Any]]:
    """This rank's part of every world size of ``config``, one after the other, inside a
    job of ``total >= max(world_sizes)`` ranks (one process start-up serves all of them,
    and a caller may run other work in the same job). Collective over the job."""
    if total < max(config.world_sizes):
        raise ValueError(f"a job of {total} ranks cannot run world sizes "
                         f"{config.world_sizes}")
    return [_rank_step(rank, w, config) for w in config.world_sizes]


def emulate_steps(config: ValidationConfig) -> list[EmulatedStep]:
    """One emulated MoDa step per world size of ``config`` (gloo, virtual clock), all in
    one job of ``max(world_sizes)`` ranks."""
    total = max(config.world_sizes)
    per_rank = run_distributed(rank_steps, total, config, timeout_s=config.timeout_s)
    return collect_steps(config, per_rank)


def collect_steps(config: ValidationConfig,
                  per_rank: list[list[dict[str, Any]]]) -> list[EmulatedStep]:
    """`EmulatedStep` per world size from every rank's `rank_steps` output."""
    steps = []
    for i, w in enumerate(config.world_sizes):
        ranks = [per_rank[r][i] for r in range(w)]
        first = ranks[0]
        steps.append(EmulatedStep(
            world_size=w, lm_params=first["lm_params"],
            flops=sum(r["flops"] for r in ranks), bytes_by_level=first["bytes"],
            messages_by_level=first["messages"], virtual_time_s=first["times"],
            memory_bytes=first["memory"], topology=emulated_topology(config, w)))
    return steps


def planner_topology(config: ValidationConfig, world_size: int) -> Topology:
    """What the planner is told about the machine (scaled when testing a wrong input)."""
    topo = emulated_topology(config, world_size)
    scale = config.planner_bandwidth_scale
    if scale == 1.0:
        return topo
    return topo.replace(intra_node=topo.intra_node.scaled(bandwidth=scale),
                        inter_node=topo.inter_node.scaled(bandwidth=scale))


def plan_for(config: ValidationConfig, world_size: int) -> Plan:
    """The planner's figures for the emulated step: MoDa's layout and algorithms."""
    layout = PlanLayout(world_size=world_size, ep_size=world_size, shard_states=False,
                        recompute=False)
    return plan(spec_for(config, world_size), layout, planner_topology(config, world_size),
                element_bytes=config.element_bytes, sync_algorithm="ring")


def compare_with_planner(config: ValidationConfig,
                         steps: list[EmulatedStep]) -> list[ValidationRow]:
    """The rows of `validate_planner` from already emulated ``steps``."""
    rows: list[ValidationRow] = []
    exact = config.count_tolerance
    for step in steps:
        w = step.world_size
        p = plan_for(config, w)

        def row(quantity: str, modelled: float, measured: float, label: Label,
                tolerance: float = exact, note: str = "", w: int = w) -> None:
            rows.append(ValidationRow(w, quantity, float(modelled), float(measured),
                                      tolerance, label, note))

        row("total_params", p.spec.total_params, step.lm_params, "counted")
        row("flops_per_step", p.flops_total, step.flops, "counted")
        a2a_bytes = step.bytes_by_level.get("all_to_all_single", {})
        a2a_messages = step.messages_by_level.get("all_to_all_single", {})
        sync_bytes = step.bytes_by_level.get("all_reduce", {})
        for level in LEVELS:
            if p.a2a_bytes[level] or a2a_bytes.get(level, 0):
                row(f"a2a_bytes[{level}]", p.a2a_bytes[level], a2a_bytes.get(level, 0),
                    "counted")
                row(f"a2a_messages[{level}]", p.a2a_messages[level],
                    a2a_messages.get(level, 0), "counted")
            if p.sync_bytes[level] or sync_bytes.get(level, 0):
                row(f"sync_bytes[{level}]", p.sync_bytes[level], sync_bytes.get(level, 0),
                    "counted")
        payload = sum(step.virtual_time_s.get(op, 0.0) for op in PAYLOAD_OPS)
        control = sum(t for op, t in step.virtual_time_s.items() if op not in PAYLOAD_OPS)
        row("comm_time_s", p.a2a_s + p.sync_s, payload, "emulated", config.time_tolerance,
            note=f"virtual clock; unmodelled count exchange {control * 1e6:.3g} us not included")
        for part in ("params", "grads", "optimizer"):
            row(f"memory_{part}_bytes", getattr(p.memory, part), step.memory_bytes[part],
                "counted")
    return rows


def validate_planner(config: ValidationConfig | None = None) -> list[ValidationRow]:
    """Emulate one MoDa step per world size and compare the planner with it, row by row
    (see the module docstring for what each row measures)."""
    config = config or ValidationConfig()
    return compare_with_planner(config, emulate_steps(config))


def assert_validated(rows: list[ValidationRow]) -> None:
    """Raise `PlannerValidationError` naming every quantity outside its tolerance."""
    if not rows:
        raise PlannerValidationError("no validation rows: nothing was checked")
    failed = [r for r in rows if not r.ok]
    if failed:
        lines = [f"W={r.world_size} {r.quantity}: modelled {r.modelled:.6g}, {r.label} "
                 f"{r.measured:.6g} (ratio {r.ratio:.4g}, tolerance {r.tolerance:.3g})"
                 for r in failed]
        raise PlannerValidationError("the planner disagrees with the emulated runs:\n  "
                                     + "\n  ".join(lines))


def format_rows(rows: list[ValidationRow]) -> str:
    """The rows as a plain-text table."""
    head = f"{'W':>2} {'quantity':<26} {'modelled':>12} {'measured':>12} {'ratio':>8} " \
        f"{'tol':>6} {'label':<9} ok"
    lines = [head]
    for r in rows:
        lines.append(f"{r.world_size:>2} {r.quantity:<26} {r.modelled:>12.6g} "
                     f"{r.measured:>12.6g} {r.ratio:>8.4f} {r.tolerance:>6.2g} "
                     f"{r.label:<9} {'yes' if r.ok else 'NO'}")
    return "\n".join(lines)
