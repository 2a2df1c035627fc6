"""Emulated high-bitwidth types on low-bitwidth hardware, after Ape.

Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, "Efficiently Emulating High-Bitwidth Computation
with Low-Bitwidth Hardware", ICS '22; design note `emulated_types.md` section 6. The narrow
formats and their exact rounding are in `formats`, the accelerator model that offers only
native operations (and counts them) in `dsa`, the emulated types in `types`, the type
selector in `selector`, matmuls inside torch code in `torch_mode`, the applications in
`apps`, GEMM operands in `operands` and the configs in `config`.

The public names are plain imports. Importing the package costs numpy, scipy (`apps`) and
torch (`torch_mode`, and `types` through `furnace.runtime.presets`); every entry point of
the package (its CLI, its experiments) loads them anyway, and no rank worker imports it.
"""

from __future__ import annotations

from .apps import APPS, Application, get_app, hpl_scaled_residual
from .config import AppConfig, GemmConfig, SelectConfig, TypesConfig
from .dsa import (
    DSA,
    DSACounters,
    Int32OverflowError,
    NotNativeError,
    OpTally,
    modelled_seconds,
)
from .formats import (
    BF16,
    FORMATS,
    FP8_E4M3,
    FP8_E4M3_NAN,
    FP8_E5M2,
    FP8_E5M2_SAT,
    FP16,
    FP32,
    TF32,
    FloatFormat,
    check_int8,
    check_int32,
    get_format,
    is_representable,
    round_to,
)
from .operands import DISTRIBUTIONS, make_operands
from .selector import Choice, NoTypeMeetsRequirement, PerTileType, select_type, type_matmul
from .torch_mode import EmulatedGemmError, EmulatedMatmulMode, emulated_matmul, gemm_from_type
from .types import (
    TYPES,
    EmulatedType,
    RangeError,
    bound_metric,
    get_type,
    ieee_nonfinite_products,
    ozaki1,
    ozaki2,
)

__all__ = [
    "APPS", "BF16", "DISTRIBUTIONS", "DSA", "FORMATS", "FP16", "FP32", "FP8_E4M3",
    "FP8_E4M3_NAN", "FP8_E5M2", "FP8_E5M2_SAT", "TF32", "TYPES", "AppConfig", "Application",
    "Choice", "DSACounters", "EmulatedGemmError", "EmulatedMatmulMode", "EmulatedType",
    "FloatFormat", "GemmConfig", "Int32OverflowError", "NoTypeMeetsRequirement",
    "NotNativeError", "OpTally", "PerTileType", "RangeError", "SelectConfig", "TypesConfig",
    "bound_metric", "check_int8", "check_int32", "emulated_matmul", "gemm_from_type",
    "get_app", "get_format", "get_type", "hpl_scaled_residual", "ieee_nonfinite_products",
    "is_representable", "make_operands", "modelled_seconds", "ozaki1", "ozaki2", "round_to",
    "select_type", "type_matmul",
]
