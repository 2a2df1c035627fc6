"""Test helpers shared by every system's test suite.

`assert_close` compares a fast path against its reference with a relative error
(the norm of the difference over the norm of the reference, as flash-linear-attention's
``assert_close``), so one tolerance means the same thing for every tensor size. The
denominator has an absolute floor (``scale``) tied to the inputs, so a reference that is
exactly zero, such as a gradient a path never reads, cannot make the ratio blow up.
`run_distributed` (from `launch`) is the multi-rank harness.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from .launch import run_distributed

__all__ = ["TORCHRUN_ENTRY", "assert_close", "max_relative_error", "relative_error",
           "run_distributed", "run_torchrun", "seed_all", "start_vector", "torchrun_outcomes"]


class Shaped(Protocol):
    """A matrix or operator with a shape: an array, a scipy sparse matrix, a LinearOperator."""

    @property
    def shape(self) -> tuple[int, ...]: ...


def seed_all(seed: int = 42) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_vector(matrix: Shaped, seed: int = 0) -> np.ndarray:
    """A fixed random start for ARPACK (`scipy.sparse.linalg.eigsh`'s ``v0``).

    scipy >= 1.15 draws the default start from OS entropy, so a slow run cannot be replayed
    (a test that takes ~5 s once spent over 120 s inside ARPACK in CI).
    """
    return np.random.default_rng(seed).standard_normal(matrix.shape[0])


def relative_error(reference: torch.Tensor, actual: torch.Tensor,
                   scale: float | None = None) -> float:
    """||actual - reference|| / max(||reference||, scale) in float64.

    ``scale`` is an absolute floor tied to the inputs' magnitude (for a gradient, the norm
    of the output or of the inputs it flows from). It matters where the reference is
    exactly zero, as a gradient that a path never reads is: rounding in the fast path
    then gives ~1e-16 against 0, which a pure ratio turns into 1 or 1e14. Without a floor
    a zero reference is an error, since no tolerance means anything relative to 0.
    """
    ref = reference.detach().to(torch.float64)
    act = actual.detach().to(torch.float64)
    if ref.shape != act.shape:
        raise AssertionError(f"shape mismatch: reference {tuple(ref.shape)}, "
                             f"actual {tuple(act.shape)}")
    diff: float = torch.linalg.vector_norm(act - ref).item()
    denominator: float = max(torch.linalg.vector_norm(ref).item(), scale or 0.0)
    if not denominator > 0:
        raise AssertionError("the reference is zero and no scale was given: pass scale= "
                             "(the inputs' magnitude) so the tolerance has a meaning")
    return diff / denominator


def max_relative_error(reference: torch.Tensor, actual: torch.Tensor,
                       scale: float | None = None) -> float:
    """max |actual - reference| / max(max |reference|, scale): the elementwise-max form."""
    ref = reference.detach().to(torch.float64)
    act = actual.detach().to(torch.float64)
    if ref.shape != act.shape:
        raise AssertionError(f"shape mismatch: reference {tuple(ref.shape)}, "
                             f"actual {tuple(act.shape)}")
    diff = (act - ref).abs().max().item() if ref.numel() else 0.0
    peak = ref.abs().max().item() if ref.numel() else 0.0
    denominator = max(peak, scale or 0.0)
    if not denominator > 0:
        raise AssertionError("the reference is zero and no scale was given: pass scale= "
                             "(the inputs' magnitude) so the tolerance has a meaning")
    return diff / denominator


def assert_close(name: str, reference: torch.Tensor, actual: torch.Tensor, ratio: float,
                 scale: float | None = None) -> None:
    """Fail unless ``relative_error(reference, actual, scale) <= ratio``."""
    if not torch.isfinite(actual.detach()).all():
        raise AssertionError(f"{name}: actual has non-finite values")
    err = relative_error(reference, actual, scale)
    if not err <= ratio:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {ratio:.1e}")


# A torchrun worker script: runs the furnace CLI (``cli ARGS...``) or the collectives'
# self-check (``selfcheck``), optionally after making one function raise on rank 1
# (``--fail-on-rank-1 MODULE:FUNCTION``), and prints how main ended on this rank and
# whether its process group outlived it (`torchrun_outcomes` reads the lines).
TORCHRUN_ENTRY = """
import importlib, os, sys
import torch.distributed as dist

entry, argv = sys.argv[1], sys.argv[2:]
rank = int(os.environ["RANK"])
if argv[:1] == ["--fail-on-rank-1"]:
    module_name, name = argv[1].split(":")
    argv = argv[2:]
    module = importlib.import_module(module_name)
    original = getattr(module, name)

    def fail_on_rank_1(*args, **kwargs):
        # rank 0 goes on into collectives that rank 1 never joins
        if rank == 1:
            raise RuntimeError("failure injected on rank 1")
        return original(*args, **kwargs)

    setattr(module, name, fail_on_rank_1)
if entry == "cli":
    from furnace.cli import main as run
    run_main = lambda: run(argv)
else:
    from furnace.runtime.selfcheck import main as run_main
try:
    outcome = f"returned {run_main()}"
except BaseException as exc:
    outcome = f"raised {type(exc).__name__}"
print(f"rank {rank}: main {outcome}; group alive after main: {dist.is_initialized()}",
      flush=True)
# exit 0 even on the error path: torchrun would otherwise kill the peer before it reports
"""

_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def run_torchrun(script: str | Path, *argv: str, nproc: int = 2, timeout_s: float = 100,
                 cwd: str | Path | None = None) -> tuple[int, str, str]:
    """``torchrun --standalone --nproc-per-node nproc script argv...`` at one torch thread
    per worker; returns ``(exit code, stdout, stderr)``. It runs in a session of its own,
    killed whole on a timeout (`subprocess.TimeoutExpired` is raised then), so no worker
    outlives the caller. Raises FileNotFoundError when no torchrun sits beside this Python.
    """
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        raise FileNotFoundError(f"no torchrun next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    proc = subprocess.Popen(
        [str(torchrun), "--standalone", "--nproc-per-node", str(nproc), str(script), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**env, "OMP_NUM_THREADS": "1"}, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


def torchrun_outcomes(log: str) -> dict[int, tuple[str, str]]:
    """Each rank's (how main ended, whether its group was alive after) from the lines
    `TORCHRUN_ENTRY` prints. Searched anywhere: the ranks share torchrun's output, so a
    report may follow another process's unterminated line."""
    found = re.findall(r"rank (\d+): main (returned \d+|raised \w+); "
                       r"group alive after main: (True|False)", log)
    return {int(rank): (outcome, alive) for rank, outcome, alive in found}
