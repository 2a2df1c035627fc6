"""`furnace emulate`: emulated GEMMs, applications and the type selector (Ape, ICS '22).

    furnace emulate gemm --type FP32-B --size 512 --dist wide --profile a100
    furnace emulate app cg --type OZ2-N14
    furnace emulate select kmeans [--requirement 1e-3] [--profile h100]
    furnace emulate types [--k 512] [--profile ascend910]

Times printed as "modelled" come from native-operation counts and the profile's datasheet
peaks; "CPU" times are wall clock here, where emulation is slower (no narrow units).

Every user mistake is caught before the work starts and ends with exit status 2 and one
line naming the argument (`furnace.runtime.cliargs`): an unknown type, application or
profile, a number out of range, a type whose native format the profile lacks, INT16 (an
integer type) for the float applications, or data the type refuses (`emulate gemm` checks
the generated operands before multiplying them). None of the subcommands writes a file.
"""

from __future__ import annotations

import argparse
import sys
import time

from furnace.runtime.cliargs import (
    UsageError,
    add_config_arguments,
    config_from_args,
    int_in,
    nonnegative_int,
    positive_float,
)

from .config import (
    APP_NAMES,
    APP_SIZES,
    DISTRIBUTIONS,
    MAX_GEMM_SIZE,
    MAX_K,
    AppConfig,
    GemmConfig,
    SelectConfig,
    TypesConfig,
)

# the operands moved to the library (`furnace.emulation.operands`); this module re-exports
# them for code that imported them from here
from .operands import make_operands

__all__ = ["APP_NAMES", "APP_SIZES", "DISTRIBUTIONS", "MAX_GEMM_SIZE", "add_parser",
           "app_name", "make_operands", "type_name"]

# exact reference entries for fp64-class types: random ones and the smallest |C|, where an
# elementwise relative error is hardest to keep
_SAMPLED = 256


def type_name(text: str) -> str:
    """An argparse ``type``: a registered emulated type or OZ1-S<s> / OZ2-N<N>."""
    from .types import get_type

    try:
        return get_type(text).name
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a type listed by `furnace emulate types`, OZ1-S<1..18> or "
            f"OZ2-N<2..20>, got {text!r}") from None


def app_name(text: str) -> str:
    if text not in APP_NAMES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(APP_NAMES)}, got {text!r}")
    return text


def add_parser(subparsers) -> None:
    emu = subparsers.add_parser("emulate", help="Ape: emulated types on a DSA model")
    sub = emu.add_subparsers(dest="emulate_command", metavar="COMMAND")
    emu.set_defaults(func=lambda args: (emu.print_help(), 0)[1])
    # the options are the configs' fields; only their range-checked parsers are added here
    emulated_type = {"type": type_name}
    application = {"flags": ("name",), "type": app_name}

    gemm = sub.add_parser("gemm", help="one emulated GEMM: error, op counts, modelled time")
    add_config_arguments(gemm, GemmConfig, overrides={
        "type": emulated_type, "size": {"type": int_in(1, MAX_GEMM_SIZE)},
        "seed": {"type": nonnegative_int}})
    gemm.set_defaults(func=_gemm)

    app = sub.add_parser("app", help="run an application with one emulated type")
    add_config_arguments(app, AppConfig, overrides={"name": application,
                                                    "type": emulated_type})
    app.set_defaults(func=_app)

    select = sub.add_parser("select", help="choose the cheapest type that meets a requirement")
    add_config_arguments(select, SelectConfig, overrides={
        "name": application, "requirement": {"type": positive_float}})
    select.set_defaults(func=_select)

    types = sub.add_parser("types", help="list the emulated types")
    add_config_arguments(types, TypesConfig, overrides={"k": {"type": int_in(1, MAX_K)}})
    types.set_defaults(func=_types)


def _native_on(etype, profile) -> bool:
    return etype.native == "vector" or etype.native in profile.matrix_peak_ops


def _require_native(etype, profile) -> None:
    from .types import TYPES

    if not _native_on(etype, profile):
        runs = [name for name, t in TYPES.items() if _native_on(t, profile)]
        raise UsageError("--type", f"{etype.name} needs a {etype.native} matrix unit, which "
                         f"--profile {profile.name} lacks; {profile.name} runs "
                         f"{', '.join(runs)}, OZ1-S<s>, OZ2-N<N>")


