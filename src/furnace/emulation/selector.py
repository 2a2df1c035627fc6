"""Choosing an emulated type for an application: Ape's selector, generalised.

Ape (Ma et al., ICS '22; design note emulated_types.md sections 2.3 and 6.5) picks FP32-F
when every input fits fp16's range and FP32-B otherwise, per GEMM or per 128x128 tile. This
module does that and goes on from there, for any application whose metric has a
requirement:

1. **Trace.** Run the application once with an exact (float64) matmul and record every
   GEMM site: shapes, operand dtype (fp64-class work passes float64 operands), the
   operands' extreme magnitudes, and which candidate types' range checks refuse the
   operands (`EmulatedType.range_problem` on the actual operands, as the type's ``gemm``
   would see them).
2. **Range check (Ape).** Drop every type that refuses some traced site. A type that
   passes here but refuses an operand of its own run (the iterates differ from the
   trace's) raises `RangeError` there and counts as "failed": a chosen type ran every GEMM
   inside its error bound.
3. **Error estimate.** Each type's a-priori GEMM error bound at the largest k; a type whose
   bound misses the requirement by more than `hopeless_factor` is not tried. The bound is a
   GEMM bound, not the application's metric, so it only rules out the hopeless.
4. **Cheapest first, escalating.** The rest are ordered by modelled time on the chosen DSA
   profile (native GEMMs x 2mnk / peak of their native format, over the traced sites; costs
   within 1 % tie and go to the smaller error bound) and run one by one until the
   application's metric meets the requirement. fp64-class types are candidates only for
   applications that pass float64 operands.

`PerTileType` is Ape's fine-grained variant: every 128x128 tile product uses the cheapest of
its types whose range check passes for that tile pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class NoTypeMeetsRequirement(RuntimeError):
    """Raised when no candidate type meets the application's requirement; has `choice`."""

    def __init__(self, message: str, choice: Choice):
        super().__init__(message)
        self.choice = choice


@dataclass
class GemmSite:
    """One traced GEMM call: shapes, operand dtype and extreme magnitudes."""

    m: int
    n: int
    k: int
    dtype: str
    max_abs: float
    min_nonzero: float
    # type name -> why its range check refuses this site's operands
    refused: dict[str, str] = field(default_factory=dict)


@dataclass
class Trial:
    """What happened to one candidate."""

    type_name: str
    status: str  # "chosen", "missed", "out of range", "hopeless estimate", "not native", "failed"
    estimate: float | None = None
    metric: float | None = None
    modelled_seconds: float | None = None
    detail: str = ""


@dataclass
class Choice:
    """The selector's decision and how it got there."""

    app: str
    requirement: float
    profile: str
    type_name: str | None
    metric: float | None
    modelled_seconds: float | None
    sites: list[GemmSite] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)

    @property
    def runs(self) -> int:
        """Application runs spent searching (the trace not counted)."""
        return sum(t.metric is not None or t.status == "failed" for t in self.trials)

    def explain(self) -> str:
        """A few lines a person can read: what was traced, excluded, tried and chosen."""
        flops = sum(2 * s.m * s.n * s.k for s in self.sites)
        dtypes = sorted({s.dtype for s in self.sites})
        largest = max((s.max_abs for s in self.sites), default=0.0)
        lines = [f"{self.app}: requirement {self.requirement:g} on its metric; profile "
                 f"{self.profile}",
                 f"traced {len(self.sites)} GEMMs ({flops / 1e9:.3g} GFLOP, operands "
                 f"{'/'.join(dtypes)}, |x| up to {largest:.3g})"]
        for t in self.trials:
            parts = [f"  {t.type_name:<10} {t.status}"]
            if t.estimate is not None:
                parts.append(f"bound {t.estimate:.2g}")
            if t.metric is not None:
                parts.append(f"metric {t.metric:.3g}")
            if t.modelled_seconds is not None:
                parts.append(f"modelled {t.modelled_seconds:.3g} s")
            if t.detail:
                parts.append(t.detail)
            lines.append(", ".join(parts))
        lines.append(f"chosen: {self.type_name} after {self.runs} run(s)" if self.type_name
                     else "no type meets the requirement")
        return "\n".join(lines)


