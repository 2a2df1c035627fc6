"""Strong and weak scaling of the MPI eigensolver on 1-2 ranks, the SC19 "unified time"
metric, and a fitted cost model projected to the SC'18 Stampede2 runs.

Follows design note ``eigensolver.md`` section 5.4 ("Scaling on 1-2 cores and the model
beyond"). The metrics are those of the Tsinghua SC19 team's scripts (design note section 2):
strong-scaling efficiency T(p0) p0 / (T(p) p), weak-scaling efficiency t0 / t, and the
"unified time" T / (filter degree x filtered matvecs). The reference data are the SC'18
strong-scaling runs of Shi, Li, Xi, Saad and de Hoop ("Computing planetary interior normal
modes with a highly parallel polynomial filtering eigensolver", SC'18, pp. 894-906) as
transcribed in ``thu-scc/SC19-NormalModes`` ``plot_result.py`` (design note section 1.4).

The cost model (`ScalingModel`) is the design note's

    T(p) = N_K [c_K nnz_A / p + x(p)] + N_M [c_K nnz_M / p + x(p)]
           + N_dot alpha_ar log2(p) + c_R F_R / p,       x(p) = o + alpha m(p) + beta h(p),

with h(p) = 3 (n/p)^(2/3) 8 bytes of halo per matvec, m(p) halo messages and o a fixed cost
per exchange. On this machine c_K and c_R are fitted from 1-rank runs, alpha, beta, alpha_ar
from an mpi4py exchange and allreduce microbenchmark on 2 ranks, and o (this Python code's
packing and bookkeeping) from the 2-rank row-partitioned runs. For Stampede2-class nodes
nothing here can be measured, so the per-core SpMV rate is calibrated at one anchor (SC'18's
192-process C3 A-matvec time) and the network constants are explicit, documented
assumptions (`ClusterAssumptions`).

Experiments (``fn(ctx) -> Result``): `strong_weak` measures, `sc18_model` fits and projects.
The measured runs solve the Q1 box pencil of `furnace.eigen.experiments` (`box_pencil`),
whose eigenvalues are known in closed form, so every run's answer is checked exactly.
The microbenchmark runs as ``mpiexec -n 2 python -m furnace.eigen.scaling link-benchmark
OUT.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from furnace.runtime.reproduce import Result, RunContext

# ---------------------------------------------------------------------------------------
# Metrics (THU SC19 plot_result.py definitions)
# ---------------------------------------------------------------------------------------


def unified_time(total_seconds, filter_degree, filtered_matvecs):
    """THU's unified time ``tot_time / deg / it``: seconds per polynomial-filter step.

    ``it`` is the number of filter applications p(A) v (filtered matvecs), so the result is
    roughly the cost of one A-matvec (plus one mass solve), flat under ideal weak scaling.
    """
    deg = np.asarray(filter_degree, dtype=float)
    its = np.asarray(filtered_matvecs, dtype=float)
    if np.any(deg <= 0) or np.any(its <= 0):
        raise ValueError("filter degree and filtered matvecs must be positive")
    out = np.asarray(total_seconds, dtype=float) / deg / its
    return float(out) if out.ndim == 0 else out


def speedup(t_ref, t):
    """T(p0) / T(p)."""
    out = np.asarray(t_ref, dtype=float) / np.asarray(t, dtype=float)
    return float(out) if out.ndim == 0 else out


def strong_efficiency(p_ref, t_ref, p, t):
    """Strong-scaling efficiency T(p0) p0 / (T(p) p) (SC18 and THU scripts)."""
    out = (np.asarray(t_ref, dtype=float) * np.asarray(p_ref, dtype=float)
           / (np.asarray(t, dtype=float) * np.asarray(p, dtype=float)))
    return float(out) if out.ndim == 0 else out


def weak_efficiency(t_ref, t):
    """Weak-scaling efficiency t0 / t at fixed work per rank (THU ``calc_eff``)."""
    return speedup(t_ref, t)


# ---------------------------------------------------------------------------------------
# SC'18 data (cited)
# ---------------------------------------------------------------------------------------

SC18_SOURCE = ("Shi, Li, Xi, Saad, de Hoop, SC'18 (Stampede2 SKX, 48 ranks/node), as "
               "transcribed in thu-scc/SC19-NormalModes plot_result.py")
# the per-A-matvec times are in the design note's transcription (eigensolver.md 1.4) but
# not in the copy of plot_result.py we could read, so they carry their own source
SC18_MATVEC_SOURCE = "Shi et al. SC'18 via design note eigensolver.md section 1.4"


@dataclass(frozen=True)
class StrongSeries:
    """One SC'18 strong-scaling series. ``efficiency`` is as transcribed (rounded);
    ``degree`` and ``filtered_matvecs`` come from the fixed-interval series entry of the
    same problem, whose total time equals this series' 384-process time."""

    name: str
    dofs: int
    processes: tuple[int, ...]
    seconds: tuple[float, ...]
    efficiency: tuple[float, ...]
    a_matvec_ms: tuple[float, ...]
    degree: int
    filtered_matvecs: int
    ranks_per_node: int = 48
    source: str = SC18_SOURCE


@dataclass(frozen=True)
class FixedIntervalSeries:
    """SC'18 "fixed interval" runs: one frequency band, growing mesh (plot_result.py)."""

    name: str
    dofs: tuple[int, ...]
    degree: tuple[int, ...]
    filtered_matvecs: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str = SC18_SOURCE


SC18_C3 = StrongSeries(
    name="C3 constant ball", dofs=3_894_783, processes=(192, 384, 768, 1536),
    seconds=(6854.54, 3247.78, 1779.14, 1259.08), efficiency=(1.0, 1.1, 0.96, 0.68),
    a_matvec_ms=(3.40, 1.74, 0.69, 0.36), degree=364, filtered_matvecs=672)
SC18_E3 = StrongSeries(
    name="E3 Earth", dofs=4_466_349, processes=(192, 384, 768),
    seconds=(34319.28, 16570.22, 10071.56), efficiency=(1.0, 1.0, 0.85),
    a_matvec_ms=(7.92, 4.90, 3.78), degree=1430, filtered_matvecs=652)
SC18_FIXED_CONST = FixedIntervalSeries(
    name="constant ball",
    dofs=(1038084, 2060190, 3894783, 7954392, 15809076, 31138518, 61381362, 120336519),
    degree=(271, 365, 364, 649, 869, 1062, 1330, 1566),
    filtered_matvecs=(652, 672, 672, 672, 672, 672, 672, 672),
    seconds=(2143.87, 3318.60, 3247.78, 6224.22, 7731.83, 9287.05, 11104.54, 13914.11))
