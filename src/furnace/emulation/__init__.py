"""Emulated high-bitwidth types on low-bitwidth hardware, after Ape.

Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, "Efficiently Emulating High-Bitwidth Computation
with Low-Bitwidth Hardware", ICS '22; design note `emulated_types.md` section 6. The narrow
formats and their exact rounding are in `formats`, the accelerator model that offers only
native operations (and counts them) in `dsa`. Names are exported lazily so that importing
the package does not import numpy-heavy submodules that a caller does not use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "select_type": "selector",
    "Choice": "selector",
    "NoTypeMeetsRequirement": "selector",
    "PerTileType": "selector",
    "type_matmul": "selector",
    "FloatFormat": "formats",
    "FORMATS": "formats",
    "FP16": "formats",
    "BF16": "formats",
    "TF32": "formats",
    "FP32": "formats",
    "FP8_E4M3": "formats",
    "FP8_E4M3_NAN": "formats",
    "FP8_E5M2": "formats",
    "FP8_E5M2_SAT": "formats",
    "get_format": "formats",
    "round_to": "formats",
    "is_representable": "formats",
    "check_int8": "formats",
    "check_int32": "formats",
    "DSA": "dsa",
    "DSACounters": "dsa",
    "OpTally": "dsa",
    "NotNativeError": "dsa",
    "Int32OverflowError": "dsa",
    "modelled_seconds": "dsa",
    "EmulatedType": "types",
    "RangeError": "types",
    "TYPES": "types",
    "get_type": "types",
    "ozaki1": "types",
    "ozaki2": "types",
    "bound_metric": "types",
    "ieee_nonfinite_products": "types",
    "EmulatedMatmulMode": "torch_mode",
    "EmulatedGemmError": "torch_mode",
    "emulated_matmul": "torch_mode",
    "gemm_from_type": "torch_mode",
    "Application": "apps",
    "APPS": "apps",
    "get_app": "apps",
    "hpl_scaled_residual": "apps",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
