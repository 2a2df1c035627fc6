"""The CPU micro-benchmarks behind `furnace info --calibrate`."""

from __future__ import annotations

import pytest

from furnace.runtime import calibrate


@pytest.mark.timeout(120)
def test_measure_save_load(tmp_path):
    record = calibrate.measure(quick=True, with_link=True)
    for dtype in ("float32", "float64", "bfloat16"):
        assert record["matmul_flops_per_thread"][dtype] > 1e7
    assert record["memory_bandwidth_Bps"] > 1e8
    link = record["loopback"]
    assert 0 < link["latency_s"] < 0.1 and link["bandwidth_Bps"] > 1e6
    path = calibrate.save(record, tmp_path / "cal.json")
    assert calibrate.load(path) == record
    assert calibrate.load(tmp_path / "missing.json") is None
    assert calibrate.load_or_measure(path=path) == record
