"""BaGuaLu's planner for a Sunway-class machine (Ma et al., PPoPP'22; design note B.2-B.4, C.5).

For an `MoEModelSpec` and a `PlanLayout` on a `Topology` (default the ``sunway-oceanlight``
preset: a rank is one core group) it computes, per rank and step: memory (parameters,
gradients, optimizer state at 2 + 2 + 4 + 8 bytes per parameter with Adam in mixed
precision, activations, gathered working buffers), FLOPs, all-to-all and gradient-sync
bytes and messages per network level, and the step time. Every number is **modelled
(analytic)**; times come from `furnace.runtime.cost` only.

The model, and what is reconstruction (the paper gives none of these):

- FLOPs are explicit per-layer matmul counts, per token forward: attention projections
  8H^2, attention scores and context 4SH (no causal halving), gate 2HE, experts 4kHF,
  output logits 2VH; backward is twice the forward, so a step is 3x forward over all
  tokens. With activation checkpointing (`PlanLayout.recompute`) the time counts one more
  forward, the FLOPs (and FLOP/s) do not: they are the model's useful FLOPs.
  `Plan.six_n_active_flops` gives the 6 N_active rule beside them.
- Routing is balanced (SWIPE): each rank computes T k / W token-expert pairs, and each
  pick lands on a uniformly chosen rank of the expert-parallel group; bytes per level are
  rank 0's view (its group starts at a node boundary). Four all-to-alls per layer and step
  (dispatch and combine, forward and backward), bf16 tokens; the messages of one exchange at
  a level are min(peers there, picks landing there).
- Gradient sync: without sharding, a two-level all-reduce of the replicated parameters'
  bf16 gradients over the world (`hierarchical_all_reduce_time`) and a ring all-reduce of
  the experts' over their replicas; with sharding (ZeRO-3), one reduce-scatter of gradients
  and two all-gathers of parameters per step, as recursive halving/doubling ("tree").
- Compute, all-to-all and sync do not overlap: step = sum. Compute is `roofline_time` on
  the device with its peaks scaled by one GEMM-efficiency factor, the factor `calibrate`
  fits to "14.5T at about 1 EFLOPS on about 96,000 nodes" (the paper's one throughput
  figure). That anchors the 14.5T figure by construction; the others are predictions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from furnace.runtime.cost import (
    collective_time,
    hierarchical_all_reduce_time,
    link_time,
    roofline_time,
)
from furnace.runtime.presets import get_preset

# re-exported: `divisors` was defined here before it moved to furnace.runtime.topology
from furnace.runtime.topology import Device, LinkLevel, Topology, divisors

from .config import LayoutError, MoEModelSpec, PlanLayout

__all__ = [
    "BYTES_PER_PARAM",
    "PAPER_EFLOPS",
    "PAPER_NODES",
    "PAPER_PARAMS",
    "SYNC_ALGORITHMS",
    "Calibration",
    "CalibrationError",
    "LayoutSearch",
    "MemoryBreakdown",
    "Plan",
    "SyncAlgorithm",
    "calibrate",
    "default_topology",
    "divisors",
    "plan",
    "search_layouts",
    "sensitivity",
    "spec_for_machine",
]

LABEL = "modelled (analytic)"
# mixed-precision Adam: bf16 weights, bf16 gradients, fp32 master weights, fp32 Adam m and v
BYTES_PER_PARAM = {"params": 2, "grads": 2, "master": 4, "adam": 8}
BF16, FP32 = 2, 4
# the paper's anchor (design note B.4): 14.5T parameters at > 1 EFLOPS on ~96,000 nodes
PAPER_PARAMS = "14.5T"
PAPER_NODES = 96_000
PAPER_EFLOPS = 1.0
# a memory use above this share of a rank's capacity is called the binding constraint
MEMORY_TIGHT = 0.9
LEVELS: tuple[LinkLevel, ...] = ("intra_node", "inter_node", "inter_group")
SyncAlgorithm = Literal["hierarchical", "ring"]
SYNC_ALGORITHMS: tuple[SyncAlgorithm, ...] = ("hierarchical", "ring")


class CalibrationError(ValueError):
    """The anchor cannot be met: the modelled communication alone exceeds its step time."""


def default_topology(injection_bandwidth_Bps: float | None = None) -> Topology:
    """``sunway-oceanlight`` with a core group as the rank (optionally another injection
    bandwidth per node, which the paper does not give)."""
    if injection_bandwidth_Bps is None:
        return get_preset("sunway-oceanlight")
    return get_preset("sunway-oceanlight", injection_bandwidth_Bps=injection_bandwidth_Bps)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank: resident states, activations and gathered working buffers."""

    params: float
    grads: float
    optimizer: float
    activations: float
    working: float
    capacity: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.working

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def share(self) -> float:
        return self.total / self.capacity


