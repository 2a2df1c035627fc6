"""`furnace emulate`: emulated GEMMs, applications and the type selector (Ape, ICS '22).

    furnace emulate gemm --type FP32-B --size 512 --dist wide --profile a100
    furnace emulate app cg --type OZ2-N14
    furnace emulate select kmeans [--requirement 1e-3] [--profile h100]
    furnace emulate types            # the catalogue with its native GEMM counts and bounds

Times printed as "modelled" come from native-operation counts and the profile's datasheet
peaks; "CPU" times are wall clock here, where emulation is slower (no narrow units).
"""

from __future__ import annotations

import argparse
import sys
import time

DISTRIBUTIONS = ("uniform", "normal", "wide", "cancel")


def add_parser(subparsers) -> None:
    emu = subparsers.add_parser("emulate", help="Ape: emulated types on a DSA model")
    sub = emu.add_subparsers(dest="emulate_command", metavar="COMMAND")
    emu.set_defaults(func=lambda args: (emu.print_help(), 0)[1])

    gemm = sub.add_parser("gemm", help="one emulated GEMM: error, op counts, modelled time")
    gemm.add_argument("--type", required=True, help="emulated type, e.g. FP32-F, OZ2-N14")
    gemm.add_argument("--size", type=int, default=256, help="m = n = k")
    gemm.add_argument("--dist", choices=DISTRIBUTIONS, default="uniform")
    gemm.add_argument("--profile", default="a100")
    gemm.add_argument("--seed", type=int, default=0)
    gemm.set_defaults(func=_gemm)

    app = sub.add_parser("app", help="run an application with one emulated type")
    app.add_argument("name")
    app.add_argument("--type", required=True)
    app.add_argument("--size", default="small", choices=("tiny", "small"))
    app.add_argument("--profile", default="a100")
    app.set_defaults(func=_app)

    select = sub.add_parser("select", help="choose the cheapest type that meets a requirement")
    select.add_argument("name")
    select.add_argument("--requirement", type=float, default=None)
    select.add_argument("--size", default="small", choices=("tiny", "small"))
    select.add_argument("--profile", default="a100")
    select.set_defaults(func=_select)

    types = sub.add_parser("types", help="list the emulated types")
    types.set_defaults(func=_types)


def make_operands(dist: str, size: int, dtype, rng):
    """Test matrices: uniform [-1, 1], standard normal, wide range (exponents 2^-20..2^20,
    some beyond fp16), or cancelling (a large common offset with small differences)."""
    import numpy as np

    shape = (size, size)
    if dist == "uniform":
        A, B = rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape)
    elif dist == "normal":
        A, B = rng.standard_normal(shape), rng.standard_normal(shape)
    elif dist == "wide":
        A = rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-20, 21, shape)
        B = rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-20, 21, shape)
    elif dist == "cancel":
        A = 1e3 + rng.standard_normal(shape)
        B = rng.standard_normal(shape) * np.where(rng.random(shape) < 0.5, 1.0, -1.0)
    else:
        raise ValueError(f"unknown distribution {dist!r}; choose from {DISTRIBUTIONS}")
    return A.astype(dtype), B.astype(dtype)


def _fail(exc: Exception) -> int:
    print(f"furnace emulate: {exc}", file=sys.stderr)
    return 2


