"""`furnace hybrid plan`: the planner's table for the paper's two sizes (all modelled)."""

from __future__ import annotations

import json

import pytest

from furnace.cli import main


def test_plan_prints_the_anchor_at_the_papers_eflops(capsys):
    assert main(["hybrid", "plan", "--params", "14.5T", "--nodes", "96000", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 14.5T at 1 EFLOPS" in out and "modelled" in out
    # the calibrated anchor's best layout reaches the paper's figure by construction
    assert "1.000" in out


def test_plan_for_174t_fits_and_writes_json(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["hybrid", "plan", "--params", "174T", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    best = record["feasible"][0]
    assert record["label"] == "modelled" and best["memory_bytes_per_rank"]["fits"]
    assert best["total_params"] == pytest.approx(174e12, rel=0.02)
    assert best["memory_bytes_per_rank"]["total"] <= best["memory_bytes_per_rank"]["capacity"]
    for key in ("flops_per_step", "a2a_bytes_per_rank", "sync_bytes_per_rank", "step_s"):
        assert key in best


def test_a_model_that_cannot_fit_exits_1_and_says_why(capsys):
    assert main(["hybrid", "plan", "--params", "1000T"]) == 1
    assert "infeasible" in capsys.readouterr().out