@dataclass(frozen=True)
class Plan:
    """One layout's modelled figures, per rank and optimizer step unless said otherwise."""

    spec: MoEModelSpec
    layout: PlanLayout
    topology: str
    efficiency: float
    memory: MemoryBreakdown
    flops_total: float
    flops_by_part: dict[str, float]
    six_n_active_flops: float
    a2a_bytes: dict[str, float]
    a2a_messages: dict[str, float]
    sync_bytes: dict[str, float]
    compute_s: float
    a2a_s: float
    sync_s: float
    a2a_level: str
    label: str = LABEL

    @property
    def step_s(self) -> float:
        return self.compute_s + self.a2a_s + self.sync_s

    @property
    def achieved_flops(self) -> float:
        """Whole-machine FLOP/s: the step's FLOPs over its modelled time."""
        return self.flops_total / self.step_s

    @property
    def nodes(self) -> float:
        return self.layout.world_size / 6

    @property
    def binding(self) -> str:
        """What limits this layout: memory, compute, the all-to-all (by its pacing level)
        or the gradient sync."""
        if not self.memory.fits:
            return (f"memory: needs {self.memory.total / 1e9:.2f} GB of "
                    f"{self.memory.capacity / 1e9:.0f} GB per rank")
        if self.memory.share > MEMORY_TIGHT:
            return f"memory ({100 * self.memory.share:.0f}% of a rank's)"
        parts = {"compute": self.compute_s, "gradient sync": self.sync_s,
                 "inter-supernode traffic" if self.a2a_level == "inter_group"
                 else f"all-to-all ({self.a2a_level})": self.a2a_s}
        return max(parts, key=lambda k: parts[k])

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "spec": dataclasses.asdict(self.spec),
            "total_params": self.spec.total_params,
            "layout": dataclasses.asdict(self.layout) | {"dp_size": self.layout.dp_size},
            "topology": self.topology,
            "efficiency": self.efficiency,
            "memory_bytes_per_rank": {
                "params": self.memory.params, "grads": self.memory.grads,
                "optimizer": self.memory.optimizer, "activations": self.memory.activations,
                "working": self.memory.working, "total": self.memory.total,
                "capacity": self.memory.capacity, "fits": self.memory.fits},
            "flops_per_step": self.flops_total,
            "flops_by_part": self.flops_by_part,
            "six_n_active_flops": self.six_n_active_flops,
            "a2a_bytes_per_rank": self.a2a_bytes,
            "a2a_messages_per_rank": self.a2a_messages,
            "sync_bytes_per_rank": self.sync_bytes,
            "compute_s": self.compute_s, "a2a_s": self.a2a_s, "sync_s": self.sync_s,
            "step_s": self.step_s, "achieved_flops": self.achieved_flops,
            "binding": self.binding,
        }


def _peers_by_level(group_size: int, topology: Topology) -> dict[str, int]:
    """Rank 0's peers in a group of ``group_size`` consecutive ranks, per link level."""
    in_node = min(topology.ranks_per_node, group_size)
    per_group = (group_size if topology.nodes_per_group is None
                 else topology.ranks_per_node * topology.nodes_per_group)
    in_group = min(per_group, group_size)
    return {"intra_node": in_node - 1, "inter_node": in_group - in_node,
            "inter_group": group_size - in_group}


def _outer_level(ranks: tuple[int, ...], topology: Topology) -> LinkLevel | None:
    """The slowest level of a group given by representative pairs (first, each other)."""
    levels = {topology.level(ranks[0], r) for r in ranks[1:] if r != ranks[0]}
    if not levels:
        return None
    return min(levels, key=lambda lvl: topology.link_for(lvl).bandwidth_Bps)


def _activation_bytes_per_token_layer(spec: MoEModelSpec) -> float:
    """Saved for backward (reconstruction): attention: norm in and out, Q K V, softmax
    probabilities (a S), context, bf16; MoE: norm in and out bf16, gate probabilities fp32
    (E), and per routed copy the expert input and both hidden activations, bf16."""
    h, f = spec.d_model, spec.d_hidden
    attention = BF16 * (6 * h + spec.num_heads * spec.seq_len)
    moe = BF16 * 2 * h + FP32 * spec.num_experts + spec.top_k * BF16 * (h + 2 * f)
    return float(attention + moe)


