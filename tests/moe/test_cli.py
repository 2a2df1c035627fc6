"""`furnace moe` commands."""

from __future__ import annotations

import json

import pytest

from furnace.cli import main


def test_moe_help(capsys):
    assert main(["moe"]) == 0
    assert "bench" in capsys.readouterr().out


def test_simulate_writes_table_and_trace(tmp_path, capsys):
    trace = tmp_path / "step.json"
    assert main(["moe", "simulate", "--gpus", "16", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "gshard-capacity" in out and "baseline" in out
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.timeout(300)
def test_bench_virtual_small(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["moe", "bench", "--mode", "virtual", "--world-size", "2", "--tokens", "256",
                 "--d-model", "32", "--d-hidden", "64", "--steps", "1",
                 "--policies", "baseline", "shadow", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["label"] == "virtual-clock" and set(data["results"]) == {"baseline", "shadow"}
    with pytest.raises(SystemExit):
        main(["moe", "bench", "--mode", "real"])
    assert main(["moe", "bench", "--hot-share", "1.5"]) == 2
    assert "hot_share" in capsys.readouterr().err
