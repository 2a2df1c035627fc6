"""BaGuaLu (Ma et al., PPoPP'22) in Furnace: MoDa hybrid-parallel training of MoE models on a
supercomputer's hierarchy (issue 13, in progress).

Built so far: the planner for a Sunway-class machine (`planner`, `furnace hybrid plan`) and
mixed precision as BaGuaLu uses it (`precision`). See README.md for what follows the paper
and what is our reconstruction.
"""

from .config import LayoutError, MoDaLayout, MoEModelSpec, parse_param_count
from .planner import (
    BYTES_PER_PARAM,
    PAPER_EFLOPS,
    PAPER_NODES,
    PAPER_PARAMS,
    Calibration,
    CalibrationError,
    LayoutSearch,
    MemoryBreakdown,
    Plan,
    calibrate,
    default_topology,
    plan,
    search_layouts,
    sensitivity,
    spec_for_machine,
)
from .precision import (
    BAGUALU_BYTES_PER_PARAM,
    DynamicLossScaler,
    LossScaleConfig,
    MemoryAccount,
    MixedPrecision,
    MixedPrecisionConfig,
    PrecisionSpeed,
    PrecisionSpeedConfig,
    account_memory,
    measure_memory,
    measure_precision_speed,
)

__all__ = [
    "BAGUALU_BYTES_PER_PARAM",
    "BYTES_PER_PARAM",
    "PAPER_EFLOPS",
    "PAPER_NODES",
    "PAPER_PARAMS",
    "Calibration",
    "CalibrationError",
    "DynamicLossScaler",
    "LayoutError",
    "LayoutSearch",
    "LossScaleConfig",
    "MemoryAccount",
    "MemoryBreakdown",
    "MixedPrecision",
    "MixedPrecisionConfig",
    "MoDaLayout",
    "MoEModelSpec",
    "Plan",
    "PrecisionSpeed",
    "PrecisionSpeedConfig",
    "account_memory",
    "calibrate",
    "default_topology",
    "measure_memory",
    "measure_precision_speed",
    "parse_param_count",
    "plan",
    "search_layouts",
    "sensitivity",
    "spec_for_machine",
]
