"""Topology levels and links, balance matching, and the cited presets."""

from __future__ import annotations

import pytest

from furnace.runtime.presets import PRESETS, emulated_link, get_preset, this_cpu
from furnace.runtime.topology import Device, Link, Topology, balance_matched

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


def _machine(**kw) -> Topology:
    return Topology(
        name="m",
        device=Device(name="d", peak_flops={"float32": 1e12}, memory_bytes=1,
                      memory_bandwidth_Bps=1),
        ranks_per_node=4,
        intra_node=Link(name="intra", latency_s=1e-6, bandwidth_Bps=100e9),
        inter_node=Link(name="inter", latency_s=5e-6, bandwidth_Bps=16e9),
        **kw,
    )


def test_levels_and_links():
    topo = _machine(nodes_per_group=2, oversubscription=16 / 3)
    assert topo.level(0, 0) == "self"
    assert topo.level(0, 3) == "intra_node"
    assert topo.level(0, 4) == "inter_node"  # node 1, same group
    assert topo.level(0, 8) == "inter_group"  # node 2 is in group 1
    # a 16:3 taper leaves 3/16 of the inter-node bandwidth between groups
    assert topo.link(0, 8).bandwidth_Bps == pytest.approx(16e9 * 3 / 16)
    assert topo.link(0, 8).latency_s == 5e-6
    assert topo.slowest_level([0, 1, 2]) == "intra_node"
    assert topo.slowest_level([0, 4]) == "inter_node"
    assert topo.slowest_level([0, 1, 9]) == "inter_group"
    assert topo.slowest_level([5]) is None
    with pytest.raises(ValueError, match="itself"):
        topo.link(2, 2)


def test_link_time_and_validation():
    link = Link(name="l", latency_s=1e-3, bandwidth_Bps=1e6)
    assert link.time(4000, 2) == pytest.approx(0.006)
    with pytest.raises(ValueError, match="bandwidth"):
        Link(name="bad", latency_s=0, bandwidth_Bps=0)
    with pytest.raises(ValueError, match="latency"):
        Link(name="bad", latency_s=-1, bandwidth_Bps=1)
    with pytest.raises(ValueError, match="ranks_per_node"):
        _machine().replace(ranks_per_node=0)
    with pytest.raises(ValueError, match="oversubscription"):
        _machine(oversubscription=0.5)


def test_balance_matching_preserves_flop_per_byte():
    v100 = get_preset("v100-50gbps")
    cpu = Device(name="cpu", peak_flops={"float32": 23e9}, memory_bytes=1, memory_bandwidth_Bps=1)
    emu = balance_matched(v100, cpu)
    # P / beta of the target is kept: 11.5e12 / 6.25e9 = 1840 FLOP/B (design note A.3)
    assert v100.device.flops() / v100.inter_node.bandwidth_Bps == pytest.approx(1840)
    assert cpu.flops() / emu.inter_node.bandwidth_Bps == pytest.approx(1840)
    assert emu.inter_node.bandwidth_Bps == pytest.approx(12.5e6)
    assert emu.inter_node.latency_s == pytest.approx(10e-6 * 11.5e12 / 23e9)


def test_presets_carry_the_cited_figures():
    for name in PRESETS:
        if name != "this-cpu":
            topo = get_preset(name)
            assert topo.source and topo.describe().startswith(name)
    v100 = get_preset("v100-50gbps")
    assert v100.inter_node.bandwidth_Bps == 50e9 / 8
    assert v100.device.flops("float32") == 11.5e12
    sunway = get_preset("sunway-oceanlight")
    # one rank per core group: the node's 55.30 TFLOP/s half precision over 6 CGs
    assert sunway.device.flops("bfloat16") * 6 == pytest.approx(55.30e12)
    assert sunway.nodes_per_group == 256 and sunway.oversubscription == pytest.approx(16 / 3)
    assert sunway.level(0, 6 * 256) == "inter_group"
    node = get_preset("sunway-oceanlight", ranks_per_node=1)
    assert node.device.flops("float64") == pytest.approx(14.03e12)
    h200 = get_preset("h200-ib")
    assert h200.ranks_per_node == 8 and h200.device.flops("bfloat16") == 989e12
    assert get_preset("cascade-lake-cluster").ranks_per_node == 56
    with pytest.raises(ValueError, match="unknown topology preset"):
        get_preset("tpu-v9")
    with pytest.raises(ValueError, match="core group"):
        get_preset("sunway-oceanlight", ranks_per_node=3)


def test_device_errors_name_available_dtypes():
    dev = emulated_link(bandwidth_Bps=1e6).device
    with pytest.raises(ValueError, match=r"has no peak figure for int8; it has \['bfloat16'"):
        dev.flops("int8")
    with pytest.raises(ValueError, match="peak_flops"):
        Device(name="x", peak_flops={}, memory_bytes=1, memory_bandwidth_Bps=1)


def test_this_cpu_from_a_calibration_record():
    record = {
        "date": "2026-01-01",
        "cpu_name": "Test CPU",
        "matmul_flops_per_thread": {"float32": 2e10, "float64": 1e10},
        "memory_bandwidth_Bps": 1e10,
        "memory_bytes": 8e9,
        "loopback": {"latency_s": 5e-5, "bandwidth_Bps": 2e9},
    }
    topo = this_cpu(calibration=record)
    assert topo.device.flops("float32") == 2e10
    assert topo.intra_node.bandwidth_Bps == 2e9 and "measured" in topo.intra_node.name
    del record["loopback"]
    assert "not measured" in this_cpu(calibration=record).intra_node.name
