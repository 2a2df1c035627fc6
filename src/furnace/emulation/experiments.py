"""`furnace reproduce emulation`: Ape's accuracy ladder, modelled speedups and selector.

- ``ladder``: normwise error of every emulated type against an exact reference over four
  input distributions (uniform, normal, wide range, cancelling), next to native FP32 GEMM
  (Ape section "error analysis"; design note emulated_types.md 5 and 6.7).
- ``ozaki1_slices``: Ozaki scheme I's maximum elementwise relative error against exact
  entries as the slice count s grows, with the levels summed error-free (now) and plainly in
  float64 (before; the issue's 7e-13 floor), next to native DGEMM.
- ``speedup``: native-operation counts per emulated GEMM and the modelled speedup over
  native FP32/FP64 on each DSA profile (datasheet peaks), next to Ape's 3.12x GEMM figure.
- ``cpu_time``: wall time of each emulated GEMM on this CPU against NumPy sgemm/dgemm,
  labelled CPU time (no narrow units here, so emulation is slower).
- ``selector``: the type the selector chooses per application, its metric, the search
  runs and the modelled time, next to Ape's 1.78x application figure.
- ``mlp_curve``: an unchanged PyTorch MLP trained natively and through emulated matmuls
  (`torch_mode`), loss curves side by side.
"""

from __future__ import annotations

import numpy as np

from furnace.runtime.cost import serial_compute_time
from furnace.runtime.reproduce import Claim, Experiment, Result, RunContext, Table
from furnace.runtime.timing import time_call

APE = "Ma et al., ICS '22 (abstract; github.com/JohndeVostok/APE README)"
LADDER_TYPES = ("BF16", "TF32", "FP16", "BF16x2", "FP32-F", "FP32-T", "FP32-B", "FP32-B9",
                "OZ1-S8", "OZ2-N12", "OZ2-N16")
PROFILES = ("a100", "h100", "h200", "ascend910", "toy")


def _reference(A, B, family: str):
    from .naive import exact_gemm_entries, gemm_reference, sample_entries

    if family != "fp64":
        return gemm_reference(A.astype(np.float64), B.astype(np.float64)), None
    rows, cols = sample_entries(A.shape[0], B.shape[1], 256, np.random.default_rng(1))
    exact = exact_gemm_entries(A, B, rows, cols)
    return (rows, cols), np.array([float(e) for e in exact])


def _error(C, ref, family: str) -> float:
    from .naive import normwise_error

    full, sampled = ref
    if sampled is None:
        return normwise_error(C, full)
    rows, cols = full
    return normwise_error(C[rows, cols], sampled)


