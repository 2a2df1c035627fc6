"""The CPU micro-benchmarks behind `furnace info --calibrate`, and the explicit file that
keeps their record (`CalibrationCache`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from furnace.runtime import calibrate
from furnace.runtime.calibrate import CalibrationCache


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
    cache = CalibrationCache(path)
    assert cache.load() == record
    assert calibrate.load_or_measure(cache) == record


def test_cache_saves_where_it_says(tmp_path):
    record = {"date": "2026-01-01", "cpu_name": "Test CPU"}
    cache = CalibrationCache(tmp_path / "sub" / "cal.json")
    assert cache.load() is None
    assert cache.save(record) == tmp_path / "sub" / "cal.json"
    assert cache.load() == record
    assert cache.describe() == str(tmp_path / "sub" / "cal.json")


def test_default_cache_is_under_the_home_directory(monkeypatch, tmp_path):
    # the home directory is resolved when default() is called, not at import
    monkeypatch.setenv("HOME", str(tmp_path))
    assert CalibrationCache.default().path == tmp_path / ".cache" / "furnace" / "calibration.json"
    assert Path(calibrate.DEFAULT_CACHE_PATH).expanduser() == CalibrationCache.default().path


def test_disabled_cache_reads_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    CalibrationCache.default().save({"date": "2026-01-01", "cpu_name": "saved"})
    off = CalibrationCache.disabled()
    assert off.path is None and off.load() is None and off.save({"x": 1}) is None
    # with no cache the record is measured now (compute only), not the saved one
    record = calibrate.load_or_measure(off, quick=True)
    assert record["cpu_name"] != "saved" and "loopback" not in record
    assert record["matmul_flops_per_thread"]["float32"] > 1e7
