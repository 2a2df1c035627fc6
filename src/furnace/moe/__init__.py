"""FasterMoE (He et al., PPoPP'22) in Furnace: an expert-parallel MoE layer with dynamic
shadowing, smart scheduling and a topology-aware gate, driven by a performance model.

    layer = MoETransformerMLP(d_model=256, d_hidden=1024, num_experts=8, top_k=2)
    expert_parallel(model, comm, ExpertParallelConfig(shadowing=True, smart_schedule=True))
"""

from .config import BenchConfig, ExpertParallelConfig
from .experts import ExpertBank, MLPExperts, ModuleExperts
from .gates import GATES, BaseGate, GateContext, GateOutput, make_gate
from .layer import MoELayer, MoETransformerMLP, RoutingStats
from .lm import MoELMConfig, MoETransformerLM
from .naive import naive_moe
from .parallel import ExpertParallel, LayerStats, ddp_ignore_experts, expert_parallel
from .perfmodel import MoEPerfModel, StepLatency

__all__ = [
    "GATES",
    "BaseGate",
    "BenchConfig",
    "ExpertBank",
    "ExpertParallel",
    "ExpertParallelConfig",
    "GateContext",
    "GateOutput",
    "LayerStats",
    "MLPExperts",
    "ModuleExperts",
    "MoELMConfig",
    "MoELayer",
    "MoEPerfModel",
    "MoETransformerLM",
    "MoETransformerMLP",
    "RoutingStats",
    "StepLatency",
    "ddp_ignore_experts",
    "expert_parallel",
    "make_gate",
    "naive_moe",
]
