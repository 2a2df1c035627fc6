"""Benchmark: what `Communicator`'s instrumentation costs over raw torch.distributed, and
the discrete-event simulator's throughput.

    python benchmarks/runtime/bench_comm.py [--world-sizes 2 4] [--repeats 30]

Raw and wrapped calls alternate in one run on the same ranks (rounds of
`furnace.runtime.timing.time_round_robin`, a barrier before each call), so machine load
hits both alike; each cell is the median over repeats of the slowest rank. All times are
measured wall clock on loopback gloo.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from furnace.runtime import Communicator, Simulator, run_distributed
from furnace.runtime.timing import stopwatch, time_round_robin

SIZES = (1, 2**10, 2**16, 2**20)


def _rank(rank: int, world_size: int, repeats: int) -> dict:
    comm = Communicator()
    out = {}
    for numel in SIZES:
        x = torch.zeros(numel * world_size)

        def raw_a2a(x: torch.Tensor = x) -> None:
            # the raw call allocates its output, as the wrapper does
            dist.all_to_all_single(torch.empty_like(x), x)

        fns = {"raw_ar": lambda x=x: dist.all_reduce(x),
               "wrapped_ar": lambda x=x: comm.all_reduce(x),
               "raw_a2a": raw_a2a,
               "wrapped_a2a": lambda x=x: comm.all_to_all_single(x)}
        # every rank runs the same order, so the calls of a round meet across ranks
        t = time_round_robin(fns, rounds=repeats, rotate=False, setup=dist.barrier)
        out[numel] = {
            "all_reduce": (list(t["raw_ar"].samples), list(t["wrapped_ar"].samples)),
            "all_to_all_single": (list(t["raw_a2a"].samples), list(t["wrapped_a2a"].samples)),
        }
    return out


def bench_overhead(world_sizes, repeats) -> Table:
    table = Table(title="Communicator vs raw torch.distributed (measured, loopback gloo)")
    for col in ("ranks", "op", "bytes/rank", "raw us", "wrapped us", "wrapped/raw"):
        table.add_column(col, justify="right")
    for ws in world_sizes:
        per_rank = run_distributed(_rank, ws, repeats, timeout_s=600)
        for numel in SIZES:
            for op in ("all_reduce", "all_to_all_single"):
                raw = [max(r[numel][op][0][i] for r in per_rank) for i in range(repeats)]
                wrapped = [max(r[numel][op][1][i] for r in per_rank) for i in range(repeats)]
                raw_m, wrapped_m = statistics.median(raw), statistics.median(wrapped)
                table.add_row(str(ws), op, str(4 * numel * ws), f"{raw_m * 1e6:.0f}",
                              f"{wrapped_m * 1e6:.0f}", f"{wrapped_m / raw_m:.2f}")
    return table


def bench_simulator(num_tasks: int = 100_000) -> Table:
    rng = random.Random(0)
    sim = Simulator()
    for name in ("gpu", "net"):
        sim.add_resource(name)
    for i in range(num_tasks):
        deps = tuple(f"t{j}" for j in rng.sample(range(i), min(i, 2)))
        sim.add_task(f"t{i}", rng.random(), resource=rng.choice(["gpu", "net", None]), deps=deps)
    with stopwatch() as run:
        timeline = sim.run()
    with stopwatch() as cp:
        path = timeline.critical_path()
    run_s, cp_s = run.seconds, cp.seconds
    table = Table(title="Discrete-event simulator (measured)")
    for col in ("tasks", "run s", "tasks/s", "critical path s", "critical path length"):
        table.add_column(col, justify="right")
    table.add_row(str(num_tasks), f"{run_s:.2f}", f"{num_tasks / run_s:.0f}", f"{cp_s:.2f}",
                  str(len(path)))
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    console = Console()
    console.print(bench_overhead(args.world_sizes, args.repeats))
    console.print(bench_simulator())


if __name__ == "__main__":
    main()
