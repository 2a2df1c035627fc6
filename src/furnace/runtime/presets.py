"""Hardware presets: the machines the systems' papers ran on, and this CPU as measured.

Each preset cites where its figures come from. Figures that no source we hold gives
(usually latencies, and the Sunway injection bandwidth) are marked "assumed" in the
preset's ``source`` and are parameters of the factory, so an experiment can sweep them.

The ``*_dsa`` profiles at the end are peak rates of accelerators for the emulated-types
time model (`furnace.emulation.dsa`, after Ape, ICS '22), labelled datasheet, invented or
measured.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .timing import time_call
from .topology import Device, Link, Topology

if TYPE_CHECKING:
    from .calibrate import CalibrationCache

GB = 1e9
TFLOPS = 1e12


def v100_50gbps(*, gpus_per_node: int = 4) -> Topology:
    """FasterMoE's testbed: V100 GPUs, 50 Gb/s network, PCIe inside a node.

    P = 11.5 TFLOP/s fp32 GEMM and beta = 50 Gb/s = 6.25 GB/s per worker are the defaults
    of the FasterMoE artifact (`fmoe/fastermoe/shadow_policy.py`, design note
    `moe_bagualu.md` A.4, A.7); PCIe 88 Gb/s = 11 GB/s is the prototype's ``bw_pcie``;
    4 GPUs per node as in the prototype. Latencies are assumed.
    """
    return Topology(
        name="v100-50gbps",
        device=Device(
            name="NVIDIA V100 (FasterMoE artifact constants)",
            # fp64 and fp16 tensor-core peaks from NVIDIA's V100 SXM2 datasheet
            peak_flops={"float32": 11.5 * TFLOPS, "float64": 7.8 * TFLOPS, "float16": 125 * TFLOPS},
            memory_bytes=32 * 2**30,
            memory_bandwidth_Bps=900 * GB,
        ),
        ranks_per_node=gpus_per_node,
        intra_node=Link(name="PCIe (88 Gb/s)", latency_s=5e-6, bandwidth_Bps=11 * GB),
        inter_node=Link(name="50 Gb/s network", latency_s=10e-6, bandwidth_Bps=6.25 * GB),
        source="FasterMoE artifact defaults (PPoPP'22); latencies 5/10 us assumed",
    )


def _hopper(name: str, memory_gib: float, memory_bw: float, gpus_per_node: int) -> Topology:
    return Topology(
        name=name,
        device=Device(
            name=f"NVIDIA {name.split('-')[0].upper()} SXM",
            # dense tensor-core peaks (no sparsity), NVIDIA H100 SXM datasheet; H200 has the same
            peak_flops={
                "float64": 67 * TFLOPS,
                "float32": 67 * TFLOPS,
                "tf32": 495 * TFLOPS,
                "bfloat16": 989 * TFLOPS,
                "float16": 989 * TFLOPS,
                "int8": 1979 * TFLOPS,
            },
            memory_bytes=memory_gib * 2**30,
            memory_bandwidth_Bps=memory_bw,
        ),
        ranks_per_node=gpus_per_node,
        # NVLink 4: 900 GB/s bidirectional per GPU, i.e. 450 GB/s each way
        intra_node=Link(name="NVLink 4", latency_s=2e-6, bandwidth_Bps=450 * GB),
        # one 400 Gb/s NDR InfiniBand NIC per GPU (UltraAttn's testbed, context_parallel.md)
        inter_node=Link(name="NDR InfiniBand 400 Gb/s", latency_s=5e-6, bandwidth_Bps=50 * GB),
        source="NVIDIA H100/H200 datasheets; 8 GPUs + 8x400 Gb/s NICs per node; "
        "latencies assumed",
    )


def h100_ib(*, gpus_per_node: int = 8) -> Topology:
    """An 8x H100-80GB node class with one 400 Gb/s InfiniBand NIC per GPU."""
    return _hopper("h100-ib", 80, 3.35e12, gpus_per_node)


def h200_ib(*, gpus_per_node: int = 8) -> Topology:
    """An 8x H200-141GB node class with one 400 Gb/s InfiniBand NIC per GPU."""
    return _hopper("h200-ib", 141, 4.8e12, gpus_per_node)


def sunway_oceanlight(
    *,
    ranks_per_node: int = 6,
    injection_bandwidth_Bps: float = 25 * GB,
    nodes_per_supernode: int = 256,
) -> Topology:
    """The new-generation Sunway machine BaGuaLu trained on (PPoPP'22).

    Per node: one SW26010-Pro with 6 core groups (CGs), 14.03 TFLOP/s fp64/fp32 and
    55.30 TFLOP/s fp16/bf16, 6 x 16 GB DDR4 at 6 x 51.2 GB/s; supernodes of 256 nodes
    on a non-blocking fat tree, joined by a 16:3 oversubscribed second level (design
    note `moe_bagualu.md` B.2, from the paper via secondary pages). By default a rank is
    one CG, so the node's figures are divided by 6. The per-node injection bandwidth is
    not published: 25 GB/s is an assumption and a parameter; the CGs of a node share it.
    """
    if ranks_per_node not in (1, 6):
        raise ValueError("a Sunway rank is a whole node (1) or one core group (6)")
    share = 1.0 / ranks_per_node
    return Topology(
        name="sunway-oceanlight",
        device=Device(
            name="SW26010-Pro " + ("node" if ranks_per_node == 1 else "core group"),
            peak_flops={
                "float64": 14.03 * TFLOPS * share,
                "float32": 14.03 * TFLOPS * share,
                "float16": 55.30 * TFLOPS * share,
                "bfloat16": 55.30 * TFLOPS * share,
            },
            memory_bytes=96 * GB * share,
            memory_bandwidth_Bps=307.2 * GB * share,
        ),
        ranks_per_node=ranks_per_node,
        intra_node=Link(name="on-chip (shared DDR4)", latency_s=1e-6, bandwidth_Bps=51.2 * GB),
        inter_node=Link(
            name="supernode fat tree",
            latency_s=2e-6,
            bandwidth_Bps=injection_bandwidth_Bps * share,
        ),
        nodes_per_group=nodes_per_supernode,
        oversubscription=16 / 3,
        group_label="supernode",
        source="BaGuaLu (PPoPP'22) via design note B.2; injection bandwidth "
        f"{injection_bandwidth_Bps / GB:g} GB/s/node and latencies assumed",
    )


def cascade_lake_cluster(*, ranks_per_node: int = 56) -> Topology:
    """The SC19 Student Cluster Competition cluster: 2 x 28-core Cascade Lake per node.

    56 MPI ranks per node, one core each (design note `eigensolver.md`). The core is
    taken as a Xeon Platinum 8280 (28 cores, 2.7 GHz, two AVX-512 FMA units: 32 fp64
    FLOP/cycle), and memory as 6 DDR4-2933 channels per socket (281.6 GB/s a node,
    shared by its ranks). The fabric is assumed to be EDR InfiniBand (100 Gb/s per node).
    """
    ghz = 2.7e9
    return Topology(
        name="cascade-lake-cluster",
        device=Device(
            name="Xeon Platinum 8280 core (assumed part)",
            peak_flops={"float64": 32 * ghz, "float32": 64 * ghz},
            memory_bytes=192 * 2**30 / ranks_per_node,
            memory_bandwidth_Bps=281.6 * GB / ranks_per_node,
        ),
        ranks_per_node=ranks_per_node,
        intra_node=Link(name="shared memory", latency_s=0.5e-6, bandwidth_Bps=10 * GB),
        inter_node=Link(
            name="EDR InfiniBand (assumed)",
            latency_s=1.5e-6,
            bandwidth_Bps=12.5 * GB / ranks_per_node,
        ),
        source="SC19 SCC reproducibility report setup (design note eigensolver.md); "
        "CPU part, memory channels and fabric assumed",
    )


def stampede2_skx(
    *,
    ranks_per_node: int = 48,
    node_bandwidth_Bps: float = 12.5 * GB,
    latency_s: float = 2e-6,
) -> Topology:
    """A Stampede2 SKX node class, as the SC'18 NormalModes runs used it (48 ranks a node).

    Shi, Li, Xi, Saad, de Hoop (SC'18) ran 192-1536 MPI processes at 48 per node, one per
    core of the two 24-core Xeon Platinum 8160 (2.1 GHz nominal, two AVX-512 FMA units:
    32 fp64 FLOP/cycle) of a Stampede2 SKX node, with 192 GB of DDR4 on 6 DDR4-2666
    channels per socket (256 GB/s a node); the fabric is 100 Gb/s Omni-Path (12.5 GB/s a
    node, shared by its ranks, so ``inter_node`` is one rank's share). The per-message
    latency is an assumption; so is pricing a rank's traffic to a rank of its own node at
    the node link, an upper bound (the eigensolver projection charges every halo byte
    to the link). Used by `furnace.eigen.costmodel.ClusterAssumptions`.
    """
    ghz = 2.1e9
    node_link = Link(
        name="Omni-Path 100 Gb/s, one rank's share",
        latency_s=latency_s,
        bandwidth_Bps=node_bandwidth_Bps / ranks_per_node,
    )
    return Topology(
        name="stampede2-skx",
        device=Device(
            name="Xeon Platinum 8160 core (Stampede2 SKX)",
            peak_flops={"float64": 32 * ghz, "float32": 64 * ghz},
            memory_bytes=192 * GB / ranks_per_node,
            memory_bandwidth_Bps=256 * GB / ranks_per_node,
        ),
        ranks_per_node=ranks_per_node,
        intra_node=node_link,
        inter_node=node_link,
        source="Stampede2 user guide (SKX nodes: 2 x Xeon Platinum 8160, 192 GB, 100 Gb/s "
        "Omni-Path) and Shi et al. SC'18 (48 ranks a node); latency "
        f"{latency_s * 1e6:g} us assumed, intra-node traffic priced at the node link",
    )


def this_cpu(*, calibration: dict[str, Any] | None = None,
             cache: CalibrationCache | None = None) -> Topology:
    """This machine as measured by ``furnace info --calibrate`` (one rank per core).

    ``calibration`` is a record to use as given; otherwise it is read from ``cache``
    (default `CalibrationCache.default()`, ~/.cache/furnace/calibration.json;
    `CalibrationCache.disabled()` reads none). Without a saved calibration it measures
    the compute figures now (about a second) and takes the loopback link as unmeasured
    (1 GB/s, 50 us, marked as such).
    """
    from .calibrate import CalibrationCache, load_or_measure

    if calibration is None:
        if cache is None:
            cache = CalibrationCache.default()
        calibration = load_or_measure(cache, quick=True)
    cal = calibration
    link = cal.get("loopback")
    if link:
        loopback = Link(
            name="gloo loopback (measured)",
            latency_s=link["latency_s"],
            bandwidth_Bps=link["bandwidth_Bps"],
        )
    else:
        loopback = Link(name="gloo loopback (not measured)", latency_s=50e-6, bandwidth_Bps=GB)
    return Topology(
        name="this-cpu",
        device=Device(
            name=f"{cal['cpu_name']} (one thread)",
            peak_flops=dict(cal["matmul_flops_per_thread"]),
            memory_bytes=cal["memory_bytes"] / max(os.cpu_count() or 1, 1),
            memory_bandwidth_Bps=cal["memory_bandwidth_Bps"],
        ),
        ranks_per_node=max(os.cpu_count() or 1, 1),
        intra_node=loopback,
        inter_node=loopback,
        source=f"measured by furnace calibrate on {cal.get('date', 'an unknown date')}",
    )


def emulated_link(
    *,
    bandwidth_Bps: float,
    latency_s: float = 0.0,
    ranks_per_node: int = 1,
    intra_bandwidth_Bps: float | None = None,
    intra_latency_s: float | None = None,
    device: Device | None = None,
    name: str = "emulated-link",
) -> Topology:
    """A machine with one slow link class, for emulator tests and experiments.

    Every rank is its own node unless ``ranks_per_node`` says otherwise, so all traffic
    crosses the given link. With ``intra_bandwidth_Bps`` (and ``intra_latency_s``,
    default ``latency_s``), ranks of one node talk over that link instead: a two-level
    machine whose inter-node link is ``bandwidth_Bps``. The device defaults to a nominal
    10 GFLOP/s core, which only the virtual clock reads.
    """
    link = Link(name=f"emulated {bandwidth_Bps / 1e6:g} MB/s", latency_s=latency_s,
                bandwidth_Bps=bandwidth_Bps)
    intra = link
    if intra_bandwidth_Bps is not None:
        intra = Link(name=f"emulated {intra_bandwidth_Bps / 1e6:g} MB/s in the node",
                     latency_s=latency_s if intra_latency_s is None else intra_latency_s,
                     bandwidth_Bps=intra_bandwidth_Bps)
    return Topology(
        name=name,
        device=device
        or Device(
            name="nominal core",
            peak_flops={"float32": 10e9, "float64": 5e9, "bfloat16": 10e9},
            memory_bytes=2**30,
            memory_bandwidth_Bps=10 * GB,
        ),
        ranks_per_node=ranks_per_node,
        intra_node=intra,
        inter_node=link,
        source="a synthetic link for emulation",
    )


# Fixed cost of one exchange step of FasterMoE's smart schedule on a GPU cluster, beyond
# the link's alpha: launching and synchronising one collective. ASSUMED, not measured: an
# NCCL-scale figure (tens of microseconds per collective launch) that no source we hold
# gives for the V100 testbed; the MoE simulator's projections (`furnace.moe.simulate`) use
# it so that pipelines of many tiny steps lose. Emulated runs measure their own instead
# (`furnace.moe.bench._measure_step_overhead`).
GPU_EXCHANGE_STEP_OVERHEAD_S = 20e-6


PRESETS: dict[str, Callable[..., Topology]] = {
    "v100-50gbps": v100_50gbps,
    "h100-ib": h100_ib,
    "h200-ib": h200_ib,
    "sunway-oceanlight": sunway_oceanlight,
    "cascade-lake-cluster": cascade_lake_cluster,
    "this-cpu": this_cpu,
}


def get_preset(name: str, **overrides: Any) -> Topology:
    """A preset by name; keyword arguments go to its factory."""
    try:
        factory = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown topology preset {name!r}; known: {sorted(PRESETS)}") from None
    return factory(**overrides)


# --- DSA throughput profiles for the emulated-types model (furnace.emulation.dsa) ---------


@dataclass(frozen=True)
class DSAProfile:
    """Peak rates of one accelerator, for the op-count time model of emulated types.

    ``matrix_peak_ops`` maps each format the matrix unit accepts ("bf16", "fp16", "tf32",
    "int8") to its dense peak in ops/s (2 per multiply-add); a format that is absent is not
    native and `furnace.emulation.dsa.DSA` refuses it. ``vector_fp32_flops`` is the FP32
    vector (CUDA-core) rate, ``native_gemm_flops`` the rates of native "fp32"/"fp64" GEMM,
    against which an emulated GEMM is compared. ``None`` marks a figure no source we hold
    gives; the time model refuses to use it rather than guess. Ape's design note
    (`emulated_types.md` sections 6.1 and 7) lists the figures.
    """

    name: str
    device: str
    matrix_peak_ops: dict[str, float]
    vector_fp32_flops: float | None
    native_gemm_flops: dict[str, float]
    memory_bandwidth_Bps: float | None
    label: str
    source: str

    @property
    def matrix_formats(self) -> frozenset[str]:
        return frozenset(self.matrix_peak_ops)


def a100_dsa() -> DSAProfile:
    """NVIDIA A100 SXM: fp16/bf16 312, tf32 156, int8 624 TOPS; fp32 19.5, fp64 TC 19.5."""
    return DSAProfile(
        name="a100",
        device="NVIDIA A100 SXM",
        matrix_peak_ops={
            "fp16": 312 * TFLOPS,
            "bf16": 312 * TFLOPS,
            "tf32": 156 * TFLOPS,
            "int8": 624 * TFLOPS,
        },
        vector_fp32_flops=19.5 * TFLOPS,
        # fp64 GEMM runs on the fp64 tensor cores (19.5); fp64 vector is 9.7
        native_gemm_flops={"fp32": 19.5 * TFLOPS, "fp64": 19.5 * TFLOPS},
        memory_bandwidth_Bps=2.0e12,
        label="datasheet peak",
        source="NVIDIA A100 datasheet, dense (no sparsity), via emulated_types.md 6.1 and 7; "
        "HBM2e 2.0 TB/s (80 GB part)",
    )


def _hopper_dsa(name: str, memory_bw: float) -> DSAProfile:
    return DSAProfile(
        name=name,
        device=f"NVIDIA {name.upper()} SXM",
        matrix_peak_ops={
            "fp16": 989 * TFLOPS,
            "bf16": 989 * TFLOPS,
            "tf32": 495 * TFLOPS,
            "int8": 1979 * TFLOPS,
        },
        vector_fp32_flops=67 * TFLOPS,
        native_gemm_flops={"fp32": 67 * TFLOPS, "fp64": 67 * TFLOPS},
        memory_bandwidth_Bps=memory_bw,
        label="datasheet peak",
        source="NVIDIA H100/H200 SXM datasheets, dense (no sparsity), via emulated_types.md "
        "6.1, 6.10 and 7; H200 has H100's compute and faster HBM3e",
    )


def h100_dsa() -> DSAProfile:
    """NVIDIA H100 SXM: bf16/fp16 989, tf32 495, int8 1979 TOPS; fp32 and fp64 TC 67; 3.35 TB/s."""
    return _hopper_dsa("h100", 3.35e12)


def h200_dsa() -> DSAProfile:
    """NVIDIA H200 SXM: H100's compute with 4.8 TB/s of HBM3e."""
    return _hopper_dsa("h200", 4.8e12)


def ascend910_dsa(
    *,
    vector_fp32_flops: float | None = None,
    memory_bandwidth_Bps: float | None = None,
) -> DSAProfile:
    """Huawei Ascend 910 cube unit: fp16 256 TFLOP/s, int8 512 TOPS; no bf16, no tf32.

    The design note (section 7) gives no FP32 vector rate and no memory bandwidth, so both
    are left out (None) unless the caller supplies them, and the source then says they are
    assumed. Without them the time model refuses vector ops and memory traffic.
    """
    assumed = [
        what
        for what, value in (("fp32 vector", vector_fp32_flops), ("bandwidth", memory_bandwidth_Bps))
        if value is not None
    ]
    return DSAProfile(
        name="ascend910",
        device="Huawei Ascend 910",
        matrix_peak_ops={"fp16": 256 * TFLOPS, "int8": 512 * TFLOPS},
        vector_fp32_flops=vector_fp32_flops,
        native_gemm_flops={},
        memory_bandwidth_Bps=memory_bandwidth_Bps,
        label="datasheet peak",
        source="Ascend 910 cube peaks via emulated_types.md 6.1 and 7; no fp32 vector or "
        "bandwidth figure published there"
        + (f"; {' and '.join(assumed)} assumed by the caller" if assumed else ""),
    )


def toy_dsa() -> DSAProfile:
    """A made-up accelerator with round numbers, for tests and worked examples."""
    return DSAProfile(
        name="toy",
        device="toy DSA (invented)",
        matrix_peak_ops={"fp16": 128 * TFLOPS, "bf16": 128 * TFLOPS, "int8": 256 * TFLOPS},
        vector_fp32_flops=8 * TFLOPS,
        native_gemm_flops={"fp32": 8 * TFLOPS},
        memory_bandwidth_Bps=1.6e12,
        label="invented",
        source="invented numbers (emulated_types.md 6.1 toy_dsa); describes no real chip",
    )


def _best_rate(fn: Callable[[], object], ops: float, budget_s: float) -> float:
    # best of as many calls as fit in budget_s, after one warm-up call
    best = time_call(fn, repeats=1, warmup=1, min_time_s=budget_s).min
    return ops / max(best, 1e-9)


@functools.lru_cache(maxsize=1)
def _measure_this_cpu() -> tuple[float, float, float, float]:
    rng = np.random.default_rng(0)
    n = 384
    a32 = rng.standard_normal((n, n)).astype(np.float32)
    a64 = a32.astype(np.float64)
    sgemm = _best_rate(lambda: a32 @ a32, 2.0 * n**3, 0.25)
    dgemm = _best_rate(lambda: a64 @ a64, 2.0 * n**3, 0.25)
    v = rng.standard_normal(1 << 22).astype(np.float32)
    out = np.empty_like(v)
    vector = _best_rate(lambda: np.add(v, v, out=out), float(v.size), 0.1)
    # add reads two operands and writes one: 12 bytes per element through memory
    bandwidth = vector * 12.0
    return sgemm, dgemm, vector, bandwidth


def this_cpu_dsa() -> DSAProfile:
    """This CPU, measured now with numpy (under a second, cached for the process only).

    A CPU has no fast low-precision matrix unit: the model runs every narrow format as a
    float32 GEMM, so all matrix formats get the measured sgemm rate. That makes emulation
    look as slow here as it is here; the vendor profiles show what a DSA would gain.
    """
    sgemm, dgemm, vector, bandwidth = _measure_this_cpu()
    return DSAProfile(
        name="this-cpu",
        device="this CPU (numpy BLAS, all threads)",
        matrix_peak_ops={fmt: sgemm for fmt in ("fp16", "bf16", "tf32", "int8")},
        vector_fp32_flops=vector,
        native_gemm_flops={"fp32": sgemm, "fp64": dgemm},
        memory_bandwidth_Bps=bandwidth,
        label="measured",
        source="measured with numpy: 384^3 sgemm/dgemm best-of, float32 add on 4M elements "
        "(bandwidth = 12 B per added element); narrow formats run as sgemm",
    )


DSA_PROFILES: dict[str, Callable[..., DSAProfile]] = {
    "a100": a100_dsa,
    "h100": h100_dsa,
    "h200": h200_dsa,
    "ascend910": ascend910_dsa,
    "toy": toy_dsa,
    "this-cpu": this_cpu_dsa,
}


def get_dsa_profile(name: str, **overrides: Any) -> DSAProfile:
    """A DSA throughput profile by name; keyword arguments go to its factory."""
    try:
        factory = DSA_PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown DSA profile {name!r}; known: {sorted(DSA_PROFILES)}") from None
    return factory(**overrides)
