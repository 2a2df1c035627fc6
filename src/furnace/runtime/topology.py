"""Hardware and network description: devices, links and a hierarchical topology.

Every cost model, emulator and simulator in Furnace reads its hardware constants from
these value types (never from environment variables, the FastMoE counter-example in
`shared/design/style.md`). A topology is a three-level hierarchy, which covers the
machines the systems' papers ran on:

    rank -> node (``ranks_per_node`` ranks on ``intra_node`` links)
         -> group of ``nodes_per_group`` nodes (e.g. a Sunway supernode) on ``inter_node`` links
         -> the rest of the machine, on inter-node links tapered by ``oversubscription``

Communication follows the alpha-beta model: a message of ``b`` bytes on a link takes
``latency_s + b / bandwidth_Bps``, and compute the roofline; both formulas live in
`furnace.runtime.cost`, which these types only describe the hardware for. Presets with
citations live in `presets.py`.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .cost import link_time, roofline_time

LinkLevel = Literal["self", "intra_node", "inter_node", "inter_group"]

# canonical names for peak-throughput tables; torch dtypes map onto them
_DTYPE_NAMES = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int8: "int8",
}


def dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical name of a dtype for `Device.peak_flops` lookups ("float32", "tf32", ...)."""
    if isinstance(dtype, str):
        return dtype
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"no peak-throughput name for dtype {dtype}") from None


@dataclass(frozen=True, kw_only=True)
class Link:
    """One network link class in the alpha-beta model.

    Args:
        name: what the link is, e.g. "NVLink 4" or "50 Gb/s Ethernet".
        latency_s: per-message latency alpha, in seconds.
        bandwidth_Bps: per-direction bandwidth beta, in bytes per second.
    """

    name: str
    latency_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ValueError(f"link {self.name!r}: latency_s must be >= 0, got {self.latency_s}")
        if self.bandwidth_Bps <= 0:
            raise ValueError(
                f"link {self.name!r}: bandwidth_Bps must be > 0, got {self.bandwidth_Bps}"
            )

    def time(self, num_bytes: float, num_messages: int = 1) -> float:
        """Seconds to move ``num_bytes`` as ``num_messages`` sequential messages."""
        return link_time(self, num_bytes, num_messages)

    def scaled(self, *, bandwidth: float = 1.0, latency: float = 1.0, name: str = "") -> Link:
        """A copy with bandwidth and latency multiplied by the given factors."""
        return Link(
            name=name or self.name,
            latency_s=self.latency_s * latency,
            bandwidth_Bps=self.bandwidth_Bps * bandwidth,
        )