def trace(app, inputs, types=()) -> list[GemmSite]:
    """Run `app` once with an exact float64 matmul, recording every GEMM site.

    For each of ``types`` the site records whether its range check refuses the operands,
    cast to the type's input precision as `type_matmul` casts them.
    """
    from .types import _zero_nonfinite, operand_stats

    sites: list[GemmSite] = []

    def recording(A, B):
        A, B = np.asarray(A), np.asarray(B)
        both = np.concatenate([np.abs(A).ravel(), np.abs(B).ravel()])
        nonzero = both[both > 0]
        refused, stats = {}, {}
        for etype in types:
            dtype = _input_dtype(etype)
            if not etype.range_from_stats:
                problem = etype.range_problem(np.asarray(A, dtype=dtype),
                                              np.asarray(B, dtype=dtype))
            else:
                if dtype not in stats:
                    # the statistics the range checks read, once per input precision;
                    # operands cast as type_matmul casts them, NaN / inf rows and columns
                    # left out as gemm leaves them out
                    with np.errstate(over="ignore"):
                        stats[dtype] = operand_stats(*_zero_nonfinite(
                            np.asarray(A, dtype=dtype), np.asarray(B, dtype=dtype)))
                problem = etype.stats_problem(stats[dtype])
            if problem is not None:
                refused[etype.name] = problem
        sites.append(GemmSite(m=A.shape[0], n=B.shape[1], k=A.shape[1], dtype=str(A.dtype),
                              max_abs=float(both.max(initial=0.0)),
                              min_nonzero=float(nonzero.min()) if nonzero.size else 0.0,
                              refused=refused))
        return (A.astype(np.float64) @ B.astype(np.float64)).astype(np.result_type(A, B))

    app.run(inputs, recording)
    return sites


def _refusal(etype, sites: list[GemmSite]) -> str | None:
    """The first traced site's reason for refusing ``etype``, or None if every site fits."""
    for number, site in enumerate(sites):
        if etype.name in site.refused:
            return f"GEMM {number}: {site.refused[etype.name]}"
    return None


def _input_dtype(etype):
    return np.float64 if etype.family == "fp64" else np.float32


def type_matmul(etype, dsa):
    """A matmul(A, B) for applications: operands cast to the type's input precision, the
    product computed by `etype.gemm` on `dsa`, returned in the caller's dtype."""
    def matmul(A, B):
        A, B = np.asarray(A), np.asarray(B)
        dtype = _input_dtype(etype)
        out = etype.gemm(np.ascontiguousarray(A, dtype=dtype),
                         np.ascontiguousarray(B, dtype=dtype), dsa)
        return np.asarray(out).astype(np.result_type(A, B), copy=False)

    return matmul


def modelled_gemm_seconds(etype, sites: list[GemmSite], profile) -> float:
    """Matrix-unit time of the traced GEMMs under `etype`: native GEMMs x 2mnk / peak.

    inf where the profile has no figure for the unit (it ranks such a type last).
    """
    flops = sum(2 * s.m * s.n * s.k for s in sites)
    if etype.native == "vector":
        if profile.vector_fp32_flops is None:
            return float("inf")
        return flops * 10 / profile.vector_fp32_flops  # ~20 fp32 ops per double-float MAC
    peak = profile.matrix_peak_ops.get(etype.native)
    if peak is None:
        return float("inf")
    return etype.native_gemms * flops / peak