SC18_FIXED_EARTH = FixedIntervalSeries(
    name="Earth",
    dofs=(1086702, 2265129, 4466349, 9037671, 17579616, 34115040, 66028227),
    degree=(585, 933, 1430, 1957, 2863, 3711, 4922),
    filtered_matvecs=(612, 632, 652, 652, 652, 652, 652),
    seconds=(5369.784, 10083.951, 16570.223, 24614.738, 37793.401, 44962.119, 63054.411))


def amdahl_fit(p1: float, t1: float, p2: float, t2: float) -> tuple[float, float]:
    """(serial seconds S, parallel work W) of T(p) = S + W / p through two points."""
    work = (t1 - t2) / (1.0 / p1 - 1.0 / p2)
    return t1 - work / p1, work


# ---------------------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What one solve does, in the counters of `furnace.eigen.operators.Counters`.

    nnz_m is n for a lumped (diagonal) mass, whose applications exchange no halo.
    """

    n: int
    nnz_a: float
    nnz_m: float
    a_matvecs: float
    m_matvecs: float
    allreduces: float = 0.0
    reorth_flops: float = 0.0
    filter_degree: int = 0
    filtered_matvecs: int = 0

    @classmethod
    def from_counters(cls, n: int, nnz_a: float, nnz_m: float, counters: dict) -> Workload:
        return cls(n=n, nnz_a=nnz_a, nnz_m=nnz_m, a_matvecs=counters["a_matvecs"],
                   m_matvecs=counters["m_matvecs"], allreduces=counters.get("allreduces", 0),
                   reorth_flops=counters["reorth_flops"],
                   filter_degree=counters["filter_degree"],
                   filtered_matvecs=counters["filtered_matvecs"])

    @property
    def exchanging_matvecs(self) -> float:
        """Matvecs that need a halo exchange (a diagonal mass needs none)."""
        return self.a_matvecs + (self.m_matvecs if self.nnz_m > self.n else 0.0)

    @property
    def matvec_nonzeros(self) -> float:
        """Stored nonzeros streamed by all matvecs of the solve."""
        return self.a_matvecs * self.nnz_a + self.m_matvecs * self.nnz_m


@dataclass(frozen=True)
class ScalingModel:
    """Time of a row-partitioned solve on p ranks (design note 5.4).

    c_K: seconds per stored nonzero per matvec on one rank (vector work of the filter
        recurrence folded in); c_R: seconds per reorthogonalisation flop; alpha: seconds
        per halo message; beta: seconds per halo byte; alpha_ar: seconds per allreduce and
        per log2(p) level; halo_coeff: h(p) = halo_coeff (n/p)^(2/3) 8 bytes per matvec;
        max_neighbours: cap on the halo messages per matvec, min(p - 1, max_neighbours);
        overhead: seconds per halo exchange on top of alpha per message (an implementation's
        packing and bookkeeping; 0 for the projection, fitted for this Python code).
    """

    c_K: float
    c_R: float
    alpha: float
    beta: float
    alpha_ar: float
    halo_coeff: float = 3.0
    max_neighbours: int = 12
    overhead: float = 0.0

    def halo_bytes(self, n: float, p: int) -> float:
        """Bytes one rank sends per matvec."""
        return 0.0 if p <= 1 else self.halo_coeff * (n / p) ** (2.0 / 3.0) * 8.0

    def messages(self, p: int) -> int:
        return 0 if p <= 1 else min(p - 1, self.max_neighbours)

    def exchange_seconds(self, n: float, p: int) -> float:
        """One halo exchange x(p) = overhead + alpha m(p) + beta h(p) (0 on one rank)."""
        if p <= 1:
            return 0.0
        return self.overhead + self.alpha * self.messages(p) + self.beta * self.halo_bytes(n, p)

    def a_matvec_seconds(self, work: Workload, p: int) -> float:
        """One A-matvec including its halo exchange."""
        return self.c_K * work.nnz_a / p + self.exchange_seconds(work.n, p)

    def seconds(self, work: Workload, p: int, *, halo_bytes: float | None = None,
                halo_messages: float | None = None, allreduces: float | None = None) -> float:
        """Model time of ``work`` on p ranks.

        halo_bytes, halo_messages, allreduces: one rank's measured totals for the whole solve;
        when given they replace the h(p), m(p) formulas and the workload's dot count.
        """
        t = self.c_K * work.matvec_nonzeros / p + self.c_R * work.reorth_flops / p
        if p > 1:
            if halo_bytes is None or halo_messages is None:
                t += work.exchanging_matvecs * self.exchange_seconds(work.n, p)
            else:
                t += (self.overhead * work.exchanging_matvecs + self.alpha * halo_messages
                      + self.beta * halo_bytes)
            dots = work.allreduces if allreduces is None else allreduces
            t += dots * self.alpha_ar * math.log2(p)
        return t

    def strong_efficiency(self, work: Workload, processes, p_ref: int | None = None) -> np.ndarray:
        """T(p0) p0 / (T(p) p) over ``processes`` (p0 = the first unless given)."""
        procs = [int(p) for p in processes]
        p0 = procs[0] if p_ref is None else int(p_ref)
        t0 = self.seconds(work, p0)
        return np.array([strong_efficiency(p0, t0, p, self.seconds(work, p)) for p in procs])

    def parallel_efficiency(self, work: Workload, p: int) -> float:
        """T(1) / (p T(p)): the fraction of p ranks' time that is useful work."""
        return self.seconds(work, 1) / (p * self.seconds(work, p))

    @staticmethod
    def fit_compute(works: list[Workload], seconds: list[float]) -> tuple[float, float]:
        """(c_K, c_R) >= 0 by least squares on 1-rank runs: T = c_K sum(nnz) + c_R F_R."""
        from scipy.optimize import nnls

        if not works:
            raise ValueError("need at least one 1-rank run")
        design = np.array([[w.matvec_nonzeros, w.reorth_flops] for w in works], dtype=float)
        # scale the columns to order one so NNLS is not steered by units
        scale = np.where(design.max(axis=0) > 0, design.max(axis=0), 1.0)
        coef, _ = nnls(design / scale, np.asarray(seconds, dtype=float))
        c_K, c_R = coef / scale
        if c_K <= 0:
            # a single run or collinear runs: all time to the matvecs
            c_K, c_R = float(np.sum(seconds) / design[:, 0].sum()), 0.0
        return float(c_K), float(c_R)

    @staticmethod
    def fit_link(sizes_bytes, seconds) -> tuple[float, float]:
        """(alpha, beta) >= 0 of t = alpha + beta s by least squares."""
        s = np.asarray(sizes_bytes, dtype=float)
        t = np.asarray(seconds, dtype=float)
        if s.size < 2:
            raise ValueError("need at least two message sizes")
        beta, alpha = np.polyfit(s, t, 1)
        return max(float(alpha), 0.0), max(float(beta), 0.0)