@dataclass(frozen=True, kw_only=True)
class Device:
    """One rank's compute device.

    Args:
        name: e.g. "NVIDIA V100-SXM2-32GB".
        peak_flops: FLOP/s per dtype name ("float64", "float32", "tf32", "bfloat16",
            "float16", "int8"); for int8 the figure is integer ops per second.
        memory_bytes: device memory capacity.
        memory_bandwidth_Bps: device memory bandwidth.
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bytes: float
    memory_bandwidth_Bps: float

    def __post_init__(self) -> None:
        if not self.peak_flops:
            raise ValueError(f"device {self.name!r}: peak_flops is empty")
        for key, value in self.peak_flops.items():
            if value <= 0:
                raise ValueError(f"device {self.name!r}: peak_flops[{key!r}] must be > 0")

    def flops(self, dtype: torch.dtype | str = "float32") -> float:
        """Peak FLOP/s for a dtype; a clear error names the dtypes this device has."""
        name = dtype_name(dtype)
        if name not in self.peak_flops:
            raise ValueError(
                f"device {self.name!r} has no peak figure for {name}; "
                f"it has {sorted(self.peak_flops)}"
            )
        return self.peak_flops[name]

    def compute_time(self, flops: float, dtype: torch.dtype | str = "float32") -> float:
        """Seconds for ``flops`` floating-point operations at peak throughput (the roofline
        with no memory traffic)."""
        return roofline_time(self, flops, dtype=dtype)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """A machine: identical devices, ``ranks_per_node`` to a node, nodes grouped.

    Args:
        name: preset name, e.g. "v100-50gbps".
        device: the device behind every rank.
        ranks_per_node: ranks that share a node (and its NIC).
        intra_node: link between two ranks of one node.
        inter_node: link between ranks on different nodes of one group.
        nodes_per_group: nodes that share a non-blocking switch level (a Sunway
            supernode); None means the whole machine is one group.
        oversubscription: taper of the links between groups; 16/3 means the
            inter-group bandwidth per node is 3/16 of ``inter_node``'s.
        group_label: what a group is called in reports ("supernode", "rack").
        source: citation for the figures, with what is assumed rather than published.
    """

    name: str
    device: Device
    ranks_per_node: int
    intra_node: Link
    inter_node: Link
    nodes_per_group: int | None = None
    oversubscription: float = 1.0
    group_label: str = "group"
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")
        if self.nodes_per_group is not None and self.nodes_per_group < 1:
            raise ValueError(f"nodes_per_group must be >= 1, got {self.nodes_per_group}")
        if self.oversubscription < 1:
            raise ValueError(f"oversubscription must be >= 1, got {self.oversubscription}")

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def group_of(self, rank: int) -> int:
        if self.nodes_per_group is None:
            return 0
        return self.node_of(rank) // self.nodes_per_group

    def level(self, src: int, dst: int) -> LinkLevel:
        """Which link class a message from rank ``src`` to rank ``dst`` crosses."""
        if src == dst:
            return "self"
        if self.node_of(src) == self.node_of(dst):
            return "intra_node"
        if self.group_of(src) == self.group_of(dst):
            return "inter_node"
        return "inter_group"

    @property
    def inter_group(self) -> Link:
        return self.inter_node.scaled(
            bandwidth=1.0 / self.oversubscription,
            name=f"{self.inter_node.name} across {self.group_label}s "
            f"(1:{self.oversubscription:g} taper)",
        )

    def link_for(self, level: LinkLevel) -> Link:
        if level == "intra_node":
            return self.intra_node
        if level == "inter_node":
            return self.inter_node
        if level == "inter_group":
            return self.inter_group
        raise ValueError("a rank does not use a link to reach itself")

    def link(self, src: int, dst: int) -> Link:
        return self.link_for(self.level(src, dst))

    def slowest_level(self, ranks: Iterable[int]) -> LinkLevel | None:
        """The slowest link class a ring over ``ranks`` crosses (None for a single rank)."""
        ranks = list(ranks)
        levels = {self.level(a, b) for a in ranks for b in ranks if a != b}
        if not levels:
            return None
        return min(levels, key=lambda lvl: self.link_for(lvl).bandwidth_Bps)

    def replace(self, **changes: Any) -> Topology:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        dev = self.device
        peaks = ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in dev.peak_flops.items())
        lines = [
            f"{self.name}: {dev.name} ({peaks}; {dev.memory_bytes / 2**30:.0f} GiB)",
            f"  {self.ranks_per_node} ranks/node, intra-node {_fmt_link(self.intra_node)}",
            f"  inter-node {_fmt_link(self.inter_node)}",
        ]
        if self.nodes_per_group is not None:
            lines.append(
                f"  {self.nodes_per_group} nodes/{self.group_label}, across {self.group_label}s "
                f"{_fmt_link(self.inter_group)}"
            )
        if self.source:
            lines.append(f"  source: {self.source}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in increasing order (the sizes a group of ``n`` ranks
    splits into evenly); ``O(sqrt n)``, so it serves machine-scale counts too."""
    try:
        # operator.index admits numpy integers (BenchConfig's counts may be ones)
        count = -1 if isinstance(n, bool) else operator.index(n)
    except TypeError:
        count = -1
    if count < 1:
        raise ValueError(f"divisors needs an integer >= 1, got {n!r}")
    n = count
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _fmt_link(link: Link) -> str:
    return f"{link.name}: {link.bandwidth_Bps / 1e9:.3g} GB/s, {link.latency_s * 1e6:.3g} us"


def balance_matched(
    target: Topology,
    device: Device,
    *,
    dtype: torch.dtype | str = "float32",
    name: str | None = None,
) -> Topology:
    """Scale a target machine's links so that ``device`` sees the same compute-to-link ratio.

    Emulating a V100 cluster on a laptop CPU only preserves the overlap and imbalance
    trade-offs if every link is slowed by the factor by which the CPU is slower than
    the target device: beta_emu = P_cpu * beta_target / P_target (design note
    `moe_bagualu.md` C.3). Latencies grow by the same factor.
    """
    factor = device.flops(dtype) / target.device.flops(dtype)
    return target.replace(
        name=name or f"{target.name} (balance-matched to {device.name})",
        device=device,
        intra_node=target.intra_node.scaled(bandwidth=factor, latency=1 / factor),
        inter_node=target.inter_node.scaled(bandwidth=factor, latency=1 / factor),
        notes=target.notes
        + (f"links scaled by {factor:.3g} so that FLOP/byte matches {target.name}",),
    )
