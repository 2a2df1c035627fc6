"""Configuration of expert parallelism and FasterMoE's optimizations, and of `furnace moe
bench` runs (dataclasses only).

Hardware constants come from a `furnace.runtime` topology preset, never from environment
variables (FastMoE reads ``FMOE_FASTER_*`` variables; `furnace.moe.compat` maps nothing
of the kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from furnace.runtime.presets import v100_50gbps
from furnace.runtime.topology import Topology, divisors

from .workload import hot_expert, uniform, zipf


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


POLICIES: dict[str, dict] = {
    "baseline": {},
    "shadow": {"shadowing": True},
    "smart": {"smart_schedule": True},
    "both": {"shadowing": True, "smart_schedule": True},
}


MODES = ("emulated", "virtual", "measured")
ROUTINGS = ("hot", "zipf", "uniform", "trace")
# above this the Zipf head already takes > 99.9% of the tokens, and larger exponents
# overflow the power at thousands of experts
MAX_ZIPF_EXPONENT = 10.0


class BenchConfigError(ValueError):
    """A `BenchConfig` field out of range. ``field`` names it and ``allowed`` says what is
    allowed, so the command line can name its own flag instead of the field."""

    def __init__(self, field: str, allowed: str) -> None:
        self.field = field
        self.allowed = allowed
        super().__init__(f"{field} {allowed}")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _finite_in(value, lo: float, hi: float) -> bool:
    return bool(isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
                and math.isfinite(value) and lo <= value <= hi)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark run: model size, routing, ranks, timing mode.

    Args:
        world_size: ranks W (experts are spread over them).
        experts_per_rank: E.
        d_model, d_hidden: H and alpha*H of the experts.
        tokens_per_rank: tokens each rank routes per step.
        top_k: experts per token.
        routing: "hot", "zipf", "uniform" or "trace" (first choices distributed like
            ``trace_probabilities``, e.g. a real gate's recorded counts).
        hot_share: share of first choices on expert 0 (routing="hot").
        zipf_exponent: exponent of the Zipf skew (routing="zipf").
        mode: "emulated" (sleeping link, wall clock), "virtual" (virtual clock) or
            "measured" (no emulation; real links, e.g. NCCL under torchrun).
        steps, warmup: timed and untimed steps per policy.
        policies: which of `POLICIES` to run.
        seed: seeds the weights and the synthetic gate.
        group_size: force the smart schedule's G (None: the performance model chooses).
        trace_probabilities: the per-expert shares of routing="trace".

    Raises:
        BenchConfigError: a field is out of range (a ValueError that names the field).
    """

    # metadata["help"]: the help of the field's `furnace moe bench` option
    world_size: int = field(default=4, metadata={"help": "ranks W (experts are spread over "
                                                         "them)"})
    experts_per_rank: int = field(default=1, metadata={"help": "experts E on each rank"})
    d_model: int = field(default=256, metadata={"help": "token width H"})
    d_hidden: int = field(default=1024, metadata={"help": "expert hidden width F"})
    tokens_per_rank: int = field(default=2048, metadata={"help": "tokens per rank"})
    top_k: int = field(default=1, metadata={
        "help": "experts per token, at most the experts in all (ranks x experts per rank)"})
    routing: str = field(default="hot", metadata={
        "help": "synthetic routing skew of the first choices", "choices": ROUTINGS})
    hot_share: float = field(default=0.5, metadata={
        "help": "share of first choices on expert 0 (routing hot)"})
    zipf_exponent: float = field(default=1.2, metadata={"help": "skew of routing zipf"})
    mode: str = field(default="emulated", metadata={
        "help": "emulated: wall clock on a sleeping link balance-matched to V100 + 50 Gb/s; "
        "virtual: deterministic clock of that testbed; measured: no emulation (use under "
        "torchrun on GPUs)", "choices": MODES})
    steps: int = field(default=3, metadata={"help": "timed steps per policy"})
    warmup: int = field(default=2, metadata={"help": "untimed steps per policy"})
    policies: tuple[str, ...] = field(default=("baseline", "shadow", "smart", "both"), metadata={
        "help": f"policies to run: {', '.join(POLICIES)}", "choices": tuple(POLICIES)})
    seed: int = field(default=0, metadata={"help": "seed of the weights and synthetic gate"})
    group_size: int | None = field(default=None, metadata={
        "help": "force the smart schedule's G, a divisor of the ranks (default: the model "
        "chooses)"})
    trace_probabilities: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise BenchConfigError(name, allowed)

        for name in ("world_size", "experts_per_rank", "d_model", "d_hidden",
                     "tokens_per_rank", "steps"):
            value = getattr(self, name)
            need(_is_int(value) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        need(_is_int(self.warmup) and self.warmup >= 0, "warmup",
             f"must be an integer >= 0, got {self.warmup!r}")
        need(_is_int(self.seed), "seed", f"must be an integer, got {self.seed!r}")
        need(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        need(self.routing in ROUTINGS, "routing",
             f"must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        need(_is_int(self.top_k) and 1 <= self.top_k <= self.num_experts, "top_k",
             f"must be an integer in [1, {self.num_experts}] (the number of experts), "
             f"got {self.top_k!r}")
        need(_finite_in(self.hot_share, 0.0, 1.0), "hot_share",
             f"must be a finite number in [0, 1], got {self.hot_share!r}")
        need(_finite_in(self.zipf_exponent, 0.0, MAX_ZIPF_EXPONENT), "zipf_exponent",
             f"must be a finite number in [0, {MAX_ZIPF_EXPONENT:g}], "
             f"got {self.zipf_exponent!r}")
        policies = tuple(self.policies)
        need(len(policies) > 0, "policies", "must name at least one policy")
        unknown = [p for p in policies if p not in POLICIES]
        need(not unknown, "policies",
             f"must be among {', '.join(POLICIES)}, got {', '.join(map(str, unknown))}")
        need(len(set(policies)) == len(policies), "policies",
             f"must not repeat a policy, got {' '.join(policies)}")
        if self.group_size is not None:
            need(_is_int(self.group_size) and self.group_size >= 1
                 and self.world_size % self.group_size == 0, "group_size",
                 f"must divide the number of ranks {self.world_size} (one of "
                 f"{', '.join(str(g) for g in divisors(self.world_size))}), "
                 f"got {self.group_size!r}")
        if self.routing == "trace":
            p = self.trace_probabilities
            ok = p is not None and len(p) == self.num_experts
            if ok:
                arr = np.asarray(p, dtype=np.float64)
                ok = bool(np.isfinite(arr).all() and (arr >= 0).all()
                          and np.isclose(arr.sum(), 1.0))
            need(ok, "trace_probabilities", f"routing='trace' needs {self.num_experts} "
                 "non-negative trace_probabilities summing to 1")

    @property
    def num_experts(self) -> int:
        return self.world_size * self.experts_per_rank

    def probabilities(self) -> np.ndarray:
        if self.routing == "hot":
            return hot_expert(self.num_experts, self.hot_share)
        if self.routing == "zipf":
            return zipf(self.num_experts, self.zipf_exponent)
        if self.routing == "trace":
            return np.asarray(self.trace_probabilities, dtype=np.float64)
        return uniform(self.num_experts)