def _memory(spec: MoEModelSpec, layout: PlanLayout, topology: Topology) -> MemoryBreakdown:
    experts_per_rank = spec.num_experts // layout.ep_size
    expert_params = spec.num_layers * experts_per_rank * spec.expert_params
    replicated = spec.replicated_params
    if layout.shard_states:
        resident = replicated / layout.world_size + expert_params / layout.dp_size
        # one gathered unit at a time (a layer or the embeddings), its bf16 params and grads
        layer = (spec.dense_params_per_layer + spec.gate_params_per_layer
                 + experts_per_rank * spec.expert_params)
        working = float((BYTES_PER_PARAM["params"] + BYTES_PER_PARAM["grads"])
                        * max(layer, spec.embedding_params))
    else:
        resident = float(replicated + expert_params)
        working = 0.0
    tokens = spec.tokens_per_step / layout.world_size
    full_layer = tokens * _activation_bytes_per_token_layer(spec)
    if layout.recompute:
        # every layer's bf16 input, and one layer's full set while it is recomputed
        saved = tokens * spec.num_layers * BF16 * spec.d_model + full_layer
    else:
        saved = spec.num_layers * full_layer
    activations = saved + tokens * FP32 * spec.vocab  # fp32 logits for the loss
    return MemoryBreakdown(
        params=BYTES_PER_PARAM["params"] * resident,
        grads=BYTES_PER_PARAM["grads"] * resident,
        optimizer=(BYTES_PER_PARAM["master"] + BYTES_PER_PARAM["adam"]) * resident,
        activations=activations, working=working, capacity=topology.device.memory_bytes)


def _flops(spec: MoEModelSpec) -> tuple[float, dict[str, float], float]:
    h, t = spec.d_model, spec.tokens_per_step
    per_token = {
        "attention": spec.num_layers * (8 * h * h + 4 * spec.seq_len * h),
        "gate": spec.num_layers * 2 * h * spec.num_experts,
        "experts": spec.num_layers * 4 * spec.top_k * h * spec.d_hidden,
        "logits": 2 * spec.vocab * h,
    }
    by_part = {k: 3.0 * v * t for k, v in per_token.items()}
    return sum(by_part.values()), by_part, 6.0 * spec.active_params * t


def _derated(device: Device, efficiency: float) -> Device:
    return dataclasses.replace(device, name=f"{device.name} at {efficiency:.3g} of peak",
                               peak_flops={k: v * efficiency
                                           for k, v in device.peak_flops.items()})