@dataclass(frozen=True)
class ClusterAssumptions:
    """Network and rank layout of a Stampede2-class cluster, for the projection.

    None of these can be measured from a 2-core machine. ranks_per_node = 48 is the SC'18
    layout (192 processes on 4 nodes); node_bandwidth_Bps = 12.5 GB/s is a 100 Gb/s
    Omni-Path link (Stampede2's fabric), shared by the node's ranks; message and allreduce
    latencies and the number of halo partners per rank are assumptions. The SpMV rate is
    not here: it is calibrated at one SC'18 anchor (`calibrate_to_anchor`). Reorthogonalisation
    (BLAS-2, 4 bytes per flop) is priced at the anchor's bandwidth (CSR: 12 bytes per
    nonzero, 8 value + 4 index).
    """

    ranks_per_node: int = 48
    node_bandwidth_Bps: float = 12.5e9
    message_latency_s: float = 2e-6
    allreduce_latency_s: float = 2e-6
    max_neighbours: int = 12
    halo_coeff: float = 3.0
    spmv_bytes_per_nonzero: float = 12.0
    reorth_bytes_per_flop: float = 4.0


def calibrate_to_anchor(work: Workload, p_anchor: int, a_matvec_s: float,
                        cluster: ClusterAssumptions = ClusterAssumptions()) -> ScalingModel:
    """A model whose A-matvec time on ``p_anchor`` ranks equals ``a_matvec_s`` (one anchor).

    All halo bytes are charged to the node's link (ranks_per_node ranks share it), an upper
    bound on the halo cost since neighbours on the same node use shared memory.
    """
    probe = ScalingModel(c_K=0.0, c_R=0.0, alpha=cluster.message_latency_s,
                         beta=cluster.ranks_per_node / cluster.node_bandwidth_Bps,
                         alpha_ar=cluster.allreduce_latency_s, halo_coeff=cluster.halo_coeff,
                         max_neighbours=cluster.max_neighbours)
    halo = probe.exchange_seconds(work.n, p_anchor)
    if halo >= a_matvec_s:
        raise ValueError(f"the assumed halo exchange ({halo * 1e3:.3g} ms) already exceeds "
                         f"the anchor A-matvec time ({a_matvec_s * 1e3:.3g} ms)")
    c_K = (a_matvec_s - halo) * p_anchor / work.nnz_a
    c_R = c_K * cluster.reorth_bytes_per_flop / cluster.spmv_bytes_per_nonzero
    return dataclasses.replace(probe, c_K=c_K, c_R=c_R)


# A nonzeros per row of the SC'18 pencil, P1 vector elasticity on tetrahedra: each row
# couples the 3 components of a vertex and of its edge neighbours, 3 (1 + 2 E / V) per row
# for V vertices and E edges. 43.7 is that of our gmsh unit ball at h = 0.05 (82,863
# unknowns; checked by tests/normal_modes/test_mesh.py). The consistent mass couples only
# equal components: exactly 1/3 of A's nonzeros.
SC18_NNZ_A_PER_ROW = 43.7
SC18_NNZ_M_PER_ROW = SC18_NNZ_A_PER_ROW / 3.0


def sc18_workload(series: StrongSeries, *, nnz_a_per_row: float, nnz_m_per_row: float,
                  allreduces_per_step: float, reorth_flops_per_nk2: float,
                  mass_degree: int = 25) -> Workload:
    """The SC'18 run as a `Workload`: deg x its A-matvecs, each followed by a degree-25
    Chebyshev mass solve (NormalModes, P1), with the sparsity of a P1 vector pencil
    (`SC18_NNZ_A_PER_ROW`) and the dots per Lanczos step and reorthogonalisation constant
    of our own runs."""
    n = series.dofs
    steps = series.filtered_matvecs
    a_matvecs = float(series.degree * steps)
    return Workload(n=n, nnz_a=nnz_a_per_row * n, nnz_m=nnz_m_per_row * n,
                    a_matvecs=a_matvecs, m_matvecs=mass_degree * a_matvecs,
                    allreduces=allreduces_per_step * steps,
                    reorth_flops=reorth_flops_per_nk2 * n * steps**2,
                    filter_degree=series.degree, filtered_matvecs=steps)


# ---------------------------------------------------------------------------------------
# Running the CLI and the link microbenchmark
# ---------------------------------------------------------------------------------------


