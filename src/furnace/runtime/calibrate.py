"""Micro-benchmarks that measure this CPU for the ``this-cpu`` preset.

``furnace info --calibrate`` runs them and saves the figures; `presets.this_cpu` reads
them. Measured: single-thread GEMM throughput per dtype, all-thread fp32 GEMM, memory
copy bandwidth, and gloo loopback latency and bandwidth between two processes (ping-pong).
All are best-of-N wall-clock figures on a shared machine, so they are noisy by nature.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write_text
from .launch import torch_threads

DEFAULT_PATH = Path.home() / ".cache" / "furnace" / "calibration.json"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_flops(dtype: torch.dtype, *, size: int = 512, repeats: int = 5) -> float:
    """FLOP/s of an n x n matmul (2 n^3 FLOPs) in ``dtype`` with the current thread count."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    return 2 * size**3 / _best_time(lambda: torch.mm(a, b), repeats)


def memory_bandwidth(*, num_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy (read + write counted)."""
    src = torch.empty(num_bytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * num_bytes / _best_time(lambda: dst.copy_(src), repeats)


def _pingpong(rank: int, world_size: int, sizes: list[int], repeats: int) -> dict[int, float]:
    import torch.distributed as dist

    out = {}
    for nbytes in sizes:
        buf = torch.zeros(max(nbytes // 4, 1))
        dist.barrier()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            best = min(best, (time.perf_counter() - t0) / 2)
        out[nbytes] = best
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
    with torch_threads(1):
        per_thread = {
            "float32": matmul_flops(torch.float32, repeats=repeats),
            "float64": matmul_flops(torch.float64, repeats=repeats),
            "bfloat16": matmul_flops(torch.bfloat16, repeats=repeats),
        }
        bandwidth = memory_bandwidth(repeats=repeats)
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


def save(record: dict[str, Any], path: Path = DEFAULT_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2))
    return path


def load(path: Path = DEFAULT_PATH) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_or_measure(*, quick: bool = True, path: Path = DEFAULT_PATH) -> dict[str, Any]:
    """The saved calibration, or a quick compute-only measurement when none is saved."""
    return load(path) or measure(quick=quick, with_link=False)
