"""Benchmark: P-Reduce per backend against a world all-reduce and a pair exchange, then
All-Reduce, Prague (static and ready-window) and AD-PSGD side by side at 4 gloo ranks,
with equal workers and with one 4x slow (Prague, Luo et al., ASPLOS '20; design note
`prague.md` section 7.4 E1-E3).

    python benchmarks/decentralized/bench_decentralized.py [--ranks 4] [--duration 3]

Compute is emulated by sleeping 20 ms per step and every link at 10 MB/s, so the times are
emulated; the micro-benchmarks are plain loopback gloo (measured).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from furnace.decentralized import HeteroConfig, PolicyConfig, RunConfig, run_series
from furnace.decentralized.bench import run_microbench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--duration", type=float, default=3.0)
    args = parser.parse_args(argv)
    console = Console(width=140)
    micro = run_microbench(args.ranks, repeats=5)
    table = Table(title=f"P-Reduce, {args.ranks} gloo ranks, loopback (measured, median ms)")
    for col in ("operation", "group size", "MiB", "ms"):
        table.add_column(col, justify="right")
    for s in micro.samples:
        table.add_row(s.op, str(s.group_size), f"{s.num_bytes / 2**20:.2f}",
                      f"{s.seconds * 1e3:.2f}")
    console.print(table)
    links = tuple((r, 10e6) for r in range(args.ranks))
    base = RunConfig(world_size=args.ranks, duration_s=args.duration, lr=0.1,
                     hetero=HeteroConfig(slow_links=links), backend="cached",
                     snapshot_every_s=0.05)
    modes = {"All-Reduce": replace(base, mode="allreduce", lr=0.2),
             "Prague static": replace(base, mode="prague", backend="precreated",
                                      policy=PolicyConfig("static", grid_rows=2)),
             "Prague ready-window": replace(base, mode="prague",
                                            policy=PolicyConfig("ready_window",
                                                                group_size=3, window_ms=3)),
             "AD-PSGD": replace(base, mode="adpsgd", backend="p2p")}
    configs = list(modes.values()) + [
        replace(c, hetero=replace(c.hetero, slow=((0, 4.0),))) for c in modes.values()]
    results = run_series(configs)
    table = Table(title=f"{args.ranks} ranks, {args.duration:g} s each (emulated compute and "
                  "links)")
    for col in ("mode", "workers", "steps/s", "s to 95%", "final accuracy", "timeouts"):
        table.add_column(col, justify="right")
    for k, r in enumerate(results):
        name = list(modes)[k % len(modes)]
        reached = r.time_to(0.95)
        table.add_row(name, "equal" if k < len(modes) else "rank 0 4x slow",
                      f"{r.throughput:.1f}", "-" if reached is None else f"{reached:.2f}",
                      f"{r.final_accuracy:.3f}", str(r.timeouts))
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