def find_mpiexec() -> str | None:
    """The venv's mpiexec (the mpich wheel puts it next to python), else one on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _solve_parser() -> argparse.ArgumentParser:
    from furnace.eigen import cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    eigen = parser._subparsers._group_actions[0].choices["eigen"]
    return eigen._subparsers._group_actions[0].choices["solve"]


def cli_modes() -> tuple[str, ...]:
    """The --mode choices that ``furnace eigen solve`` accepts (empty while it has none)."""
    for action in _solve_parser()._actions:
        if "--mode" in action.option_strings:
            return tuple(m for m in ("rows", "slices", "groups") if m in (action.choices or ()))
    return ()


def cli_options() -> set[str]:
    """The option strings ``furnace eigen solve`` accepts."""
    return {opt for action in _solve_parser()._actions for opt in action.option_strings}


def _single_thread_env() -> dict[str, str]:
    # one core per rank: BLAS threads would make 1 rank use both cores and 2 ranks fight
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


@dataclass
class RunRecord:
    """One measured CLI solve."""

    label: str
    n: int
    nnz_a: int
    nnz_m: int
    ranks: int
    mode: str
    slices: int
    seconds: float
    timed_by: str
    counters: dict
    eigenvalues: list[float]
    repeats: list[float] = field(default_factory=list)
    total_reorth_flops: float = 0.0
    count_method: str = ""
    complete: bool | None = None

    @property
    def workload(self) -> Workload:
        """The solve as a whole: rank-local reorthogonalisation flops summed over ranks."""
        work = Workload.from_counters(self.n, self.nnz_a, self.nnz_m, self.counters)
        if self.mode == "rows":
            work = dataclasses.replace(work, reorth_flops=self.total_reorth_flops)
        return work

    @property
    def unified(self) -> float:
        return unified_time(self.seconds, self.counters["filter_degree"],
                            self.counters["filtered_matvecs"])


def run_cli(mpiexec: str, ranks: int, a_path: Path, m_path: Path,
            interval: tuple[float, float], *, mode: str, slices: int, json_path: Path,
            modes: tuple[str, ...], timeout: float = 600.0) -> dict:
    """One ``mpiexec -n ranks furnace eigen solve`` run on ``interval``; returns its JSON
    with ``seconds``
    and ``timed_by`` ("solver" when the JSON has the solve's own wall time, else "process",
    the subprocess wall time including start-up and reading the matrices)."""
    # the eigen subcommand through this module's entry point (`main`): the top-level
    # `furnace` command imports the shared runtime (torch), seconds of start-up per rank
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "furnace.eigen.scaling", "eigen",
           "solve", str(a_path), "--mass", str(m_path), "--interval", repr(interval[0]),
           repr(interval[1]), "--lumped", "--json", str(json_path)]
    if ranks > 1 and mode in modes:
        cmd += ["--mode", mode]
    if mode == "slices":
        cmd += ["--slices", str(slices)]
    if "--count-check" in cli_options():
        # the same completeness check as the serial comparisons (experiments.COUNT_CHECK)
        from .experiments import COUNT_CHECK

        cmd += ["--count-check", COUNT_CHECK]
    json_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=_single_thread_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(json_path.read_text())
    if data.get("seconds") is not None:
        data["timed_by"] = "solver"
    else:
        data["seconds"], data["timed_by"] = wall, "process"
    return data


def link_benchmark(comm, sizes=(8, 1024, 8192, 65536, 262144), iterations: int = 300) -> dict:
    """Median seconds of a 2-rank ``Sendrecv`` exchange per message size and of a one-value
    ``Allreduce`` (both ranks send at once, as in a halo exchange)."""
    from mpi4py import MPI

    peer = 1 - comm.Get_rank()
    warm = 10
    exchange = {}
    for size in sizes:
        send = np.ones(max(size // 8, 1))
        recv = np.empty_like(send)
        count = iterations if size <= 65536 else max(iterations // 4, 20)
        times = []
        comm.Barrier()
        for _ in range(count + warm):
            t0 = MPI.Wtime()
            comm.Sendrecv(send, dest=peer, recvbuf=recv, source=peer)
            times.append(MPI.Wtime() - t0)
        exchange[int(send.nbytes)] = statistics.median(times[warm:])
    value, total = np.ones(1), np.empty(1)
    times = []
    comm.Barrier()
    for _ in range(iterations + warm):
        t0 = MPI.Wtime()
        comm.Allreduce(value, total)
        times.append(MPI.Wtime() - t0)
    return {"exchange_seconds": exchange, "allreduce_seconds": statistics.median(times[warm:]),
            "iterations": iterations}


def measure_link(mpiexec: str, out_dir: Path, *, iterations: int = 300) -> dict:
    """Run `link_benchmark` under ``mpiexec -n 2``; adds the fitted alpha and beta."""
    path = out_dir / "link.json"
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "furnace.eigen.scaling", "link-benchmark",
           str(path), "--iterations", str(iterations)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=_single_thread_env())
    if proc.returncode != 0:
        raise RuntimeError(f"link benchmark failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(path.read_text())
    sizes = sorted(int(s) for s in data["exchange_seconds"])
    secs = [data["exchange_seconds"][str(s)] for s in sizes]
    data["alpha"], data["beta"] = ScalingModel.fit_link(sizes, secs)
    return data


# ---------------------------------------------------------------------------------------
# Measurement plan and the strong/weak experiment
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Sizes of the box pencil (`furnace.eigen.experiments.box_pencil`) as cells per unit
    length N: strong scaling at each of ``strong`` (the slices mode only at those also in
    ``slices_at``); weak scaling compares 1 rank at ``weak_one`` with 2 ranks at
    ``weak_two`` (about twice the unknowns)."""

    strong: tuple[int, ...]
    weak_one: int
    weak_two: int
    slices_at: tuple[int, ...] = ()
    repeats: int = 1
    timeout: float = 600.0


# N = 14 / 17 give 3,952 / 7,680 unknowns; 27 / 29 / 37 give 31,616 / 39,032 / 83,952. The
# full set runs 2 slices only at 31,616: two narrower slices need filters of about twice
# the degree, so that mode does more work than one slice.
QUICK = Plan(strong=(14, 17), weak_one=14, weak_two=17, slices_at=(14, 17), repeats=1,
             timeout=180.0)
FULL = Plan(strong=(27, 37), weak_one=29, weak_two=37, slices_at=(27,), repeats=1,
            timeout=600.0)

# strong_weak leaves its runs here for sc18_model in the same process (same report run)
_LAST_RUNS: dict[bool, list[RunRecord]] = {}


def _box_pencil(cells_per_unit: int):
    """(K, lumped M, [a, b]) of the box at N = cells_per_unit: the 27 pairs above the 6
    lowest."""
    from .experiments import box_cells, box_interval, box_pencil

    cells = box_cells(cells_per_unit)
    K, M = box_pencil(cells, mass="lumped")
    return K, M, box_interval(cells)


def measure(plan: Plan, work_dir: Path, *, runs: list[tuple[int, int, str]] | None = None,
            progress=lambda text: None) -> list[RunRecord]:
    """Write the box pencils of ``plan`` as Matrix Market and run the CLI on them.

    runs: (N, ranks, mode) triples; default: every strong size on 1 rank and on 2 ranks in
    mode rows, and in mode slices (2 slices) at ``plan.slices_at``, plus 1 rank at weak_one.
    Modes the CLI lacks are skipped. Times are medians of ``plan.repeats`` runs.
    """
    import scipy.io

    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("mpiexec is not installed (pip install 'furnace[hpc]')")
    modes = cli_modes()
    if runs is None:
        runs = []
        for size in plan.strong:
            runs += [(size, 1, "serial"), (size, 2, "rows")]
            if size in plan.slices_at:
                runs.append((size, 2, "slices"))
        if plan.weak_one not in plan.strong:
            runs.append((plan.weak_one, 1, "serial"))
        if plan.weak_two not in plan.strong:
            runs.append((plan.weak_two, 2, "rows"))
            if plan.weak_two in plan.slices_at:
                runs.append((plan.weak_two, 2, "slices"))
    records = []
    pencils: dict[int, tuple[Path, Path, tuple[float, float], int, int, int]] = {}
    for size, ranks, mode in runs:
        if ranks > 1 and mode == "rows" and "rows" not in modes:
            continue
        if size not in pencils:
            progress(f"assembling N={size}")
            K, M, interval = _box_pencil(size)
            a_path, m_path = work_dir / f"K_{size}.mtx", work_dir / f"M_{size}.mtx"
            scipy.io.mmwrite(a_path, K)
            scipy.io.mmwrite(m_path, M)
            pencils[size] = (a_path, m_path, interval, K.shape[0], K.nnz, K.shape[0])
        a_path, m_path, interval, n, nnz_a, nnz_m = pencils[size]
        slices = 2 if mode == "slices" else 1
        times, data = [], None
        for rep in range(plan.repeats):
            progress(f"n={n}, {ranks} rank(s), {mode} ({rep + 1}/{plan.repeats})")
            data = run_cli(mpiexec, ranks, a_path, m_path, interval, mode=mode, slices=slices,
                           json_path=work_dir / "out.json", modes=modes, timeout=plan.timeout)
            times.append(float(data["seconds"]))
        per_rank = data.get("rank_counters") or [data["counters"]]
        # the critical path: the rank with the most A-matvecs (slices differ in degree)
        busiest = max(per_rank, key=lambda c: c["a_matvecs"])
        records.append(RunRecord(label=f"N={size}", n=n, nnz_a=nnz_a, nnz_m=nnz_m, ranks=ranks,
                                 mode=mode, slices=slices, seconds=statistics.median(times),
                                 timed_by=data["timed_by"], counters=busiest,
                                 eigenvalues=data["eigenvalues"], repeats=times,
                                 total_reorth_flops=sum(c["reorth_flops"] for c in per_rank),
                                 count_method=data.get("count_method", ""),
                                 complete=data.get("complete")))
    return records