def _accuracy_lines(etype, A, B, C, seed: int) -> list[str]:
    """How far C is from A @ B, measured against a reference the type's class needs."""
    import numpy as np

    from .naive import (
        bits_correct,
        componentwise_error,
        elementwise_relative_error,
        exact_gemm_entries,
        exact_pairs,
        gemm_floor,
        gemm_reference,
        normwise_error,
        sample_entries,
    )

    if etype.family == "int16":
        # products <= 2^30 and k <= 4096: every partial sum is below 2^53, so a float64
        # GEMM of the integers is exact
        ref = A.astype(np.float64) @ B.astype(np.float64)
        wrong = int(np.count_nonzero(C.astype(np.float64) != ref))
        native = (A.astype(np.float32) @ B.astype(np.float32)).astype(np.float64)
        return [f"  exact integer product: {'yes' if wrong == 0 else f'NO, {wrong} entries differ'}"
                f"; native float32 GEMM of the integers differs in "
                f"{int(np.count_nonzero(native != ref))} entries"]
    floor = gemm_floor(A, B)
    if etype.family != "fp64":
        ref = gemm_reference(A, B)
        err = normwise_error(C, ref, scale=floor)
        native = normwise_error(A @ B, ref, scale=floor)
        comp = componentwise_error(C, ref, A, B)
        return [f"  normwise error {err:.3g} ({bits_correct(err):.1f} bits); native float32 "
                f"GEMM {native:.3g}",
                f"  componentwise max |C - AB| / (|A||B|) {comp:.3g}, a-priori bound "
                f"{etype.error_bound(A.shape[1]):.3g}"]
    n = A.shape[0]
    rows, cols = sample_entries(n, n, _SAMPLED, np.random.default_rng(seed + 1))
    # the smallest |C| by a float64 GEMM; their exact values come from Python ints
    small = np.argsort(np.abs(A @ B), axis=None)[:_SAMPLED]
    rows = np.concatenate([rows, small // n])
    cols = np.concatenate([cols, small % n])
    exact = exact_pairs(exact_gemm_entries(A, B, rows, cols))
    err = normwise_error(C[rows, cols], exact[0], scale=floor)
    elem = elementwise_relative_error(C, A, B, rows, cols, exact)
    native = elementwise_relative_error(A @ B, A, B, rows, cols, exact)
    return [f"  normwise error {err:.3g} ({bits_correct(err):.1f} bits) on {rows.size} exact "
            "entries",
            f"  max elementwise relative error {elem:.3g} (|C - C*| / max(|C*|, u64 (|A||B|)), "
            f"exact, {_SAMPLED} random entries and the {_SAMPLED} smallest |C|); native "
            f"float64 GEMM {native:.3g}"]


def _gemm(args: argparse.Namespace) -> int:
    import numpy as np

    from furnace.runtime.presets import get_dsa_profile

    from .dsa import DSA
    from .selector import GemmSite, modelled_gemm_seconds
    from .types import TYPES, get_type

    cfg = config_from_args(GemmConfig, args)
    etype = get_type(cfg.type)
    profile = get_dsa_profile(cfg.profile)
    _require_native(etype, profile)
    dtype = {"fp64": np.float64, "int16": np.int64}.get(etype.family, np.float32)
    A, B = make_operands(cfg.dist, cfg.size, dtype, np.random.default_rng(cfg.seed))
    problem = etype.range_problem(A, B)
    if problem is not None:
        takes = [name for name, t in TYPES.items() if t.family == etype.family
                 and _native_on(t, profile) and t.fits_range(A, B)]
        raise UsageError("--dist", f"{etype.name} refuses {cfg.dist} data ({problem}); "
                         f"types of its class that take it on {profile.name}: "
                         f"{', '.join(takes) or 'none'}")
    dsa = DSA(profile)
    t0 = time.perf_counter()
    C = etype.gemm(A, B, dsa)
    cpu = time.perf_counter() - t0
    # INT16's native counterpart is a float32 GEMM of the integers (numpy's int64 matmul
    # is no BLAS)
    An, Bn = (A, B) if etype.family != "int16" else (A.astype(np.float32), B.astype(np.float32))
    t0 = time.perf_counter()
    An @ Bn
    cpu_native = time.perf_counter() - t0
    print(f"{etype.name} ({etype.description}) on {cfg.size}^3 {cfg.dist} data")
    for line in _accuracy_lines(etype, A, B, C, cfg.seed):
        print(line)
    for op, tally in sorted(dsa.counters.ops.items()):
        print(f"  native {op}: {tally.calls} calls, {tally.flops / 1e6:.4g} MFLOP")
    flops = 2 * cfg.size**3
    which = "fp64" if etype.family == "fp64" else "fp32"
    base = profile.native_gemm_flops.get(which)
    matrix_only = modelled_gemm_seconds(
        etype, [GemmSite(cfg.size, cfg.size, cfg.size, "", 0.0, 0.0)], profile)
    try:
        modelled = dsa.modelled_seconds(profile)
    except ValueError as exc:  # a profile without a vector or bandwidth figure
        modelled = None
        alone = f"{matrix_only * 1e6:.4g} us" if matrix_only < float("inf") else "n/a"
        print(f"  modelled on {profile.name}: matrix unit alone {alone}; the split/merge and "
              f"vector work cannot be timed ({exc})")
    if base and modelled is not None and etype.family != "int16":
        print(f"  modelled on {profile.name} ({profile.label}): matrix unit alone "
              f"{flops / base / matrix_only:.2f}x native {which}; with the counted split/merge "
              f"work and memory traffic {modelled * 1e6:.4g} us, {flops / base / modelled:.2f}x "
              "(splitting is O(n^2): it pays off only for large GEMMs)")
    elif modelled is not None:
        which = "int16" if etype.family == "int16" else which
        print(f"  modelled on {profile.name} ({profile.label}): {modelled * 1e6:.4g} us with "
              f"the counted split/merge work (no native {which} GEMM figure to compare with)")
    print(f"  CPU time (this machine has no narrow units): emulated {cpu * 1e3:.1f} ms, "
          f"native {cpu_native * 1e3:.2f} ms")
    return 0


def _app(args: argparse.Namespace) -> int:
    import numpy as np

    from furnace.runtime.presets import get_dsa_profile

    from .apps import get_app
    from .dsa import DSA
    from .selector import type_matmul
    from .types import RangeError, get_type

    cfg = config_from_args(AppConfig, args)
    etype = get_type(cfg.type)
    profile = get_dsa_profile(cfg.profile)
    _require_native(etype, profile)
    if etype.family == "int16":
        raise UsageError("--type", f"{etype.name} multiplies integers and the applications "
                         "pass float operands: choose a float type (`furnace emulate types`)")
    app = get_app(cfg.name, cfg.size)
    inputs = app.make_inputs(np.random.default_rng(0))
    dsa = DSA(profile)
    matmul = type_matmul(etype, dsa)
    calls = 0

    def counted(A, B):
        nonlocal calls
        calls += 1
        return matmul(A, B)

    t0 = time.perf_counter()
    try:
        result = app.run(inputs, counted)
    except RangeError as exc:
        hint = f"`furnace emulate select {app.name}` picks a type that takes its data"
        if calls == 1:
            # refused the application's own input data, before any product was computed:
            # a combination of --type and application the selector would not make
            raise UsageError("--type", f"{exc}; {hint}") from None
        # refused an iterate halfway: the run cannot vouch for a result, so there is none
        print(f"furnace emulate app: error: {etype.name} refused GEMM {calls} of "
              f"{app.name}: {exc}; {hint}", file=sys.stderr)
        return 1
    cpu = time.perf_counter() - t0
    metric = app.metric(inputs, result)
    verdict = "meets" if metric <= app.requirement else "MISSES"
    print(f"{app.name} with {etype.name}: {app.metric_name} {metric:.3g} {verdict} the "
          f"requirement {app.requirement:g}")
    try:
        modelled = f"{dsa.modelled_seconds(profile) * 1e3:.4g} ms on {profile.name}"
    except ValueError:
        modelled = f"not timed ({profile.name} has no vector or bandwidth figure)"
    print(f"  native matrix-unit calls {dsa.counters.calls}, modelled {modelled}; "
          f"CPU {cpu:.2f} s")
    return 0


def _select(args: argparse.Namespace) -> int:
    from .apps import get_app
    from .selector import NoTypeMeetsRequirement, select_type

    cfg = config_from_args(SelectConfig, args)
    app = get_app(cfg.name, cfg.size)
    try:
        choice = select_type(app, requirement=cfg.requirement, profile=cfg.profile)
    except NoTypeMeetsRequirement as exc:
        print(exc.choice.explain())
        return 1
    print(choice.explain())
    return 0


def _types(args: argparse.Namespace) -> int:
    from furnace.runtime.presets import get_dsa_profile

    from .types import TYPES

    cfg = config_from_args(TypesConfig, args)
    profile = get_dsa_profile(cfg.profile) if cfg.profile else None
    for name, etype in TYPES.items():
        mark = ""
        if profile is not None and not _native_on(etype, profile):
            mark = f"  [not on {profile.name}: no {etype.native} unit]"
        print(f"{name:<10} {etype.family:<6} {etype.native_gemms:>2} x {etype.native:<6} "
              f"bound(k={cfg.k}) {etype.error_bound(cfg.k):.2g}  {etype.description}{mark}")
    return 0
