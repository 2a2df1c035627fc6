"""Micro-benchmarks that measure this CPU for the ``this-cpu`` preset, and the file that keeps them.

``furnace info --calibrate`` runs them and saves the figures; `presets.this_cpu` reads
them. Measured: single-thread GEMM throughput per dtype, all-thread fp32 GEMM, memory
copy bandwidth, and gloo loopback latency and bandwidth between two processes (ping-pong).
All are best-of-N wall-clock figures on a shared machine (`furnace.runtime.timing`), so
they are noisy by nature.

The calibration cache is explicit: a `CalibrationCache` names the JSON file a record is
read from and saved to. `CalibrationCache.default()` is ``~/.cache/furnace/calibration.json``
(`DEFAULT_CACHE_PATH`, the home directory resolved when it is called);
`CalibrationCache.disabled()` reads and writes nothing, so `load_or_measure` then measures
afresh. To refresh the saved figures, run ``furnace info --calibrate`` (it overwrites the
file) or delete the file.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write_text
from .timing import time_call

# where `CalibrationCache.default()` keeps the record ("~" is the user's home directory)
DEFAULT_CACHE_PATH = "~/.cache/furnace/calibration.json"


@dataclass(frozen=True)
class CalibrationCache:
    """The file a calibration record is kept in between runs.

    Attributes:
        path: the JSON file, or None for no cache (`load` finds nothing, `save` writes
            nothing).
    """

    path: Path | None

    @classmethod
    def default(cls) -> CalibrationCache:
        """``~/.cache/furnace/calibration.json`` (`DEFAULT_CACHE_PATH`), home resolved now."""
        return cls(Path(DEFAULT_CACHE_PATH).expanduser())

    @classmethod
    def disabled(cls) -> CalibrationCache:
        """No cache: nothing is read or written."""
        return cls(None)

    def describe(self) -> str:
        return str(self.path) if self.path is not None else "none (disabled)"

    def load(self) -> dict[str, Any] | None:
        """The saved record, or None when there is none (or no cache)."""
        return None if self.path is None else load(self.path)

    def save(self, record: dict[str, Any]) -> Path | None:
        """Write ``record`` (atomically); return the file, or None when there is no cache."""
        return None if self.path is None else save(record, self.path)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def matmul_flops(dtype: torch.dtype, *, size: int = 512, repeats: int = 5,
                 num_threads: int | None = None) -> float:
    """FLOP/s of an n x n matmul (2 n^3 FLOPs) in ``dtype``, best of ``repeats`` after one
    warm-up, with ``num_threads`` torch threads (None: the current count)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    timing = time_call(lambda: torch.mm(a, b), repeats=repeats, warmup=1,
                       num_threads=num_threads)
    return 2 * size**3 / timing.min


def memory_bandwidth(*, num_bytes: int = 64 * 2**20, repeats: int = 5,
                     num_threads: int | None = None) -> float:
    """Bytes/s of a large tensor copy (read + write counted), best of ``repeats``."""
    src = torch.empty(num_bytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), repeats=repeats, warmup=1,
                       num_threads=num_threads)
    return 2 * num_bytes / timing.min


def _round_trip(rank: int, buf: torch.Tensor) -> None:
    import torch.distributed as dist

    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def _pingpong(rank: int, world_size: int, sizes: list[int], repeats: int) -> dict[int, float]:
    import torch.distributed as dist

    out = {}
    for nbytes in sizes:
        buf = torch.zeros(max(nbytes // 4, 1))
        dist.barrier()
        # a round trip is two one-way messages
        out[nbytes] = time_call(partial(_round_trip, rank, buf), repeats=repeats,
                                warmup=0).min / 2
    return out


def loopback_link(*, repeats: int = 20) -> dict[str, float]:
    """Latency (1-element one-way time) and bandwidth (16 MiB one-way) of gloo on loopback."""
    from .launch import run_distributed

    small, large = 4, 16 * 2**20
    times = run_distributed(_pingpong, 2, [small, large], repeats, timeout_s=120)[0]
    latency = times[small]
    bandwidth = large / max(times[large] - latency, 1e-9)
    return {"latency_s": latency, "bandwidth_Bps": bandwidth}


def measure(*, quick: bool = False, with_link: bool = True) -> dict[str, Any]:
    """Run the micro-benchmarks and return a calibration record."""
    repeats = 3 if quick else 7
    threads = torch.get_num_threads()
    per_thread = {
        "float32": matmul_flops(torch.float32, repeats=repeats, num_threads=1),
        "float64": matmul_flops(torch.float64, repeats=repeats, num_threads=1),
        "bfloat16": matmul_flops(torch.bfloat16, repeats=repeats, num_threads=1),
    }
    bandwidth = memory_bandwidth(repeats=repeats, num_threads=1)
    record: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_name": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": threads,
        "matmul_flops_per_thread": per_thread,
        "matmul_flops_all_threads_float32": matmul_flops(torch.float32, repeats=repeats),
        "memory_bandwidth_Bps": bandwidth,
        "memory_bytes": _total_memory(),
    }
    if with_link:
        record["loopback"] = loopback_link(repeats=5 if quick else 20)
    return record


def _total_memory() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return float(8 * 2**30)


def save(record: dict[str, Any], path: Path) -> Path:
    """Write ``record`` as JSON to ``path`` (atomically, creating its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2))
    return path


def load(path: Path) -> dict[str, Any] | None:
    """The record saved at ``path``, or None when it is missing or not a JSON object."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def load_or_measure(cache: CalibrationCache, *, quick: bool = True) -> dict[str, Any]:
    """The record saved in ``cache``, or a compute-only measurement made now when there is
    none (or the cache is disabled); a fresh measurement is not saved."""
    return cache.load() or measure(quick=quick, with_link=False)