def _max_rel_diff(a, b) -> float:
    """max |a - b| / max |b|: eigenvalues of one interval, compared as one set."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size != b.size:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _closed_form_error(record: RunRecord) -> float:
    """The run's eigenvalues against the box's closed form (`box_eigenvalues`)."""
    from .experiments import BOX_BELOW, BOX_COUNT, box_cells, box_eigenvalues

    size = int(record.label.removeprefix("N="))
    exact = box_eigenvalues(box_cells(size))[BOX_BELOW:BOX_BELOW + BOX_COUNT]
    return _max_rel_diff(record.eigenvalues, exact)


def strong_weak(ctx: RunContext) -> Result:
    """Strong scaling (1 vs 2 ranks, modes rows and slices) and weak scaling (about equal
    dofs per rank) of ``furnace eigen solve`` on the lumped box pencil, with THU's metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from furnace.runtime.reproduce import Claim, Result, Table

    plan = QUICK if ctx.quick else FULL
    with tempfile.TemporaryDirectory(prefix="furnace-scaling-") as tmp:
        records = measure(plan, Path(tmp), progress=ctx.progress)
    _LAST_RUNS[ctx.quick] = records
    timed_by = {r.timed_by for r in records}
    rows_available = any(r.mode == "rows" for r in records)

    strong_rows, strong_eff = [], {}
    for size in plan.strong:
        ref = next(r for r in records if r.label == f"N={size}" and r.ranks == 1)
        for r in (x for x in records if x.label == f"N={size}"):
            eff = strong_efficiency(ref.ranks, ref.seconds, r.ranks, r.seconds)
            strong_eff[(r.n, r.mode)] = eff
            c = r.counters
            strong_rows.append([
                r.n, r.ranks, r.mode, r.seconds, speedup(ref.seconds, r.seconds), eff,
                1e6 * r.unified, c["filter_degree"], c["filtered_matvecs"], c["a_matvecs"],
                c.get("halo_bytes", 0) / 2**20, c.get("halo_messages", 0),
                c.get("allreduces", 0), len(r.eigenvalues),
                "-" if r.complete is None else f"{r.count_method}, "
                + ("vouched" if r.complete else "NOT vouched"), _closed_form_error(r),
                _max_rel_diff(r.eigenvalues, ref.eigenvalues)])

    one = next(r for r in records if r.label == f"N={plan.weak_one}" and r.ranks == 1)
    weak_rows, weak_eff = [], {}
    for r in [one] + [x for x in records if x.label == f"N={plan.weak_two}" and x.ranks == 2]:
        eff_t = weak_efficiency(one.seconds, r.seconds)
        eff_u = weak_efficiency(one.unified, r.unified)
        weak_eff[r.mode] = (eff_t, eff_u)
        weak_rows.append([r.n // r.ranks, r.n, r.ranks, r.mode, r.seconds, eff_t,
                          1e6 * r.unified, eff_u, r.counters["filter_degree"],
                          r.counters["filtered_matvecs"]])

    timing = ("the solver's own wall time (JSON 'seconds')" if timed_by == {"solver"} else
              "process wall time including start-up and Matrix Market reading (the CLI did "
              "not report 'seconds')" if timed_by == {"process"} else
              "mixed: solver wall time where reported, else process wall time")
    common = (f"Measured on this shared 2-core machine (other jobs may run); times are "
              f"{timing}, median of {plan.repeats} run(s) each, one thread per rank. Q1 box "
              "Laplacian with lumped mass (furnace.eigen.experiments.box_pencil), the 27 "
              "eigenpairs above the 6 lowest; N = cells per unit length. Counters are those "
              "of the busiest rank (most A-matvecs). ")
    if not rows_available:
        common += "The CLI has no --mode rows yet, so only slices over ranks is measured. "
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for size in plan.strong:
        mine = [r for r in records if r.label == f"N={size}"]
        n = mine[0].n
        for mode, marker in (("rows", "o"), ("slices", "s")):
            two = [r for r in mine if r.mode == mode]
            if two:
                ref = next(r for r in mine if r.ranks == 1)
                ax1.plot([1, 2], [ref.seconds, two[0].seconds], "-" + marker,
                         label=f"n={n}, {mode}")
        ref = next(r for r in mine if r.ranks == 1)
        ax1.plot([1, 2], [ref.seconds, ref.seconds / 2], "k:", lw=0.8)
    ax1.set(xscale="log", yscale="log", xticks=[1, 2], xticklabels=["1", "2"],
            xlabel="MPI ranks", ylabel="solve time (s)",
            title="Strong scaling (measured; dotted: ideal)")
    ax1.legend(fontsize=8)
    for mode, marker in (("serial", "o"), ("rows", "^"), ("slices", "s")):
        pts = [r for r in records if r.mode == mode]
        if pts:
            ax2.plot([r.n / r.ranks for r in pts], [1e6 * r.unified for r in pts], marker,
                     label="1 rank" if mode == "serial" else f"2 ranks, {mode}")
    ax2.set(xscale="log", xlabel="dofs per rank", ylabel="unified time (us per filter step)",
            title="THU unified time T/(deg x filtered matvecs)")
    ax2.legend(fontsize=8)
    figure = ctx.save_figure(fig, "eigen_scaling_measured")

    claims = []
    for mode in ("rows", "slices"):
        sizes = [n for n, m in strong_eff if m == mode]
        if sizes:
            big = max(sizes)
            claims.append(Claim(
                what=f"strong-scaling efficiency, 1 -> 2 ranks, {mode}, n = {big}",
                paper="1.10 / 0.96 / 0.68 at 384 / 768 / 1536 processes (SC18 C3, measured)",
                ours=f"{strong_eff[(big, mode)]:.2f} (measured, shared 2-core machine)",
                kind="measured", source=SC18_SOURCE))
    for mode, (eff_t, eff_u) in weak_eff.items():
        if mode == "serial":
            continue
        claims.append(Claim(
            what=f"weak-scaling efficiency of the unified time, {mode}, 2 ranks",
            paper="1.0 under ideal weak scaling (THU SC19 metric)",
            ours=f"{eff_u:.2f} (raw time t0/t: {eff_t:.2f}; measured)", kind="measured",
            source="thu-scc/SC19-NormalModes plot_result.py"))
    worst = max((row[-1] for row in strong_rows), default=0.0)
    claims.append(Claim(what="2-rank eigenvalues equal 1-rank ones (max relative difference)",
                        paper="same eigenvalues on any number of ranks",
                        ours=f"{worst:.1e}", kind="measured", holds=bool(worst < 1e-8)))
    exact = max((row[-2] for row in strong_rows), default=0.0)
    claims.append(Claim(what="eigenvalues against the closed form (max relative error, all runs)",
                        paper="the box's exact discrete eigenvalues",
                        ours=f"{exact:.1e}", kind="measured", holds=bool(exact < 1e-10)))
    return Result(
        tables=[
            Table(title="Strong scaling on 1-2 ranks", kind="measured", rows=strong_rows,
                  columns=["n", "ranks", "mode", "time s", "speedup", "efficiency",
                           "unified us", "filter degree", "filtered matvecs", "A matvecs",
                           "halo MiB", "halo msgs", "allreduces", "eigenpairs", "count check",
                           "max rel error vs closed form", "max rel diff vs 1 rank"],
                  note=common + "Efficiency T(1)/(2 T(2)) against the 1-rank, 1-slice run; "
                  "the slices mode solves 2 slices (KPM slicing plus a sharper filter per "
                  "slice), so it does more total work than 1 slice"
                  + ("" if set(plan.slices_at) >= set(plan.strong) else
                     f"; it is run only at N = {', '.join(map(str, plan.slices_at))} in this "
                     "set, to keep the run time down") + "."),
            Table(title="Weak scaling at about equal dofs per rank", kind="measured",
                  rows=weak_rows,
                  columns=["dofs/rank", "n", "ranks", "mode", "time s", "efficiency t0/t",
                           "unified us", "unified efficiency", "filter degree",
                           "filtered matvecs"],
                  note=common + "The filter degree grows like n^(1/3), so raw time cannot "
                  "stay flat; the unified time divides that growth out (THU SC19).")],
        figures=[figure], claims=claims,
        data={"runs": [dataclasses.asdict(r) for r in records], "plan": dataclasses.asdict(plan)})