def ladder(ctx: RunContext) -> Result:
    from .dsa import DSA
    from .operands import DISTRIBUTIONS, make_operands
    from .types import get_type

    n = 128 if ctx.quick else 512
    rows, errors = [], {}
    for dist in DISTRIBUTIONS:
        ctx.progress(f"{dist} data, n={n}")
        rng = np.random.default_rng(0)
        A64, B64 = make_operands(dist, n, np.float64, rng)
        A32, B32 = A64.astype(np.float32), B64.astype(np.float32)
        ref32 = _reference(A32, B32, "fp32")
        ref64 = _reference(A64, B64, "fp64")
        native32 = _error(A32 @ B32, ref32, "fp32")
        native64 = _error(A64 @ B64, ref64, "fp64")
        row = [dist, native32, native64]
        for name in LADDER_TYPES:
            etype = get_type(name)
            fp64 = etype.family == "fp64"
            A, B = (A64, B64) if fp64 else (A32, B32)
            if not etype.fits_range(A, B):
                row.append("out of range")
                continue
            C = etype.gemm(A, B, DSA("a100"))
            err = _error(C, ref64 if fp64 else ref32, etype.family)
            errors[dist, name] = err
            row.append(err)
        errors[dist, "native fp32"] = native32
        rows.append(row)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    names = ["native fp32", *LADDER_TYPES]
    for offset, dist in enumerate(DISTRIBUTIONS):
        xs = [i + 0.18 * (offset - 1.5) for i, t in enumerate(names) if (dist, t) in errors]
        ys = [errors[dist, t] for t in names if (dist, t) in errors]
        ax.semilogy(xs, ys, "o", label=dist)
    ax.axhline(errors["uniform", "native fp32"], color="0.6", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set(ylabel="normwise relative error", title=f"Emulated GEMM accuracy, n = {n} "
           "(missing: out of range)")
    ax.legend(fontsize=8)
    figure = ctx.save_figure(fig, "emulation_ladder")
    b_ok = all(errors[d, "FP32-B"] <= errors[d, "native fp32"] for d in DISTRIBUTIONS
               if (d, "FP32-B") in errors)
    oz = errors.get(("normal", "OZ2-N16"), float("nan"))
    return Result(
        tables=[Table(title=f"Accuracy ladder: normwise relative error, {n}x{n}x{n} GEMM",
                      columns=["data", "native fp32", "native fp64", *LADDER_TYPES],
                      rows=rows, kind="measured",
                      note="fp32-class types against a float64 GEMM of the float32 inputs; "
                      "fp64-class (OZ*) against exact rational dot products on 256 sampled "
                      "entries (fractions). 'out of range': the type's range check refuses "
                      "the data (Ape's selector would not use it). Native matrix-unit "
                      "products run on the DSA model with FP32 accumulation.")],
        figures=[figure],
        claims=[Claim(what="FP32-B (3 bf16 pieces, 6 products) vs native FP32 GEMM, every "
                      "distribution", paper="at least as accurate (issue target; Ape: 'no "
                      "loss')", ours="yes" if b_ok else "no", kind="measured", holds=b_ok,
                      source=APE),
                Claim(what=f"OZ2-N16 normwise error, normal {n}x{n} float64",
                      paper="<= 1e-15 on well-scaled 512x512 (issue target)",
                      ours=f"{oz:.2g}", kind="measured",
                      holds=bool(oz <= 1e-15) if n >= 512 else None)],
        data={f"{d}:{t}": v for (d, t), v in errors.items()})


OZIMMU = ("Ootomo, Ozaki, Yokota, 'DGEMM on integer matrix multiplication unit', IJHPCA "
          "2024 (ozIMMU_EF; figure as quoted in the project issue)")


def ozaki1_slices(ctx: RunContext) -> Result:
    """Max elementwise error of Ozaki I vs s on standard normal data, exact reference."""
    from .dsa import DSA
    from .naive import (
        elementwise_relative_error,
        exact_gemm_entries,
        exact_pairs,
        gemm_floor,
        normwise_error,
        sample_entries,
    )
    from .types import ozaki1

    n = 128 if ctx.quick else 512
    count = 1024 if ctx.quick else 2048
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    rows, cols = sample_entries(n, n, count, np.random.default_rng(1))
    # the entries with the smallest |C| (by float64 GEMM) are where an elementwise relative
    # error is hardest to keep; their exact values come from Python ints like the rest
    small = np.argsort(np.abs(A @ B), axis=None)[:count]
    rows, cols = np.concatenate([rows, small // n]), np.concatenate([cols, small % n])
    ctx.progress(f"exact reference, {rows.size} entries of {n}^3")
    exact = exact_pairs(exact_gemm_entries(A, B, rows, cols))
    floor = gemm_floor(A, B)
    native = elementwise_relative_error(A @ B, A, B, rows, cols, exact)
    table, errors = [], {}
    for s in range(6, 15):
        ctx.progress(f"s = {s}")
        row: list[float] = [s, s * (s + 1) // 2]
        for compensated in (True, False):
            C = ozaki1(s, compensated=compensated).gemm(A, B, DSA("a100"))
            elem = elementwise_relative_error(C, A, B, rows, cols, exact)
            errors[s, compensated] = elem
            row.append(elem)
            if compensated:
                row.append(normwise_error(C[rows, cols], exact[0], scale=floor))
        table.append(row)
    falls = all(errors[s + 1, True] <= errors[s, True] * 1.01 for s in range(6, 14))
    e12 = errors[12, True]
    return Result(
        tables=[Table(title=f"Ozaki scheme I on standard normal {n}x{n}x{n} float64: error vs "
                      "slices s", columns=["s", "int8 GEMMs", "max elementwise, error-free sum",
                                           "normwise, error-free sum",
                                           "max elementwise, plain float64 sum (before)"],
                      rows=table, kind="measured",
                      note=f"Elementwise: max |C - C*| / max(|C*|, u64 (|A||B|)) over "
                      f"{count} random entries and the {count} smallest |C|, against exact "
                      "rational values (Python ints). beta = 7-bit slices, pairs i + j <= "
                      f"s + 1. Native float64 GEMM (numpy) on the same entries: {native:.3g}.")],
        claims=[Claim(what=f"OZ1-S12 max elementwise relative error, normal {n}^3",
                      paper="4e-16 at s = 12 (ozIMMU_EF)", ours=f"{e12:.2g}",
                      kind="measured", source=OZIMMU,
                      holds=bool(e12 <= 1e-15) if n >= 512 else None),
                Claim(what="Ozaki I elementwise error falls with s (s = 6..14)",
                      paper="keeps falling (issue target)", ours="yes" if falls else "no",
                      kind="measured", holds=falls)],
        data={f"s{s}:{'ef' if c else 'plain'}": v for (s, c), v in errors.items()})


def speedup(ctx: RunContext) -> Result:
    from furnace.runtime.presets import get_dsa_profile

    from .dsa import DSA
    from .types import get_type

    probe = 64
    n = 8192  # the modelled size: compute-bound on every profile
    rows, best = [], {}
    for name in LADDER_TYPES + ("INT16",):
        etype = get_type(name)
        dtype = {"fp64": np.float64, "int16": np.int64}.get(etype.family, np.float32)
        A = np.ones((probe, probe), dtype=dtype)
        dsa = DSA("a100")
        etype.gemm(A, A, dsa)
        # counts scale as n^3 for the products; per-element splitting scales as n^2 and is
        # left out of the projection to n = 8192 (it is below 1 % there)
        matrix_flops = {unit: f for unit, f in dsa.counters.flops_by_unit.items()
                        if unit.startswith("matrix:")}
        scale = (n / probe) ** 3
        row = [name, etype.native_gemms, etype.native]
        for pname in PROFILES:
            prof = get_dsa_profile(pname)
            try:
                seconds = sum(f * scale / prof.matrix_peak_ops[u.split(":")[1]]
                              for u, f in matrix_flops.items())
            except KeyError:
                row.append("not native")
                continue
            base = prof.native_gemm_flops.get("fp64" if etype.family == "fp64" else "fp32")
            ratio = 2 * n**3 / base / seconds if base and seconds > 0 else float("nan")
            row.append(ratio)
            best[name, pname] = ratio
        rows.append(row)
    fp32f = best.get(("FP32-F", "a100"), float("nan"))
    return Result(
        tables=[Table(title=f"Modelled speedup of an emulated {n}^3 GEMM over the native "
                      "FP32 (FP64 for OZ*) GEMM of each profile",
                      columns=["type", "native GEMMs", "native unit", *PROFILES], rows=rows,
                      kind="analytic",
                      note="Native matrix-unit FLOPs counted on the DSA model (a 64^3 run, "
                      "scaled by n^3) divided by datasheet peaks; the baseline is the "
                      "profile's native FP32 / FP64 GEMM peak. Splitting and merging "
                      "(O(n^2)) and memory traffic are left out: an upper bound, as Ape's "
                      "README's 5.3x is. 'toy' has invented numbers.")],
        claims=[Claim(what="FP32-F GEMM over CUDA-core FP32, A100 (modelled peak ratio)",
                      paper="3.12x measured; 5.3x theoretical (Ape)", ours=f"{fp32f:.2f}x",
                      kind="analytic", source=APE)],
        data={f"{t}:{p}": v for (t, p), v in best.items()})


def cpu_time(ctx: RunContext) -> Result:
    from .dsa import DSA
    from .types import get_type

    n = 256 if ctx.quick else 512
    rng = np.random.default_rng(0)
    A64, B64 = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    A32, B32 = A64.astype(np.float32), B64.astype(np.float32)

    def timed(fn, repeats=3):
        return time_call(fn, repeats=repeats, warmup=0).min

    sgemm = timed(lambda: A32 @ B32)
    dgemm = timed(lambda: A64 @ B64)
    rows = [["native sgemm", sgemm * 1e3, 1.0], ["native dgemm", dgemm * 1e3, dgemm / sgemm]]
    for name in LADDER_TYPES:
        etype = get_type(name)
        A, B = (A64, B64) if etype.family == "fp64" else (A32, B32)
        seconds = timed(lambda e=etype, a=A, b=B: e.gemm(a, b, DSA("a100")), repeats=1)
        rows.append([name, seconds * 1e3, seconds / sgemm])
    return Result(tables=[Table(title=f"CPU time of a {n}^3 GEMM on this machine (CPU time, "
                                "not a DSA)", columns=["implementation", "ms", "x sgemm"],
                                rows=rows, kind="measured",
                                note="Best of 3 (native) or 1 (emulated) runs. The CPU has no "
                                "bf16/fp16/int8 matrix unit, so every native op of the model "
                                "runs as float32 BLAS plus splitting in NumPy: emulation is "
                                "expected to be slower here.")])


def selector(ctx: RunContext) -> Result:
    from furnace.runtime.presets import get_dsa_profile

    from .apps import APPS, get_app
    from .selector import NoTypeMeetsRequirement, modelled_gemm_seconds, select_type
    from .types import get_type

    size = "tiny" if ctx.quick else "small"
    profile = get_dsa_profile("a100")
    rows, ratios, misses = [], [], 0
    for name in APPS:
        ctx.progress(f"{name} ({size})")
        app = get_app(name, size)
        try:
            choice = select_type(app, profile=profile)
        except NoTypeMeetsRequirement as exc:
            choice = exc.choice
        flops = sum(2 * s.m * s.n * s.k for s in choice.sites)
        fp64 = any(s.dtype == "float64" for s in choice.sites)
        base = serial_compute_time([(flops, profile.native_gemm_flops["fp64" if fp64 else "fp32"])])
        ratio = float("nan")
        if choice.type_name is None:
            misses += 1
        else:
            ratio = base / modelled_gemm_seconds(get_type(choice.type_name), choice.sites,
                                                 profile)
            ratios.append(ratio)
        rows.append([name, app.metric_name, app.requirement, choice.type_name or "none",
                     choice.metric, choice.runs,
                     ", ".join(f"{t.type_name}: {t.status}" for t in choice.trials),
                     ratio, choice.modelled_seconds])
    return Result(
        tables=[Table(title="Selector: cheapest type meeting each application's requirement "
                      "(A100 profile)", columns=["application", "metric", "requirement",
                                                 "chosen", "metric reached", "runs",
                                                 "candidates", "modelled GEMM speedup",
                                                 "modelled s, all counted ops"],
                      rows=rows, kind="measured",
                      note="Metric and runs measured here. 'Modelled GEMM speedup': the "
                      "native FP32 (FP64 where the application passes float64 operands) GEMM "
                      "time of the traced GEMMs over the chosen type's matrix-unit time, A100 "
                      "datasheet peaks (analytic; like the speedup table it leaves out "
                      "splitting, merging and memory traffic, and the application's non-GEMM "
                      "work). 'All counted ops' adds the split/merge vector work and bytes the "
                      "DSA model counted, which dominate at these small sizes.")],
        claims=[Claim(what="applications whose requirement no type met", paper="0",
                      ours=str(misses), kind="measured", holds=misses == 0),
                Claim(what="modelled GEMM-only speedup of the chosen types, A100 (mean over "
                      "applications)",
                      paper="1.78x max, 1.65x mean, whole applications, measured (Ape)",
                      ours=f"{np.mean(ratios):.2f}x" if ratios else "-", kind="analytic",
                      source=APE)],
        data={"rows": rows})


def mlp_curve(ctx: RunContext) -> Result:
    """An unchanged PyTorch MLP trained natively and inside `emulated_matmul` per type."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from .dsa import DSA
    from .torch_mode import emulated_matmul

    steps = 60 if ctx.quick else 200
    torch.manual_seed(0)
    x = torch.randn(512, 32)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 4))
    with torch.no_grad():
        y = teacher(x) + 0.05 * torch.randn(512, 4)

    def train(type_name):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses, dsa = [], DSA("a100")
        for _ in range(steps):
            opt.zero_grad()
            if type_name is None:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            else:
                with emulated_matmul(type_name, dsa):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, dsa

    curves, rows = {}, []
    native, _ = train(None)
    curves["native fp32"] = native
    for name in ("BF16", "FP16", "FP32-F"):
        ctx.progress(f"training with {name}")
        losses, dsa = train(name)
        curves[name] = losses
        rows.append([name, losses[-1], abs(losses[-1] / native[-1] - 1),
                     dsa.counters.calls])
    rows.insert(0, ["native fp32", native[-1], 0.0, 0])
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, losses in curves.items():
        ax.semilogy(losses, label=name, lw=1.2)
    ax.set(xlabel="SGD step", ylabel="training loss (MSE)",
           title="MLP trained through emulated matmuls (PyTorch)")
    ax.legend()
    worst = max(r[2] for r in rows)
    return Result(
        tables=[Table(title=f"MLP training, {steps} steps: final loss per matmul type",
                      columns=["matmul", "final loss", "relative difference from fp32",
                               "native DSA calls"], rows=rows, kind="measured",
                      note="torch.nn MLP 32-64-4, unchanged; every matmul forward and "
                      "backward runs inside furnace.emulation.emulated_matmul on the A100 "
                      "model.")],
        figures=[ctx.save_figure(fig, "emulation_mlp_loss")],
        claims=[Claim(what="largest final-loss difference from native fp32 (BF16, FP16, "
                      "FP32-F)", paper="precision is not always needed (Ape's premise)",
                      ours=f"{100 * worst:.3f}%", kind="measured")],
        data={"curves": curves})


EXPERIMENTS = [
    Experiment("emulation", "ladder", "Accuracy ladder of the emulated types", ladder),
    Experiment("emulation", "ozaki1_slices", "Ozaki I elementwise error vs slices",
               ozaki1_slices),
    Experiment("emulation", "speedup", "Modelled speedup on DSA profiles", speedup),
    Experiment("emulation", "cpu_time", "CPU time of emulated GEMMs (CPU, not DSA)", cpu_time),
    Experiment("emulation", "selector", "Selector choices per application", selector),
    Experiment("emulation", "mlp_curve", "PyTorch MLP trained through emulated matmuls",
               mlp_curve),
]
