"""Benchmark: flat against hierarchical (two-level) all-to-all on an emulated Sunway-shaped
machine, by message size, with the alpha-beta model's crossover (BaGuaLu, issue 13 item 3).

    python benchmarks/hybrid/bench_alltoall.py [--quick] [--rounds 3] [--clock sleep|virtual]
                                               [--check]

8 gloo ranks laid out as 2 supernodes x 2 nodes x 2 ranks on
`furnace.hybrid.alltoall.emulated_supernode_topology` (the sunway-oceanlight shape, 16:3
oversubscribed between supernodes, emulation-scale links). Each size is timed for both
schemes in rotating rounds (`runtime.timing.round_robin`); a round's time is the slowest
rank's, and the table shows medians. ``--clock sleep`` (default) is the sleeping network
emulator: wall-clock time, labelled "emulated", never measured network time. ``--clock
virtual`` is the deterministic virtual clock (what the unit test asserts on).

``--check`` exits 1 unless, at the smallest size, hierarchical sends fewer messages across
the supernode level and is faster, and the measured crossover lies within a factor 2 of
the model's.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from rich.console import Console
from rich.table import Table

from furnace.hybrid.alltoall import (
    AllToAllTimingConfig,
    emulated_supernode_topology,
    exchange_timings,
    measured_crossover,
    model_crossover_bytes,
    modelled_time,
)
from furnace.runtime import run_distributed

WORLD_SIZE = 8
CROSSOVER_FACTOR = 2.0
SIZES = (2048, 8192, 16384, 32768, 65536, 131072, 262144)
QUICK_SIZES = (2048, 16384, 32768, 65536, 131072, 262144)
# millisecond latencies, so that gloo's and the scheduler's own cost on a loaded host stay
# small against the modelled times; model crossover alpha / (1/b1 + 2/b2) = 71 kB
LINKS = {"intra_node_Bps": 100e6, "inter_node_Bps": 10e6, "intra_node_latency_s": 1e-3,
         "inter_node_latency_s": 5e-3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clock", choices=("sleep", "virtual"), default="sleep")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the latency-bound win or the crossover does not hold")
    args = parser.parse_args(argv)
    topo = emulated_supernode_topology(**LINKS)
    sizes = QUICK_SIZES if args.quick else SIZES
    rounds = args.rounds
    config = AllToAllTimingConfig(topology=topo, message_bytes=sizes, rounds=rounds,
                                  warmup=1, mode=args.clock)
    results = run_distributed(exchange_timings, WORLD_SIZE, config, timeout_s=600)
    label = results[0]["label"]

    def median_time(scheme: str, size: int) -> float:
        per_round = zip(*(res["seconds"][scheme][size] for res in results))
        return statistics.median(max(samples) for samples in per_round)

    flat = [median_time("flat", m) for m in sizes]
    hier = [median_time("hierarchical", m) for m in sizes]
    traffic = results[0]["traffic"]
    console = Console()
    console.print(topo.describe())
    table = Table(title=f"flat vs hierarchical all-to-all, {WORLD_SIZE} ranks "
                  f"(2 supernodes x 2 nodes x 2), times: {label}, median of {rounds}")
    for col in ("bytes/pair", "flat ms", "hier ms", "hier/flat", "model flat ms",
                "model hier ms", "inter-SN msgs flat/hier", "inter-SN bytes flat/hier",
                "intra-SN bytes flat/hier"):
        table.add_column(col, justify="right")
    for k, m in enumerate(sizes):
        tf, th = traffic["flat"][m], traffic["hierarchical"][m]
        table.add_row(
            str(m), f"{flat[k] * 1e3:.2f}", f"{hier[k] * 1e3:.2f}", f"{hier[k] / flat[k]:.3f}",
            f"{modelled_time('flat', topo, WORLD_SIZE, m) * 1e3:.2f}",
            f"{modelled_time('hierarchical', topo, WORLD_SIZE, m) * 1e3:.2f}",
            f"{tf.inter_supernode.messages}/{th.inter_supernode.messages}",
            f"{tf.inter_supernode.bytes_sent}/{th.inter_supernode.bytes_sent}",
            f"{tf.intra_supernode.bytes_sent}/{th.intra_supernode.bytes_sent}")
    console.print(table)
    model = model_crossover_bytes(topo, WORLD_SIZE)
    measured = measured_crossover(sizes, flat, hier)
    console.print(f"crossover (bytes per pair): model {model:.0f}" if model else
                  "crossover: none in the model")
    console.print(f"crossover (bytes per pair): {label} "
                  + (f"{measured:.0f}" if measured else "none in the sweep"))
    first = traffic["flat"][sizes[0]], traffic["hierarchical"][sizes[0]]
    fewer = first[1].inter_supernode.messages < first[0].inter_supernode.messages
    faster = hier[0] < flat[0]
    within = (model is not None and measured is not None
              and model / CROSSOVER_FACTOR <= measured <= model * CROSSOVER_FACTOR)
    console.print(f"at {sizes[0]} B: fewer inter-supernode messages {fewer}, faster {faster}; "
                  f"crossover within {CROSSOVER_FACTOR:g}x of the model: {within}")
    return 1 if args.check and not (fewer and faster and within) else 0


if __name__ == "__main__":
    # benchmarks/run.py runs every bench_* in one process: only a failure may exit
    status = main()
    if status:
        sys.exit(status)