# ---------------------------------------------------------------------------------------
# The model experiment
# ---------------------------------------------------------------------------------------

# dots per Lanczos step when no row-partitioned run has counted them: alpha, beta and the
# two CGS2 passes (design note 1.2.5); an assumption
DEFAULT_ALLREDUCES_PER_STEP = 4.0
DOFS_PER_RANK_GRID = (1e5, 3e4, 1e4, 3e3, 1e3, 3e2, 1e2)


def _sensitivity(work: Workload, base: ClusterAssumptions) -> list[list[Any]]:
    rows = []
    variants = [("as assumed", {}),
                ("latency 1 us", {"message_latency_s": 1e-6, "allreduce_latency_s": 1e-6}),
                ("latency 10 us", {"message_latency_s": 10e-6, "allreduce_latency_s": 10e-6}),
                ("26 halo partners", {"max_neighbours": 26}),
                ("half the link bandwidth", {"node_bandwidth_Bps": base.node_bandwidth_Bps / 2}),
                ("halo 3x larger", {"halo_coeff": 3 * base.halo_coeff})]
    series = SC18_C3
    for name, change in variants:
        cluster = dataclasses.replace(base, **change)
        model = calibrate_to_anchor(work, series.processes[0], series.a_matvec_ms[0] * 1e-3,
                                    cluster)
        eff = model.strong_efficiency(work, series.processes)
        rows.append([name, eff[-1], 1e3 * model.a_matvec_seconds(work, series.processes[-1])])
    return rows