def plan(spec: MoEModelSpec, layout: PlanLayout, topology: Topology | None = None, *,
         efficiency: float = 1.0, element_bytes: int = BF16,
         sync_algorithm: SyncAlgorithm = "hierarchical") -> Plan:
    """The modelled figures of ``spec`` under ``layout``; raises `LayoutError` if invalid.

    An infeasible layout (memory over capacity) is still planned: `Plan.memory.fits` says
    so and `Plan.binding` names it. ``element_bytes`` is the size of one exchanged token
    element and one synchronized gradient element (bf16 at scale; the emulated validation
    runs fp32). ``sync_algorithm`` is the unsharded world all-reduce: "hierarchical" (the
    two-level scheme, the default) or "ring" (one flat ring over the world, what
    `furnace.hybrid.moda.MoDa.reduce_gradients` runs through its `Communicator`).
    """
    topo = topology or default_topology()
    layout.validate_for(spec)
    if not 0 < efficiency <= 1:
        raise LayoutError("efficiency", f"must be in (0, 1], got {efficiency}")
    if isinstance(element_bytes, bool) or not isinstance(element_bytes, int) \
            or element_bytes < 1:
        raise LayoutError("element_bytes", f"must be an integer >= 1, got {element_bytes!r}")
    if sync_algorithm not in SYNC_ALGORITHMS:
        raise LayoutError("sync_algorithm", f"must be one of {', '.join(SYNC_ALGORITHMS)}, "
                          f"got {sync_algorithm!r}")
    w, e, dp = layout.world_size, layout.ep_size, layout.dp_size
    memory = _memory(spec, layout, topo)
    flops_total, by_part, six_n = _flops(spec)
    # recomputation runs the forward again: 4x forward of time, 3x of useful FLOPs
    executed = flops_total * (4 / 3 if layout.recompute else 1.0)
    compute_s = roofline_time(_derated(topo.device, efficiency), executed / w,
                              dtype="bfloat16")

    # all-to-all: 4 exchanges per layer and step
    exchanges = 4 * spec.num_layers
    picks = spec.tokens_per_step / w * spec.top_k
    token_bytes = element_bytes * spec.d_model
    peers = _peers_by_level(e, topo)
    a2a_bytes: dict[str, float] = {}
    a2a_messages: dict[str, float] = {}
    a2a_one = 0.0
    a2a_level = "none"
    for level in LEVELS:
        landing = picks * peers[level] / e
        a2a_bytes[level] = exchanges * landing * token_bytes
        messages = float(min(peers[level], math.ceil(landing))) if peers[level] else 0.0
        a2a_messages[level] = exchanges * messages
        if messages:
            t = link_time(topo.link_for(level), landing * token_bytes, messages)
            if t >= a2a_one:
                a2a_one, a2a_level = t, level
    a2a_s = exchanges * a2a_one

    # gradient sync of the replicated parameters (world) and the experts (replicas)
    sync_bytes: dict[str, float] = {level: 0.0 for level in LEVELS}
    sync_s = 0.0
    replicated = float(spec.replicated_params)
    expert_local = float(spec.num_layers * (spec.num_experts // e) * spec.expert_params)
    groups = (
        (replicated, w, _outer_level((0, w - 1), topo) if w > 1 else None),
        (expert_local, dp, _outer_level((0, e, e * (dp - 1)), topo) if dp > 1 else None),
    )
    for params, size, sync_level in groups:
        if sync_level is None or size == 1:
            continue
        grad_bytes = element_bytes * params
        if layout.shard_states:
            share = grad_bytes / size
            # reduce-scatter of gradients, all-gather of parameters before forward and backward
            sync_s += collective_time("reduce_scatter", share, size, topo.link_for(sync_level),
                                      algorithm="tree")
            sync_s += 2 * collective_time("all_gather", share, size, topo.link_for(sync_level),
                                          algorithm="tree")
            sync_bytes[sync_level] += 3 * (size - 1) * math.ceil(share)
        elif size == w and w > topo.ranks_per_node and sync_algorithm == "hierarchical":
            nodes = w // topo.ranks_per_node
            outer: LinkLevel = _outer_level((0, w - 1), topo) or "inter_node"
            sync_s += hierarchical_all_reduce_time(
                grad_bytes, ranks_per_node=topo.ranks_per_node, num_nodes=nodes,
                intra=topo.intra_node, inter=topo.link_for(outer))
            share = grad_bytes / topo.ranks_per_node
            sync_bytes["intra_node"] += 2 * (topo.ranks_per_node - 1) * math.ceil(share)
            sync_bytes[outer] += 2 * (nodes - 1) * math.ceil(share) // nodes
        else:
            sync_s += collective_time("all_reduce", grad_bytes, size, topo.link_for(sync_level))
            sync_bytes[sync_level] += 2 * (size - 1) * math.ceil(grad_bytes) // size
    return Plan(spec=spec, layout=layout, topology=topo.name, efficiency=efficiency,
                memory=memory, flops_total=flops_total, flops_by_part=by_part,
                six_n_active_flops=six_n, a2a_bytes=a2a_bytes, a2a_messages=a2a_messages,
                sync_bytes=sync_bytes, compute_s=compute_s, a2a_s=a2a_s, sync_s=sync_s,
                a2a_level=a2a_level)


@dataclass(frozen=True)
class LayoutSearch:
    """The best feasible layouts, fastest first, and the best of those that do not fit."""

    feasible: list[Plan]
    infeasible: list[Plan]
    candidates: int

    @property
    def ok(self) -> bool:
        return bool(self.feasible)

    @property
    def best(self) -> Plan:
        if not self.feasible:
            raise LayoutError("layout", self.reason)
        return self.feasible[0]

    @property
    def reason(self) -> str:
        """Why nothing fits, from the layout that needs the least memory."""
        if self.feasible:
            return "feasible"
        if not self.infeasible:
            return "no valid layout: no expert-parallel size divides both the experts and " \
                "the world"
        least = min(self.infeasible, key=lambda p: p.memory.total)
        return (f"infeasible: every one of {self.candidates} layouts exceeds a rank's memory; "
                f"the least needs {least.memory.total / 1e9:.2f} GB of "
                f"{least.memory.capacity / 1e9:.0f} GB (ep {least.layout.ep_size})")


def search_layouts(spec: MoEModelSpec, world_size: int, topology: Topology | None = None, *,
                   efficiency: float = 1.0, top: int = 3) -> LayoutSearch:
    """Every expert-parallel size dividing both E and the world, states sharded or not,
    with activation checkpointing or not."""
    topo = topology or default_topology()
    plans = []
    for ep in divisors(math.gcd(spec.num_experts, world_size)):
        for shard, recompute in ((True, True), (True, False), (False, True), (False, False)):
            layout = PlanLayout(world_size=world_size, ep_size=ep, shard_states=shard,
                                recompute=recompute)
            try:
                plans.append(plan(spec, layout, topo, efficiency=efficiency))
            except LayoutError:
                continue
    fits = sorted((p for p in plans if p.memory.fits), key=lambda p: p.step_s)
    over = sorted((p for p in plans if not p.memory.fits), key=lambda p: p.memory.total)
    return LayoutSearch(feasible=fits[:top], infeasible=over[:top], candidates=len(plans))


def spec_for_machine(params: float | str, nodes: int, topology: Topology | None = None, *,
                     tokens_per_rank: int = 4096, **shape: int) -> MoEModelSpec:
    """`MoEModelSpec.from_param_count` with ``tokens_per_rank`` tokens on every rank."""
    topo = topology or default_topology()
    return MoEModelSpec.from_param_count(
        params, tokens_per_step=tokens_per_rank * nodes * topo.ranks_per_node, **shape)


@dataclass(frozen=True)
class Calibration:
    """The one GEMM-efficiency factor that makes the anchor's best layout reach its FLOP/s."""

    efficiency: float
    anchor: Plan
    target_flops: float
    label: str = field(default="calibrated on the paper's 14.5T at 1 EFLOPS (modelled)")


def calibrate(spec: MoEModelSpec, world_size: int, topology: Topology | None = None, *,
              target_flops: float = PAPER_EFLOPS * 1e18) -> Calibration:
    """Solve for the efficiency with which ``spec``'s best layout achieves ``target_flops``.

    Compute time is linear in 1 / efficiency and the rest does not depend on it (nor does
    the layout ranking), so the factor is found in closed form from the plan at peak.
    """
    topo = topology or default_topology()
    best = search_layouts(spec, world_size, topo, top=1).best
    target_step = best.flops_total / target_flops
    other = best.a2a_s + best.sync_s
    if other >= target_step:
        raise CalibrationError(
            f"communication alone takes {other:.3g} s, the anchor's step {target_step:.3g} s")
    efficiency = best.compute_s / (target_step - other)
    if efficiency > 1:
        raise CalibrationError(f"the anchor needs {efficiency:.3g} of peak")
    anchored = plan(spec, best.layout, topo, efficiency=efficiency)
    return Calibration(efficiency=efficiency, anchor=anchored, target_flops=target_flops)


def sensitivity(configs: list[tuple[str, int]], *, bandwidths_Bps: list[float],
                efficiency_scales: list[float], tokens_per_rank: int = 4096
                ) -> list[dict[str, Any]]:
    """Predictions under what the paper does not give.

    Per injection bandwidth: recalibrate on the anchor, then predict each (params, nodes).
    Per efficiency scale (at the preset's bandwidth, no recalibration): the anchor's
    predicted EFLOPS with the calibrated factor times the scale.
    """
    rows: list[dict[str, Any]] = []
    anchor_spec = spec_for_machine(PAPER_PARAMS, PAPER_NODES, tokens_per_rank=tokens_per_rank)
    world = PAPER_NODES * 6
    for bw in bandwidths_Bps:
        topo = default_topology(bw)
        row: dict[str, Any] = {"vary": "injection bandwidth", "value": bw}
        try:
            cal = calibrate(anchor_spec, world, topo)
        except CalibrationError as exc:
            row["efficiency"] = None
            row["note"] = str(exc)
            rows.append(row)
            continue
        row["efficiency"] = cal.efficiency
        for params, nodes in configs:
            spec = spec_for_machine(params, nodes, topo, tokens_per_rank=tokens_per_rank)
            found = search_layouts(spec, nodes * topo.ranks_per_node, topo,
                                   efficiency=cal.efficiency, top=1)
            row[f"{params}@{nodes}"] = found.best.achieved_flops if found.ok else None
        rows.append(row)
    base = calibrate(anchor_spec, world)
    for scale in efficiency_scales:
        eff = min(1.0, base.efficiency * scale)
        p = plan(anchor_spec, base.anchor.layout, efficiency=eff)
        rows.append({"vary": "GEMM efficiency", "value": eff,
                     f"{PAPER_PARAMS}@{PAPER_NODES}": p.achieved_flops})
    return rows
