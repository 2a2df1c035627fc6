"""The eigensolver's scaling metrics and its alpha-beta cost model (design note
``eigensolver.md`` section 5.4, "Scaling on 1-2 cores and the model beyond").

The metrics are those of the Tsinghua SC19 team's scripts (design note section 2):
strong-scaling efficiency T(p0) p0 / (T(p) p), weak-scaling efficiency t0 / t, and the
"unified time" T / (filter degree x filtered matvecs).

The cost model (`ScalingModel`) is the design note's

    T(p) = N_K [c_K nnz_A / p + x(p)] + N_M [c_K nnz_M / p + x(p)]
           + N_dot alpha_ar log2(p) + c_R F_R / p,       x(p) = o + alpha m(p) + beta h(p),

with h(p) = 3 (n/p)^(2/3) 8 bytes of halo per matvec, m(p) halo messages and o a fixed cost
per exchange. Every communication term is priced by `furnace.runtime.cost` (`link_time`
for the halo messages and for the latency-bound allreduce levels, `log_levels` for their
log2(p)). c_K and c_R are fitted from 1-rank runs (`ScalingModel.fit_compute`), alpha and
beta from an exchange microbenchmark (`ScalingModel.fit_link`). For a cluster nothing here
can measure, `calibrate_to_anchor` sets the per-core SpMV rate at one measured point and
takes the network from a `furnace.runtime.presets` topology (`ClusterAssumptions`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from furnace.runtime.cost import link_time, log_levels
from furnace.runtime.presets import stampede2_skx

if TYPE_CHECKING:
    from furnace.runtime.topology import Link, Topology

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
class _ModelLink:
    """The model's (alpha, seconds per byte) as a `furnace.runtime.cost.LinkLike`; a
    fitted beta of 0 (bandwidth not resolved by the microbenchmark) is an infinitely fast
    link rather than a division by zero."""

    latency_s: float
    seconds_per_byte: float

    @property
    def bandwidth_Bps(self) -> float:
        return math.inf if self.seconds_per_byte == 0 else 1.0 / self.seconds_per_byte


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

    @property
    def halo_link(self) -> _ModelLink:
        """The link the halo messages take: alpha per message, beta per byte."""
        return _ModelLink(latency_s=self.alpha, seconds_per_byte=self.beta)

    @property
    def allreduce_link(self) -> _ModelLink:
        """One level of a one-value allreduce: alpha_ar, its 8 bytes neglected."""
        return _ModelLink(latency_s=self.alpha_ar, seconds_per_byte=0.0)

    def halo_bytes(self, n: float, p: int) -> float:
        """Bytes one rank sends per matvec."""
        return 0.0 if p <= 1 else self.halo_coeff * (n / p) ** (2.0 / 3.0) * 8.0

    def messages(self, p: int) -> int:
        return 0 if p <= 1 else min(p - 1, self.max_neighbours)

    def exchange_seconds(self, n: float, p: int) -> float:
        """One halo exchange x(p) = overhead + alpha m(p) + beta h(p) (0 on one rank)."""
        if p <= 1:
            return 0.0
        return self.overhead + link_time(self.halo_link, self.halo_bytes(n, p),
                                         self.messages(p))

    def allreduce_seconds(self, allreduces: float, p: int) -> float:
        """``allreduces`` latency-bound allreduces on p ranks: alpha_ar per log2(p) level."""
        return link_time(self.allreduce_link, 0.0, allreduces * log_levels(p))

    def communication_seconds(self, p: int, *, halo_bytes: float, halo_messages: float,
                              allreduces: float) -> float:
        """The MPI terms of measured totals (one rank's, whole solve): halo messages and
        bytes over `halo_link`, allreduces over `allreduce_link`; no per-exchange overhead."""
        return (link_time(self.halo_link, halo_bytes, halo_messages)
                + self.allreduce_seconds(allreduces, p))

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
                t += (self.overhead * work.exchanging_matvecs
                      + link_time(self.halo_link, halo_bytes, halo_messages))
            dots = work.allreduces if allreduces is None else allreduces
            t += self.allreduce_seconds(dots, p)
        return t

    def strong_efficiency(self, work: Workload, processes: Iterable[int],
                          p_ref: int | None = None) -> np.ndarray:
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


# ---------------------------------------------------------------------------------------
# Projection to a cluster
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterAssumptions:
    """The cluster of a projection: its network, and what the model assumes of the halo.

    topology: the hardware (`furnace.runtime.presets.stampede2_skx` by default: the SC'18
        layout of 48 ranks a node sharing a 100 Gb/s Omni-Path link, 2 us per message, an
        assumption). Its ``inter_node`` link is one rank's share of the node's link, and
        every halo byte is charged to it, an upper bound on the halo cost since neighbours
        on the same node use shared memory; an allreduce level costs one message latency.
    max_neighbours, halo_coeff: halo partners per rank and h(p)'s coefficient (assumed).
    spmv_bytes_per_nonzero, reorth_bytes_per_flop: the SpMV rate is not assumed: it is
        calibrated at one measured anchor (`calibrate_to_anchor`); reorthogonalisation
        (BLAS-2, 4 bytes per flop) is priced at the anchor's bandwidth (CSR: 12 bytes per
        nonzero, 8 value + 4 index).
    """

    topology: Topology = field(default_factory=stampede2_skx)
    max_neighbours: int = 12
    halo_coeff: float = 3.0
    spmv_bytes_per_nonzero: float = 12.0
    reorth_bytes_per_flop: float = 4.0

    @property
    def rank_link(self) -> Link:
        """One rank's share of the node's link."""
        return self.topology.inter_node

    @property
    def ranks_per_node(self) -> int:
        return self.topology.ranks_per_node

    @property
    def node_bandwidth_Bps(self) -> float:
        return self.rank_link.bandwidth_Bps * self.ranks_per_node

    @property
    def message_latency_s(self) -> float:
        return self.rank_link.latency_s

    @property
    def allreduce_latency_s(self) -> float:
        return self.rank_link.latency_s

    def with_network(self, *, latency_s: float | None = None,
                     bandwidth_factor: float = 1.0) -> ClusterAssumptions:
        """The same assumptions on a network with another latency or a scaled bandwidth."""
        link = self.rank_link
        link = dataclasses.replace(
            link, latency_s=link.latency_s if latency_s is None else latency_s,
            bandwidth_Bps=link.bandwidth_Bps * bandwidth_factor)
        topology = dataclasses.replace(self.topology, inter_node=link)
        return dataclasses.replace(self, topology=topology)


def calibrate_to_anchor(work: Workload, p_anchor: int, a_matvec_s: float,
                        cluster: ClusterAssumptions | None = None) -> ScalingModel:
    """A model whose A-matvec time on ``p_anchor`` ranks equals ``a_matvec_s`` (one anchor),
    with the network of ``cluster`` (default `ClusterAssumptions()`)."""
    cluster = ClusterAssumptions() if cluster is None else cluster
    probe = ScalingModel(c_K=0.0, c_R=0.0, alpha=cluster.message_latency_s,
                         beta=1.0 / cluster.rank_link.bandwidth_Bps,
                         alpha_ar=cluster.allreduce_latency_s, halo_coeff=cluster.halo_coeff,
                         max_neighbours=cluster.max_neighbours)
    halo = probe.exchange_seconds(work.n, p_anchor)
    if halo >= a_matvec_s:
        raise ValueError(f"the assumed halo exchange ({halo * 1e3:.3g} ms) already exceeds "
                         f"the anchor A-matvec time ({a_matvec_s * 1e3:.3g} ms)")
    c_K = (a_matvec_s - halo) * p_anchor / work.nnz_a
    c_R = c_K * cluster.reorth_bytes_per_flop / cluster.spmv_bytes_per_nonzero
    return dataclasses.replace(probe, c_K=c_K, c_R=c_R)