def sc18_model(ctx: RunContext) -> Result:
    """Fit the cost model on this machine's 1-2 rank runs and a link microbenchmark, then
    project it, calibrated at one SC'18 anchor, to the C3 strong-scaling runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    from furnace.runtime.reproduce import Claim, Result, Table

    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("mpiexec is not installed (pip install 'furnace[hpc]')")
    records = _LAST_RUNS.get(ctx.quick)
    reused = records is not None
    with tempfile.TemporaryDirectory(prefix="furnace-scaling-") as tmp:
        if records is None:
            # standalone: a small 1- and 2-rank measurement of its own
            small = (QUICK.strong[0], QUICK.strong[-1])
            runs = [(h, r, m) for h in small for r, m in ((1, "serial"), (2, "rows"))]
            records = measure(QUICK, Path(tmp), runs=runs, progress=ctx.progress)
        ctx.progress("link microbenchmark (mpiexec -n 2)")
        link = measure_link(mpiexec, Path(tmp), iterations=200 if ctx.quick else 500)

    ones = [r for r in records if r.ranks == 1]
    rows_runs = [r for r in records if r.ranks == 2 and r.mode == "rows"]
    c_K, c_R = ScalingModel.fit_compute([r.workload for r in ones], [r.seconds for r in ones])
    here = ScalingModel(c_K=c_K, c_R=c_R, alpha=link["alpha"], beta=link["beta"],
                        alpha_ar=link["allreduce_seconds"])
    # the implementation's cost per halo exchange beyond the microbenchmarked MPI terms
    # (packing, Python, two ranks sharing two cores): what the rows runs spend above
    # compute/2, per exchange. Other jobs on a shared machine only ever add time, so the
    # least-disturbed run (the minimum) is the better estimate.
    overhead = 0.0
    excess = []
    for r in rows_runs:
        c, work_r = r.counters, r.workload
        rest = (r.seconds - here.seconds(work_r, 1) / 2 - here.alpha * c["halo_messages"]
                - here.beta * c["halo_bytes"] - here.alpha_ar * c["allreduces"])
        if work_r.exchanging_matvecs > 0:
            excess.append(rest / work_r.exchanging_matvecs)
    if excess:
        overhead = max(min(excess), 0.0)
    here_eff = dataclasses.replace(here, overhead=overhead)
    if rows_runs:
        big = max(rows_runs, key=lambda r: r.n)
        per_exchange = big.counters["halo_bytes"] / max(big.counters["halo_messages"], 1)
        halo_coeff_here = per_exchange / ((big.n / 2) ** (2 / 3) * 8)
        here_eff = dataclasses.replace(here_eff, halo_coeff=halo_coeff_here)
        allreduces_per_step = big.counters["allreduces"] / big.counters["lanczos_steps"]
    else:
        halo_coeff_here = float("nan")
        allreduces_per_step = DEFAULT_ALLREDUCES_PER_STEP

    fit_rows = [
        ["c_K (ns per nonzero per matvec)", 1e9 * c_K, f"NNLS on {len(ones)} 1-rank run(s)"],
        ["c_R (ns per reorth flop)", 1e9 * c_R, "same fit"],
        ["alpha, MPI (us per message)", 1e6 * here.alpha, "Sendrecv microbenchmark, 2 ranks"],
        ["beta (ns per byte)", 1e9 * here.beta,
         f"same; {1e-9 / here.beta if here.beta > 0 else float('inf'):.3g} GB/s"],
        ["alpha_ar (us per allreduce)", 1e6 * here.alpha_ar, "Allreduce microbenchmark"],
        ["overhead (us per halo exchange)", 1e6 * overhead,
         "min over rows runs of the time beyond compute/2 and the MPI terms, per exchange"
         if excess else "no rows runs: 0"],
        ["halo coefficient (h = c (n/p)^(2/3) 8 B)", halo_coeff_here,
         "measured halo bytes per exchange (design note: 3)" if rows_runs else "no rows runs"],
        ["allreduces per Lanczos step", allreduces_per_step,
         "measured (rows run)" if rows_runs else "assumed (alpha, beta, 2 CGS2 passes)"],
    ]
    check_rows = []
    for r in [x for x in records if x.mode in ("serial", "rows")]:
        c = r.counters
        if r.ranks == 1:
            model_s = here.seconds(r.workload, 1)
        else:
            model_s = here_eff.seconds(r.workload, 2, halo_bytes=c["halo_bytes"],
                                       halo_messages=c["halo_messages"],
                                       allreduces=c["allreduces"])
        check_rows.append([r.n, r.ranks, r.mode, r.seconds, model_s, model_s / r.seconds])

    # the C3 run priced with a P1 vector pencil's sparsity; dots per step and CGS2 flops per
    # n k^2 do not depend on the matrix, so they come from our largest 1-rank run
    largest = max(ones, key=lambda r: r.n)
    nnz_a_row, nnz_m_row = SC18_NNZ_A_PER_ROW, SC18_NNZ_M_PER_ROW
    reorth_const = largest.counters["reorth_flops"] / (largest.n
                                                       * largest.counters["lanczos_steps"] ** 2)
    work = sc18_workload(SC18_C3, nnz_a_per_row=nnz_a_row, nnz_m_per_row=nnz_m_row,
                         allreduces_per_step=allreduces_per_step,
                         reorth_flops_per_nk2=reorth_const)
    cluster = ClusterAssumptions()
    series = SC18_C3
    proj = calibrate_to_anchor(work, series.processes[0], series.a_matvec_ms[0] * 1e-3, cluster)
    model_t = [proj.seconds(work, p) for p in series.processes]
    model_eff = proj.strong_efficiency(work, series.processes)
    steps = series.degree * series.filtered_matvecs
    proj_rows = []
    for i, p in enumerate(series.processes):
        proj_rows.append([
            p, series.dofs // p, series.seconds[i], series.efficiency[i],
            strong_efficiency(series.processes[0], series.seconds[0], p, series.seconds[i]),
            series.a_matvec_ms[i], 1e3 * proj.a_matvec_seconds(work, p), model_t[i],
            model_eff[i], 1e3 * series.seconds[i] / steps, 1e3 * model_t[i] / steps])
    serial_s, _ = amdahl_fit(series.processes[0], series.seconds[0], series.processes[-1],
                             series.seconds[-1])

    data_rows = []
    for s in (SC18_C3, SC18_E3):
        for i, p in enumerate(s.processes):
            data_rows.append([s.name, s.dofs, p, s.seconds[i], s.efficiency[i],
                              strong_efficiency(s.processes[0], s.seconds[0], p, s.seconds[i]),
                              s.a_matvec_ms[i],
                              1e3 * unified_time(s.seconds[i], s.degree, s.filtered_matvecs)])

    # efficiency against dofs per rank: the C3 workload on p = n / d ranks, priced with the
    # Stampede2-class projection and with this machine's constants
    grid_rows, curve_d = [], np.logspace(5, 2, 25)
    curves = {"Stampede2-class projection": proj, "this machine's constants": here_eff}
    curve_vals = {k: [m.parallel_efficiency(work, max(2, round(series.dofs / d)))
                      for d in curve_d] for k, m in curves.items()}
    for d in DOFS_PER_RANK_GRID:
        p = max(2, round(series.dofs / d))
        grid_rows.append([d, p] + [m.parallel_efficiency(work, p) for m in curves.values()])

    def crossing(model, level=0.8):
        for d in np.logspace(6, 1, 200):
            p = max(2, round(series.dofs / d))
            if model.parallel_efficiency(work, p) < level:
                return d
        return float("nan")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.5, 4))
    ax1.plot(series.processes, series.efficiency, "ko-", label="SC18 C3 (measured)")
    ax1.plot(series.processes, model_eff, "s--", label="model (1 anchor at 192)")
    ax1.set(xscale="log", ylim=(0.0, 1.3),
            xlabel="MPI processes (48 per node)", ylabel="strong-scaling efficiency",
            title=f"C3 ball, {series.dofs:,} dofs")
    ax1.xaxis.set_minor_locator(NullLocator())
    ax1.set_xticks(list(series.processes), [str(p) for p in series.processes])
    ax1.legend(fontsize=8)
    for name, vals in curve_vals.items():
        ax2.plot(curve_d, vals, "-", label=f"model: {name}")
    ax2.plot([series.dofs / p for p in series.processes], series.efficiency, "ko",
             label="SC18 C3 (measured, rel. to 192)")
    ax2.axvline(1e4, color="grey", lw=0.8, ls=":")
    ax2.set(xscale="log", ylim=(0.0, 1.2), xlabel="dofs per rank",
            ylabel="efficiency T(1) / (p T(p))", title="Model efficiency vs dofs per rank")
    ax2.invert_xaxis()
    ax2.legend(fontsize=8, loc="lower left")
    figure = ctx.save_figure(fig, "eigen_scaling_sc18_model")

    model_note = (
        "MODEL with one calibration anchor: the per-core SpMV rate is set so that the "
        "model's 192-process C3 A-matvec time equals SC18's 3.40 ms; the other process "
        "counts are predictions. Network constants are assumptions (ClusterAssumptions: "
        f"{cluster.ranks_per_node} ranks/node sharing a {cluster.node_bandwidth_Bps / 1e9:g} "
        f"GB/s link, {cluster.message_latency_s * 1e6:g} us per message, "
        f"{cluster.allreduce_latency_s * 1e6:g} us per allreduce level, at most "
        f"{cluster.max_neighbours} halo partners); nothing here is measured on Stampede2. "
        "Work per run: "
        f"degree {series.degree} x {series.filtered_matvecs} filtered matvecs (SC18 "
        "fixed-interval entry of the same size), a degree-25 consistent-mass Chebyshev solve "
        f"per A-matvec, {nnz_a_row:.1f} A and {nnz_m_row:.1f} M nonzeros per row (P1 vector "
        "elasticity, as our gmsh ball at h = 0.05), setup ignored. "
        "SC18 columns are cited (measured on Stampede2); 'recomputed' is T(192) 192 / "
        "(T(p) p) from the cited times. The model has no cache term, so it cannot show "
        "C3's super-linear 1.10, and no non-scaling part: an Amdahl fit through SC18's own "
        f"192- and 1536-process times needs {serial_s:.0f} s of serial time (computed from "
        "the cited times).")
    e1536 = float(model_eff[-1])
    claims = [
        Claim(what=f"model efficiency at 1536 processes for {series.dofs / 1e6:.1f}M dofs",
              paper="0.68 (SC18, measured)", ours=f"{e1536:.2f} (model)", kind="analytic",
              source=SC18_SOURCE),
        Claim(what="model A-matvec time at 1536 processes (C3)",
              paper="0.36 ms (SC18, measured)",
              ours=f"{1e3 * proj.a_matvec_seconds(work, 1536):.2f} ms (model, calibrated at "
              "192 processes)", kind="analytic", source=SC18_MATVEC_SOURCE),
        Claim(what="dofs per rank where model efficiency falls below 0.8",
              paper="SC18 C3: 0.68 at 2.5k dofs/rank (measured); design note 5.4 expects "
              "the drop below ~1e4",
              ours=f"{crossing(proj):.3g} (Stampede2-class model); "
              f"{crossing(here_eff):.3g} (this machine's constants; model)",
              kind="analytic", source=SC18_SOURCE),
    ]
    measured_note = ("Fitted on this shared 2-core machine"
                     + (" from strong_weak's runs in this report run" if reused else
                        " from a small 1- and 2-rank measurement made by this experiment")
                     + "; microbenchmark medians over "
                     f"{link['iterations']} iterations.")
    return Result(
        tables=[
            Table(title="Model constants fitted on this machine", kind="measured",
                  columns=["constant", "value", "from"], rows=fit_rows, note=measured_note),
            Table(title="Model against the measured runs (this machine)", kind="measured",
                  columns=["n", "ranks", "mode", "measured s", "model s", "model/measured"],
                  rows=check_rows,
                  note=measured_note + " Not an independent check: the 1-rank rows are the "
                  "c_K, c_R fit and the 2-rank rows fix the per-exchange overhead (their "
                  "minimum); 2-rank rows use the measured halo and allreduce counts."),
            Table(title="SC18 strong-scaling data (cited) and the unified time",
                  kind="analytic",
                  columns=["series", "dofs", "processes", "time s", "efficiency (transcribed)",
                           "efficiency recomputed", "A-matvec ms", "unified ms"],
                  rows=data_rows,
                  note=f"{SC18_SOURCE}; A-matvec times: {SC18_MATVEC_SOURCE}. Unified time = "
                  "T / (degree x filtered matvecs) with the degree and count of the "
                  "fixed-interval entry of the same size (C3: 364 x 672; E3: 1430 x 652)."),
            Table(title="C3 strong scaling: SC18 measured vs model projection",
                  kind="analytic", rows=proj_rows,
                  columns=["processes", "dofs/rank", "SC18 time s", "SC18 efficiency",
                           "SC18 eff. recomputed", "SC18 A-matvec ms", "model A-matvec ms",
                           "model time s", "model efficiency", "SC18 unified ms",
                           "model unified ms"],
                  note=model_note),
            Table(title="Sensitivity of the 1536-process model to the assumed network",
                  kind="analytic", columns=["assumption", "model efficiency at 1536",
                                            "model A-matvec ms at 1536"],
                  rows=_sensitivity(work, cluster),
                  note="Each variant is re-calibrated at the same 192-process anchor."),
            Table(title="Model efficiency T(1)/(p T(p)) against dofs per rank (C3 workload)",
                  kind="analytic",
                  columns=["dofs/rank", "processes", *curves.keys()], rows=grid_rows,
                  note="Model only. 'this machine's constants' prices the same workload with "
                  "the constants fitted here (SciPy SpMV, mpi4py over shared memory).")],
        figures=[figure], claims=claims,
        data={"fit": {"c_K": c_K, "c_R": c_R, "alpha": here.alpha, "beta": here.beta,
                      "alpha_ar": here.alpha_ar, "overhead": overhead,
                      "halo_coeff": halo_coeff_here,
                      "allreduces_per_step": allreduces_per_step},
              "projection": {"c_K": proj.c_K, "c_R": proj.c_R, "alpha": proj.alpha,
                             "beta": proj.beta, "efficiency": [float(e) for e in model_eff],
                             "seconds": model_t},
              "link": link, "reused_runs": reused})


def main(argv: list[str] | None = None) -> int:
    """``link-benchmark OUT.json`` (2 ranks), or ``eigen solve ...`` as in the furnace CLI."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m furnace.eigen.scaling")
    sub = parser.add_subparsers(dest="command", required=True)
    from furnace.eigen import cli

    cli.add_parser(sub)
    bench = sub.add_parser("link-benchmark", help="2-rank Sendrecv and Allreduce medians")
    bench.add_argument("out", help="JSON file written by rank 0")
    bench.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args(argv)
    if args.command == "eigen":
        return args.func(args)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        print("link-benchmark needs exactly 2 ranks (mpiexec -n 2)", file=sys.stderr)
        return 2
    result = link_benchmark(comm, iterations=args.iterations)
    if comm.Get_rank() == 0:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
