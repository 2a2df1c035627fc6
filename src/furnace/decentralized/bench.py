"""P-Reduce micro-benchmarks (design note `prague.md` sections 6.1 and 7.4 E1): the time of
one P-Reduce per backend, group size and model size on local gloo ranks, next to a world
all-reduce and an AD-PSGD pair exchange, and the cost of creating a member-only group.

All on loopback gloo, measured (no emulation): the figures are CPU-bound and machine
dependent, so they serve as relative evidence and as the calibration of the simulator
(`simulate.fit_costs`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .generator import Group
from .preduce import irecv, isend, make_backend

__all__ = ["MicroResult", "PReduceSample", "run_microbench"]


@dataclass(frozen=True)
class PReduceSample:
    """One measured operation: its kind, group size, bytes per member and median seconds."""

    op: str
    group_size: int
    num_bytes: int
    seconds: float
    samples: tuple[float, ...] = ()


@dataclass
class MicroResult:
    world_size: int
    samples: list[PReduceSample] = field(default_factory=list)
    create_s: dict[int, float] = field(default_factory=dict)
    generator_roundtrip_s: float = 0.0

    def get(self, op: str, group_size: int, num_bytes: int) -> PReduceSample:
        return next(s for s in self.samples if s.op == op and s.group_size == group_size
                    and s.num_bytes == num_bytes)


def _timed(fn: Any, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _bench_rank(rank: int, world_size: int, sizes: tuple[int, ...], repeats: int
                ) -> MicroResult:
    from .worker import _coordination_store

    store, host, port = _coordination_store(rank, 60.0)
    groups = [tuple(range(g)) for g in range(2, world_size + 1)]
    backends = {name: make_backend(name, rank, store, timeout_s=60.0, namespace="bench",
                                   static_groups=groups) for name in ("p2p", "cached",
                                                                       "precreated")}
    result = MicroResult(world_size)
    seq = 0
    for numel in sizes:
        flat = torch.randn(numel)
        nbytes = numel * 4
        for name, backend in backends.items():
            for members in groups:
                def op(members: tuple[int, ...] = members, backend: Any = backend,
                       flat: torch.Tensor = flat) -> None:
                    nonlocal seq
                    seq += 1
                    if rank in members:
                        backend(flat, Group(seq, members, members))
                times = _timed(op, repeats + 1)[1:]  # the first use may create the group
                result.samples.append(PReduceSample(f"preduce_{name}", len(members), nbytes,
                                                    statistics.median(times), tuple(times)))
        def world(flat: torch.Tensor = flat) -> None:
            dist.all_reduce(flat)
        result.samples.append(PReduceSample("world_allreduce", world_size, nbytes,
                                            statistics.median(_timed(world, repeats))))

        def pair(flat: torch.Tensor = flat) -> None:
            if rank in (0, 1):
                other = torch.empty_like(flat)
                peer = 1 - rank
                for work in (isend(flat, peer, tag=77), irecv(other, peer, tag=77)):
                    work.wait()
        result.samples.append(PReduceSample("pair_exchange", 2, nbytes,
                                            statistics.median(_timed(pair, repeats))))
    result.generator_roundtrip_s = _generator_roundtrip(rank, world_size, host, port,
                                                        repeats)
    cached = backends["cached"]
    result.create_s = {len(m): 0.0 for m in groups}
    # creation cost: fresh member-only groups under a new namespace, one per size
    for members in groups:
        fresh = make_backend("cached", rank, store, timeout_s=60.0,
                             namespace=f"bench-create-{len(members)}")
        dist.barrier()
        if rank in members:
            fresh(torch.zeros(1), Group(10**6 + len(members), members, members))
            result.create_s[len(members)] = fresh.stats.create_s
    del cached
    return result


def _generator_roundtrip(rank: int, world_size: int, host: str, port: int, repeats: int
                         ) -> float:
    """Median time from a request to its group in the requester's queue: rank 0 asks
    (random pairs), nobody executes the groups (only the generator is timed)."""
    from .config import PolicyConfig
    from .generator import GeneratorClient, GeneratorServer
    from .worker import _connect

    server = None
    if rank == 0:
        server = GeneratorServer(_connect(host, port, 60.0), PolicyConfig("random",
                                                                           group_size=2),
                                 world_size, timeout_s=60.0)
        server.start()
    dist.barrier()
    client = GeneratorClient(_connect(host, port, 60.0), rank, timeout_s=60.0)
    times = []
    if rank == 0:
        for _ in range(4 * repeats):
            start = time.perf_counter()
            client.request()
            while True:  # the first entry of ours that we own is the answer
                group = client.next_group()
                if group is not None and rank in group.owners:
                    break
            times.append(time.perf_counter() - start)
    dist.barrier()
    client.done()
    if server is not None:
        server.join(60.0)
    return statistics.median(times) if times else 0.0


def run_microbench(world_size: int = 4, sizes: tuple[int, ...] = (38_282, 1_126_410),
                   repeats: int = 5) -> MicroResult:
    """Rank 0's view (a member of every group) of the micro-benchmarks on local ranks."""
    from furnace.runtime.launch import run_distributed

    results = run_distributed(_bench_rank, world_size, sizes, repeats, timeout_s=300)
    first: MicroResult = results[0]
    return first