def _gemm(args: argparse.Namespace) -> int:
    import numpy as np

    from furnace.runtime.presets import get_dsa_profile

    from .dsa import DSA
    from .naive import bits_correct, gemm_reference, normwise_error
    from .types import get_type

    try:
        etype = get_type(args.type)
        profile = get_dsa_profile(args.profile)
        if args.size < 1:
            raise ValueError(f"--size must be >= 1, got {args.size}")
    except (KeyError, ValueError) as exc:
        return _fail(exc)
    dtype = np.float64 if etype.family == "fp64" else np.float32
    A, B = make_operands(args.dist, args.size, dtype, np.random.default_rng(args.seed))
    dsa = DSA(profile)
    t0 = time.perf_counter()
    try:
        C = etype.gemm(A, B, dsa)
    except ValueError as exc:
        return _fail(exc)
    cpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    native = A @ B
    cpu_native = time.perf_counter() - t0
    ref = gemm_reference(A.astype(np.float64), B.astype(np.float64))
    err = normwise_error(C, ref)
    native_err = normwise_error(native, ref)
    flops = 2 * args.size**3
    modelled = dsa.modelled_seconds(profile)
    base = profile.native_gemm_flops.get("fp64" if etype.family == "fp64" else "fp32")
    print(f"{etype.name} ({etype.description}) on {args.size}^3 {args.dist} data")
    print(f"  normwise error {err:.3g} ({bits_correct(err):.1f} bits); native "
          f"{np.dtype(dtype).name} GEMM {native_err:.3g}")
    for op, tally in sorted(dsa.counters.ops.items()):
        print(f"  native {op}: {tally.calls} calls, {tally.flops / 1e6:.4g} MFLOP")
    if base:
        from .selector import GemmSite, modelled_gemm_seconds

        matrix_only = modelled_gemm_seconds(
            etype, [GemmSite(args.size, args.size, args.size, "", 0.0, 0.0)], profile)
        which = "fp64" if dtype == np.float64 else "fp32"
        print(f"  modelled on {profile.name} ({profile.label}): matrix unit alone "
              f"{flops / base / matrix_only:.2f}x native {which}; with the counted split/merge "
              f"work and memory traffic {modelled * 1e6:.4g} us, {flops / base / modelled:.2f}x "
              "(splitting is O(n^2): it pays off only for large GEMMs)")
    print(f"  CPU time (this machine has no narrow units): emulated {cpu * 1e3:.1f} ms, "
          f"native {cpu_native * 1e3:.2f} ms")
    return 0


def _app(args: argparse.Namespace) -> int:
    from furnace.runtime.presets import get_dsa_profile

    from .apps import get_app
    from .dsa import DSA
    from .selector import type_matmul
    from .types import get_type

    try:
        app = get_app(args.name, args.size)
        etype = get_type(args.type)
        profile = get_dsa_profile(args.profile)
    except (KeyError, ValueError) as exc:
        return _fail(exc)
    import numpy as np

    inputs = app.make_inputs(np.random.default_rng(0))
    dsa = DSA(profile)
    t0 = time.perf_counter()
    try:
        result = app.run(inputs, type_matmul(etype, dsa))
    except ValueError as exc:
        return _fail(exc)
    cpu = time.perf_counter() - t0
    metric = app.metric(inputs, result)
    verdict = "meets" if metric <= app.requirement else "MISSES"
    print(f"{app.name} with {etype.name}: {app.metric_name} {metric:.3g} {verdict} the "
          f"requirement {app.requirement:g}")
    print(f"  native matrix-unit calls {dsa.counters.calls}, modelled "
          f"{dsa.modelled_seconds(profile) * 1e3:.4g} ms on {profile.name}; CPU {cpu:.2f} s")
    return 0


def _select(args: argparse.Namespace) -> int:
    from .apps import get_app
    from .selector import NoTypeMeetsRequirement, select_type

    try:
        app = get_app(args.name, args.size)
        choice = select_type(app, requirement=args.requirement, profile=args.profile)
    except NoTypeMeetsRequirement as exc:
        print(exc.choice.explain())
        return 1
    except (KeyError, ValueError) as exc:
        return _fail(exc)
    print(choice.explain())
    return 0


def _types(args: argparse.Namespace) -> int:
    from .types import TYPES

    for name, etype in TYPES.items():
        print(f"{name:<10} {etype.family:<6} {etype.native_gemms:>2} x {etype.native:<6} "
              f"bound(k=512) {etype.error_bound(512):.2g}  {etype.description}")
    return 0
