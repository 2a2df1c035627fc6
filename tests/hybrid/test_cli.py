"""`furnace hybrid plan`: the planner's table for the paper's two sizes (all modelled);
`furnace hybrid train` through the `furnace` entry point: a run on local ranks, its resume
under another expert-parallel size, and the one-line refusal of an existing checkpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


TINY_TRAIN = ["hybrid", "train", "--world-size", "2", "--d-model", "8", "--d-hidden", "8",
              "--seq-len", "8", "--batch-size", "4", "--corpus-bytes", "50000"]


def _furnace(*argv: str) -> subprocess.CompletedProcess[str]:
    entry = Path(sys.executable).with_name("furnace")
    if not entry.exists():
        pytest.skip(f"no furnace entry point next to {sys.executable}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([str(entry), *argv], capture_output=True, text=True, timeout=100,
                          env={**env, "OMP_NUM_THREADS": "1"})


def _report(stdout: str) -> list[str]:
    # the progress bar shares stdout; the report is the lines after it
    return [line for line in stdout.splitlines()
            if line.startswith(("MoDa W=", "checkpoint: ")) and "━" not in line]


@pytest.mark.timeout(120)
def test_train_resumes_under_another_layout_and_refuses_an_existing_checkpoint(tmp_path,
                                                                               capsys):
    from furnace.hybrid.checkpoint import read_moda_metadata

    folder = tmp_path / "ckpt"
    first = _furnace(*TINY_TRAIN, "--steps", "2", "--checkpoint", str(folder))
    assert first.returncode == 0, first.stdout + first.stderr
    report = _report(first.stdout)
    assert len(report) == 2, first.stdout
    assert re.fullmatch(r"MoDa W=2 P=2 fp32: 2 steps, final loss \d+\.\d{4} \(global batch\), "
                        r"\d+\.\d s", report[0]), report
    assert report[1] == f"checkpoint: {folder} (step 2)"
    before = read_moda_metadata(folder)["loop"]["losses"]

    resumed = _furnace(*TINY_TRAIN, "--steps", "4", "--resume", "--checkpoint", str(folder),
                       "--expert-parallel-size", "1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    report = _report(resumed.stdout)
    assert len(report) == 2 and report[0].startswith("MoDa W=2 P=1 fp32: 4 steps, final loss")
    assert report[1] == f"checkpoint: {folder} (step 4)"
    after = read_moda_metadata(folder)["loop"]["losses"]
    # the resumed run continued the first one's curve rather than starting over
    assert len(after) == 4 and after[:2] == before
    assert f"final loss {after[-1]:.4f}" in report[0]

    # refused in the launching process before any rank starts, so in-process is the same
    capsys.readouterr()
    assert main([*TINY_TRAIN, "--steps", "4", "--checkpoint", str(folder),
                 "--expert-parallel-size", "1"]) == 2
    refused = capsys.readouterr()
    lines = refused.err.strip().splitlines()
    assert len(lines) == 1 and "--checkpoint" in lines[0] and "--resume" in lines[0], lines
    assert refused.out == ""
    assert read_moda_metadata(folder)["loop"]["losses"] == after  # untouched


def test_validate_exits_1_naming_a_quantity_outside_its_tolerance(monkeypatch, capsys):
    from furnace.hybrid import validation
    from furnace.hybrid.validation import ValidationRow

    good = ValidationRow(2, "flops_per_step", 100.0, 100.0, 1e-9, "counted")
    bad = ValidationRow(4, "a2a_bytes[inter_group]", 2048.0, 1024.0, 1e-9, "counted")
    monkeypatch.setattr(validation, "validate_planner", lambda: [good])
    assert main(["hybrid", "validate"]) == 0
    monkeypatch.setattr(validation, "validate_planner", lambda: [good, bad])
    assert main(["hybrid", "validate"]) == 1
    out = capsys.readouterr().out
    assert "W=4 a2a_bytes[inter_group]" in out and "NO" in out
