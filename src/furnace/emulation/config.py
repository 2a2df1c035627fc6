"""Configuration of the emulated-type runs (Ape, Ma et al., ICS '22; design note
`emulated_types.md` section 6), as dataclasses only.

One dataclass per thing `furnace emulate` runs: `GemmConfig` (one emulated GEMM on test
matrices of a chosen size and distribution), `AppConfig` (an application with one type),
`SelectConfig` (the type selector on an application) and `TypesConfig` (the list of types
and their a-priori bounds). The command line declares its options from these fields
(`furnace.runtime.cliargs.add_config_arguments`), so flags, defaults and help are stated
once, here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from furnace.runtime.presets import DSA_PROFILES

from .operands import DISTRIBUTIONS

__all__ = [
    "APP_NAMES",
    "APP_SIZES",
    "DISTRIBUTIONS",
    "MAX_GEMM_SIZE",
    "MAX_K",
    "PROFILES",
    "AppConfig",
    "GemmConfig",
    "SelectConfig",
    "TypesConfig",
]

# the applications of apps.APPS (a test keeps the two in step); named here so that building
# the command line does not import scipy
APP_NAMES = ("cg", "gemm-narrow", "gemm-wide", "kmeans", "lanczos", "lu-ir", "mlp")
APP_SIZES = ("tiny", "small")
PROFILES = tuple(DSA_PROFILES)
MAX_GEMM_SIZE = 4096
# inner dimensions of the a-priori bounds beyond this are a typo, not a question
MAX_K = 10**6

_TYPE_HELP = "emulated type, e.g. FP32-F, OZ2-N14 (`furnace emulate types` lists them)"
_APP_HELP = f"application: {', '.join(APP_NAMES)}"


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> None:
    if (isinstance(value, bool) or not isinstance(value, int) or value < lo
            or (hi is not None and value > hi)):
        upper = f", <= {hi}" if hi is not None else ""
        raise ValueError(f"{name} must be an integer >= {lo}{upper}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    """One emulated GEMM C = A B with m = n = k = ``size`` (`furnace emulate gemm`)."""

    type: str = field(metadata={"help": _TYPE_HELP})
    size: int = field(default=256, metadata={"help": f"m = n = k, in [1, {MAX_GEMM_SIZE}]"})
    dist: str = field(default="uniform", metadata={
        "help": "operand distribution (integer analogues for INT16)",
        "choices": DISTRIBUTIONS})
    profile: str = field(default="a100", metadata={"help": "DSA profile", "choices": PROFILES})
    seed: int = field(default=0, metadata={"help": "operand seed"})

    def __post_init__(self) -> None:
        _check_int("size", self.size, 1, MAX_GEMM_SIZE)
        _check_choice("dist", self.dist, DISTRIBUTIONS)
        _check_choice("profile", self.profile, PROFILES)
        _check_int("seed", self.seed, 0)


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """An application run with one emulated type (`furnace emulate app`)."""

    name: str = field(metadata={"help": _APP_HELP})
    type: str = field(metadata={"help": _TYPE_HELP})
    size: str = field(default="small", metadata={"help": "problem size", "choices": APP_SIZES})
    profile: str = field(default="a100", metadata={"help": "DSA profile", "choices": PROFILES})

    def __post_init__(self) -> None:
        _check_choice("name", self.name, APP_NAMES)
        _check_choice("size", self.size, APP_SIZES)
        _check_choice("profile", self.profile, PROFILES)


@dataclass(frozen=True, kw_only=True)
class SelectConfig:
    """The type selector on one application (`furnace emulate select`)."""

    name: str = field(metadata={"help": _APP_HELP})
    requirement: float | None = field(default=None, metadata={
        "help": "bound on the application's metric (default: its own)"})
    size: str = field(default="small", metadata={"help": "problem size", "choices": APP_SIZES})
    profile: str = field(default="a100", metadata={"help": "DSA profile", "choices": PROFILES})

    def __post_init__(self) -> None:
        _check_choice("name", self.name, APP_NAMES)
        if self.requirement is not None and not (math.isfinite(self.requirement)
                                                 and self.requirement > 0):
            raise ValueError(f"requirement must be a finite number > 0, got "
                             f"{self.requirement!r}")
        _check_choice("size", self.size, APP_SIZES)
        _check_choice("profile", self.profile, PROFILES)


@dataclass(frozen=True, kw_only=True)
class TypesConfig:
    """The list of emulated types (`furnace emulate types`)."""

    k: int = field(default=512, metadata={"help": "inner dimension for the a-priori bounds"})
    profile: str | None = field(default=None, metadata={
        "help": "mark the types this profile cannot run", "choices": PROFILES})

    def __post_init__(self) -> None:
        _check_int("k", self.k, 1, MAX_K)
        if self.profile is not None:
            _check_choice("profile", self.profile, PROFILES)
