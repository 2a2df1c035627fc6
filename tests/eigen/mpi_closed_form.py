"""Run under ``mpiexec -n P python -m tests.eigen.mpi_closed_form OUT.json MODE CHECKS``:
every case of `closed_form.CASES` solved by `eigsh_interval_mpi` in one parallel mode
(pEVSL's layouts, Shi et al., SC'18, section IV.D) with each count check of the
comma-separated CHECKS ("auto,dos"), in one launch (one start-up for all).

Rank 0 writes, per case and count check: the eigenvalues, the exact count, whether the
result is complete, and the per-slice report. Imports only furnace.eigen (no torch).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import numpy as np


def main(argv: list[str]) -> int:
    from mpi4py import MPI

    from furnace.eigen import SolverConfig, eigsh_interval_mpi

    from .closed_form import CASES, case

    out, mode, checks = argv
    comm = MPI.COMM_WORLD
    results = {}
    for name, *_ in CASES:
        A, want, a, b = case(name)
        for count_check in checks.split(","):
            config = SolverConfig(a=a, b=b, count_check=count_check, allow_incomplete=True)
            result = eigsh_interval_mpi(A, None, a, b, comm=comm, config=config, mode=mode)
            x = result.eigenvectors
            results[f"{name}/{count_check}"] = {
                "want": want.tolist(), "eigenvalues": result.eigenvalues.tolist(),
                "complete": result.complete, "message": result.message,
                "max_residual": float(result.residuals.max(initial=0.0)),
                "gram_error": float(np.abs(x.T @ x - np.eye(x.shape[1])).max(initial=0.0)),
                "slices": [asdict(s) for s in result.slices]}
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
