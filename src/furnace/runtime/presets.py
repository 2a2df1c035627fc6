"""Hardware presets: the machines the systems' papers ran on, and this CPU as measured.

Each preset cites where its figures come from. Figures that no source we hold gives
(usually latencies, and the Sunway injection bandwidth) are marked "assumed" in the
preset's ``source`` and are parameters of the factory, so an experiment can sweep them.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .topology import Device, Link, Topology

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


def this_cpu(*, calibration: dict | None = None) -> Topology:
    """This machine as measured by ``furnace info --calibrate`` (one rank per core).

    Without a saved calibration it measures the compute figures now (about a second)
    and takes the loopback link as unmeasured (1 GB/s, 50 us, marked as such).
    """
    from .calibrate import load_or_measure

    cal = calibration if calibration is not None else load_or_measure(quick=True)
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
    device: Device | None = None,
    name: str = "emulated-link",
) -> Topology:
    """A flat machine with one slow link class, for emulator tests and experiments.

    Every rank is its own node unless ``ranks_per_node`` says otherwise, so all traffic
    crosses the given link. The device defaults to a nominal 10 GFLOP/s core, which
    only the virtual clock reads.
    """
    link = Link(name=f"emulated {bandwidth_Bps / 1e6:g} MB/s", latency_s=latency_s,
                bandwidth_Bps=bandwidth_Bps)
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
        intra_node=link,
        inter_node=link,
        source="a synthetic link for emulation",
    )


PRESETS: dict[str, Callable[..., Topology]] = {
    "v100-50gbps": v100_50gbps,
    "h100-ib": h100_ib,
    "h200-ib": h200_ib,
    "sunway-oceanlight": sunway_oceanlight,
    "cascade-lake-cluster": cascade_lake_cluster,
    "this-cpu": this_cpu,
}


def get_preset(name: str, **overrides) -> Topology:
    """A preset by name; keyword arguments go to its factory."""
    try:
        factory = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown topology preset {name!r}; known: {sorted(PRESETS)}") from None
    return factory(**overrides)
