"""`furnace emulate` and the `furnace reproduce emulation` entries."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.cli import main
from furnace.runtime.reproduce import discover


def test_registered():
    assert [e.name for e in discover("emulation")] == ["ladder", "speedup", "cpu_time",
                                                        "selector", "mlp_curve"]


def test_gemm_command_reports_error_counts_and_times(capsys):
    assert main(["emulate", "gemm", "--type", "FP32-B", "--size", "64", "--dist", "wide"]) == 0
    out = capsys.readouterr().out
    assert "normwise error" in out and "mm_bf16: 6 calls" in out and "CPU time" in out


def test_gemm_command_refuses_out_of_range_and_unknown_types(capsys):
    assert main(["emulate", "gemm", "--type", "FP32-F", "--size", "64", "--dist", "wide"]) == 2
    assert "range" in capsys.readouterr().err
    assert main(["emulate", "gemm", "--type", "NOPE"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_select_and_app_commands(capsys):
    assert main(["emulate", "select", "gemm-wide", "--size", "tiny"]) == 0
    assert "chosen: FP32-B" in capsys.readouterr().out
    assert main(["emulate", "select", "gemm-narrow", "--size", "tiny",
                 "--requirement", "1e-30"]) == 1
    assert "no type meets" in capsys.readouterr().out
    assert main(["emulate", "app", "kmeans", "--type", "BF16", "--size", "tiny"]) == 0
    assert "MISSES" in capsys.readouterr().out


@pytest.mark.parametrize("dist", ["uniform", "normal", "wide", "cancel"])
def test_operand_distributions(dist):
    from furnace.emulation.cli import make_operands

    A, B = make_operands(dist, 16, np.float32, np.random.default_rng(0))
    assert A.shape == B.shape == (16, 16) and A.dtype == np.float32
    if dist == "wide":
        assert np.abs(A).max() > 65504 or np.abs(B).max() > 65504
