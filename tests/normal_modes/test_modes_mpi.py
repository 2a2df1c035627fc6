"""`furnace modes` under ``mpiexec -n 2``: every parallel mode gives the one-rank answer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gmsh")
pytest.importorskip("skfem")
pytest.importorskip("mpi4py")

FMAX = 0.8
ARGS = ["modes", "--planet", "mars", "--fmin", "0.45", "--fmax", str(FMAX), "--mesh-size",
        "0.25"]


def _mpiexec() -> str:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    found = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("mpiexec is not installed (pip install 'furnace[hpc]')")
    return found


def _run(tmp_path: Path, name: str, ranks: int, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "furnace.cli", *ARGS, "--json", str(out), *extra]
    if ranks > 1:
        cmd = [_mpiexec(), "-n", str(ranks), *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(300)
def test_modes_same_on_one_and_two_ranks(tmp_path):
    pytest.importorskip("furnace.normal_modes.models").load_planet("mars")
    one = _run(tmp_path, "one", 1, "--slices", "2")
    assert one["ranks"] == 1 and len(one["frequencies_mhz"]) > 10
    # 0T2 is in [0.45, 0.8] mHz and comes out as a complete multiplet
    assert any(m["kind"] == "T" and m["l"] == 2 and m["complete"] for m in one["multiplets"])
    for mode in ("slices", "rows"):
        two = _run(tmp_path, mode, 2, "--mode", mode, "--slices", "2")
        assert two["ranks"] == 2 and two["mode"] == mode
        np.testing.assert_allclose(two["frequencies_mhz"], one["frequencies_mhz"], rtol=1e-9,
                                   atol=1e-9 * FMAX)
        assert [(m["kind"], m["l"], m["size"]) for m in two["multiplets"]] == \
            [(m["kind"], m["l"], m["size"]) for m in one["multiplets"]]