def select_type(app, inputs=None, requirement: float | None = None, *, profile="a100",
                candidates=None, hopeless_factor: float = 1e6, rng_seed: int = 0) -> Choice:
    """The cheapest emulated type whose run of `app` meets `requirement` (see module doc).

    Args:
        app: an `apps.Application` (make_inputs, run(inputs, matmul), metric, requirement).
        inputs: its inputs (default: app.make_inputs with a seeded generator).
        requirement: the bound on app.metric (default: app.requirement).
        profile: DSA profile name or `DSAProfile` for the cost model and native formats.
        candidates: type names to consider (default: every registered float type).
        hopeless_factor: skip types whose GEMM error bound exceeds requirement x this.
    Returns:
        `Choice`; `choice.explain()` says why.
    Raises:
        NoTypeMeetsRequirement: every candidate was excluded or missed (it carries the
            `Choice` with all trials).
    """
    from furnace.runtime.presets import get_dsa_profile

    from .dsa import DSA, NotNativeError
    from .types import TYPES, get_type

    prof = get_dsa_profile(profile) if isinstance(profile, str) else profile
    if inputs is None:
        inputs = app.make_inputs(np.random.default_rng(rng_seed))
    requirement = app.requirement if requirement is None else float(requirement)
    if not requirement > 0:
        raise ValueError(f"requirement must be positive, got {requirement}")
    # INT16 takes integers; no application here passes them
    pool = [get_type(name) for name in candidates] if candidates is not None else [
        t for t in TYPES.values() if t.family != "int16"]
    native = [t for t in pool if t.native == "vector" or t.native in prof.matrix_peak_ops]
    sites = trace(app, inputs, native)
    choice = Choice(app=app.name, requirement=requirement, profile=prof.name, type_name=None,
                    metric=None, modelled_seconds=None, sites=sites)
    # fp64-class types are candidates only where the application asks for fp64-class GEMMs
    # (passes float64 operands); an fp32 site is emulated with fp32-class or narrower types
    families = ("narrow", "fp32", "fp64") if any(s.dtype == "float64" for s in sites) \
        else ("narrow", "fp32")
    etypes = pool if candidates is not None else [t for t in pool if t.family in families]
    k_max = max((s.k for s in sites), default=1)
    ranked = []
    for etype in etypes:
        name = etype.name
        if etype not in native:
            choice.trials.append(Trial(name, "not native", detail=f"{prof.name} has no "
                                       f"{etype.native} matrix unit"))
            continue
        refusal = _refusal(etype, sites)
        if refusal is not None:
            choice.trials.append(Trial(name, "out of range", detail=refusal[:100]))
            continue
        estimate = float(etype.error_bound(k_max))
        if estimate > requirement * hopeless_factor:
            choice.trials.append(Trial(name, "hopeless estimate", estimate=estimate))
            continue
        ranked.append((modelled_gemm_seconds(etype, sites, prof), name, etype, estimate))
    # equal modelled cost (within 1 %: FP32-T's 3 tf32 GEMMs and FP32-B's 6 bf16 GEMMs on
    # A100 or H100) goes to the smaller error bound
    cheapest = min((item[0] for item in ranked), default=1.0)
    ranked.sort(key=lambda item: (round(np.log(max(item[0], 1e-300) / max(cheapest, 1e-300))
                                        / np.log(1.01)), item[3]))
    for seconds, name, etype, estimate in ranked:
        dsa = DSA(prof)
        try:
            result = app.run(inputs, type_matmul(etype, dsa))
            metric = float(app.metric(inputs, result))
        except (NotNativeError, ValueError, FloatingPointError) as exc:
            choice.trials.append(Trial(name, "failed", estimate=estimate, detail=str(exc)[:80]))
            continue
        detail = ""
        try:
            modelled = dsa.modelled_seconds(prof) if dsa.counters.calls else seconds
        except ValueError:
            # the profile lacks a vector or bandwidth figure (Ascend 910 here)
            modelled, detail = seconds, "matrix-unit time only"
        met = bool(np.isfinite(metric) and metric <= requirement)
        choice.trials.append(Trial(name, "chosen" if met else "missed", estimate=estimate,
                                   metric=metric, modelled_seconds=modelled, detail=detail))
        if met:
            choice.type_name, choice.metric, choice.modelled_seconds = name, metric, modelled
            return choice
    raise NoTypeMeetsRequirement(
        f"no emulated type meets {app.name}'s requirement {requirement:g}:\n"
        + choice.explain(), choice)


class PerTileType:
    """Ape's fine-grained choice: each tile product uses the first of `types` (cheapest
    first) whose range check passes for both tiles; tiles are `tile` x `tile`."""

    def __init__(self, types, tile: int = 128):
        from .types import get_type

        self.types = [get_type(t) if isinstance(t, str) else t for t in types]
        if not self.types:
            raise ValueError("PerTileType needs at least one type")
        families = {t.family for t in self.types}
        if len(families) != 1:
            raise ValueError(f"tile types must share a family, got {families}")
        if tile < 1:
            raise ValueError(f"tile must be >= 1, got {tile}")
        self.tile = tile
        self.family = families.pop()
        self.name = "tiled(" + ",".join(t.name for t in self.types) + ")"
        self.native = self.types[0].native
        self.native_gemms = max(t.native_gemms for t in self.types)
        self.tile_counts: dict[str, int] = {t.name: 0 for t in self.types}

    def fits_range(self, A, B=None) -> bool:
        return self.range_problem(A, B) is None

    def range_problem(self, A, B=None) -> str | None:
        """None if some type takes every tile pair (see `gemm`), else the first refusal."""
        from .types import _as_operands

        A, B = _as_operands(A, B)
        t = self.tile
        for i in range(0, A.shape[0], t):
            for j in range(0, B.shape[1], t):
                for p in range(0, A.shape[1], t):
                    a, b = A[i:i + t, p:p + t], B[p:p + t, j:j + t]
                    problems = [e.range_problem(a, b) for e in self.types]
                    if all(problems):
                        return f"tile ({i}, {p}) x ({p}, {j}): {problems[-1]}"
        return None

    def error_bound(self, k: int) -> float:
        return max(t.error_bound(k) for t in self.types)

    def gemm(self, A: np.ndarray, B: np.ndarray, dsa) -> np.ndarray:
        m, k = A.shape
        n = B.shape[1]
        t = self.tile
        out = np.zeros((m, n), dtype=np.float64 if self.family == "fp64" else np.float32)
        for i in range(0, m, t):
            for j in range(0, n, t):
                for p in range(0, k, t):
                    a, b = A[i:i + t, p:p + t], B[p:p + t, j:j + t]
                    etype = next((e for e in self.types if e.fits_range(a, b)), None)
                    if etype is None:
                        raise ValueError(f"tile ({i}, {p}) x ({p}, {j}) fits none of "
                                         f"{[e.name for e in self.types]}")
                    self.tile_counts[etype.name] += 1
                    out[i:i + t, j:j + t] += etype.gemm(np.ascontiguousarray(a),
                                                        np.ascontiguousarray(b), dsa)
        return out
