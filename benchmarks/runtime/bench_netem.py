"""Benchmark: does the sleeping network emulator (`furnace.runtime.netem`, sleep mode) keep
to its model in wall-clock time, and does compute really overlap an emulated transfer?

    python benchmarks/runtime/bench_netem.py [--repeats 3] [--check]

Two measurements on 2 loopback gloo ranks and a 10 MB/s, 2 ms emulated link:

- a sequence of every op (barrier, all-reduce, all-gather, broadcast, all-to-all,
  reduce-scatter, send/recv, barrier), timed with the wall clock, against the same
  sequence on the virtual clock (the model: 135.96 ms). The emulator only sleeps, so the
  wall time should be the model plus gloo's own cost; the check is 20 %.
- a 1 MiB async all-reduce (108.86 ms modelled) overlapped with compute sized to about
  the same time here: the time saved against running them one after the other should be
  at least half of min(compute, transfer).

These were unit-test assertions until issue 12 (no wall-clock assertions in unit tests;
tests/runtime/test_netem.py now asserts the modelled values). ``--check`` exits 1 if a
median is outside its bound. All times are measured wall clock except "model".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from furnace.runtime import Communicator, run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import emulated_link
from furnace.runtime.timing import time_call

BANDWIDTH_BPS, LATENCY_S = 10e6, 2e-3
SEQUENCE_TOLERANCE = 0.2  # |wall - model| <= 20 % of the model
OVERLAP_FRACTION = 0.5  # saved >= half of min(compute, transfer)


def _ops(comm: Communicator) -> None:
    comm.barrier()
    comm.all_reduce(torch.zeros(2**16))
    comm.all_gather(torch.zeros(2**15))
    comm.broadcast(torch.zeros(2**16), 0)
    comm.all_to_all_single(torch.zeros(2**16))
    comm.reduce_scatter(torch.zeros(2**16))
    if comm.rank == 0:
        comm.send(torch.zeros(2**16), 1)
    else:
        comm.recv(torch.zeros(2**16), 0)
    comm.barrier()


def _sequence(rank: int, world_size: int, mode: str) -> float:
    topo = emulated_link(bandwidth_Bps=BANDWIDTH_BPS, latency_s=LATENCY_S)
    net = NetworkEmulator(NetworkEmulation(topology=topo, mode=mode))
    comm = Communicator(network=net)
    comm.barrier()
    if mode == "virtual":
        t0 = net.now()
        _ops(comm)
        return net.now() - t0
    t0 = time.perf_counter()
    _ops(comm)
    return time.perf_counter() - t0


def _overlap(rank: int, world_size: int) -> dict:
    topo = emulated_link(bandwidth_Bps=BANDWIDTH_BPS, latency_s=LATENCY_S)
    comm = Communicator(network=NetworkEmulator(NetworkEmulation(topology=topo)))
    a = torch.randn(256, 256)
    # size the compute to about the modelled transfer (~0.1 s) on whatever machine this is
    per_matmul = time_call(lambda: a @ a, repeats=1, warmup=0, number=10).min
    repeats = max(10, int(0.1 / per_matmul))

    def compute() -> None:
        for _ in range(repeats):
            a @ a

    out = {}
    comm.barrier()
    t0 = time.perf_counter()
    compute()
    out["compute"] = time.perf_counter() - t0
    comm.barrier()
    t0 = time.perf_counter()
    comm.all_reduce(torch.zeros(2**18))
    compute()
    out["sequential"] = time.perf_counter() - t0
    comm.barrier()
    t0 = time.perf_counter()
    handle = comm.all_reduce(torch.zeros(2**18), async_op=True)
    compute()
    handle.wait()
    out["overlapped"] = time.perf_counter() - t0
    out["modelled"] = comm.log.records[-1].modelled_s
    return out


def bench_sequence(repeats: int) -> tuple[Table, bool]:
    model = max(run_distributed(_sequence, 2, "virtual"))
    walls = [max(run_distributed(_sequence, 2, "sleep")) for _ in range(repeats)]
    wall = statistics.median(walls)
    holds = abs(wall - model) <= SEQUENCE_TOLERANCE * model
    table = Table(title=f"Sleep-mode op sequence vs its model ({BANDWIDTH_BPS / 1e6:g} MB/s, "
                  f"{LATENCY_S * 1e3:g} ms link, 2 ranks)")
    for col in ("model ms", "wall ms (median)", "wall / model", f"within {SEQUENCE_TOLERANCE:.0%}"):
        table.add_column(col, justify="right")
    table.add_row(f"{model * 1e3:.2f}", f"{wall * 1e3:.2f}", f"{wall / model:.3f}",
                  "yes" if holds else "NO")
    return table, holds


def bench_overlap(repeats: int) -> tuple[Table, bool]:
    runs = [run_distributed(_overlap, 2) for _ in range(repeats)]
    # per run, the rank that saved least, as a fraction of what perfect overlap saves
    fractions = [min((r["sequential"] - r["overlapped"]) / min(r["compute"], r["modelled"])
                     for r in run) for run in runs]
    fraction = statistics.median(fractions)
    holds = fraction >= OVERLAP_FRACTION
    last = runs[-1][0]
    table = Table(title="Compute overlapped with a sleeping 1 MiB all-reduce (2 ranks)")
    for col in ("modelled ms", "compute ms", "sequential ms", "overlapped ms",
                "saved / ideal (median)", f">= {OVERLAP_FRACTION:g}"):
        table.add_column(col, justify="right")
    table.add_row(f"{last['modelled'] * 1e3:.2f}", f"{last['compute'] * 1e3:.2f}",
                  f"{last['sequential'] * 1e3:.2f}", f"{last['overlapped'] * 1e3:.2f}",
                  f"{fraction:.2f}", "yes" if holds else "NO")
    return table, holds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a measurement is outside its bound")
    args = parser.parse_args(argv)
    console = Console()
    sequence, sequence_holds = bench_sequence(args.repeats)
    console.print(sequence)
    overlap, overlap_holds = bench_overlap(args.repeats)
    console.print(overlap)
    return 1 if args.check and not (sequence_holds and overlap_holds) else 0


if __name__ == "__main__":
    # benchmarks/run.py runs every bench_* in one process: only a failure may exit
    status = main()
    if status:
        sys.exit(status)
