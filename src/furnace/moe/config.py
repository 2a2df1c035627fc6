"""Configuration of expert parallelism and FasterMoE's optimizations (dataclasses only).

Hardware constants come from a `furnace.runtime` topology preset, never from environment
variables (FastMoE reads ``FMOE_FASTER_*`` variables; `furnace.moe.compat` maps nothing
of the kind).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from furnace.runtime.presets import v100_50gbps
from furnace.runtime.topology import Topology


@dataclass(frozen=True, kw_only=True)
class ExpertParallelConfig:
    """How `expert_parallel` runs the experts of each MoE layer.

    Args:
        shadowing: decide every iteration which popular experts to replicate (FasterMoE
            dynamic shadowing, with the performance model on ``topology``).
        shadow_mask: force this mask (one bool per global expert) instead of deciding;
            for tests and ablations.
        smart_schedule: split the all-to-all into group-wise steps overlapped with the
            expert computation (FasterMoE smart scheduling).
        group_size: ranks per step group G; None lets the performance model choose.
        topology: the machine the cost rules assume (P, beta, alpha); FasterMoE's V100
            testbed by default. Use the emulated machine's topology when emulating.
        half_efficiency_tokens: b_half of the modelled GEMM efficiency P*b/(b+b_half).
        step_overhead_s: modelled fixed cost of one exchange step (see `MoEPerfModel`).
    """

    shadowing: bool = False
    shadow_mask: tuple[bool, ...] | None = None
    smart_schedule: bool = False
    group_size: int | None = None
    topology: Topology = field(default_factory=v100_50gbps)
    half_efficiency_tokens: float = 0.0
    step_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.half_efficiency_tokens < 0 or self.step_overhead_s < 0:
            raise ValueError("half_efficiency_tokens and step_overhead_s must be >= 0")
