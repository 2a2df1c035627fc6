"""Benchmark: the DLRM embedding-communication schemes (table_pooled, row, row_dedup, hybrid,
hybrid with every scheduling technique) and TorchRec's table-wise DLRM, at 4 gloo ranks over
an emulated 1 GB/s link (pattern-aware sparse communication, He, Chen, Zhai, PPoPP '24
poster; design note `recsys.md` Sec. 7 "Benchmarks").

    python benchmarks/recsys/bench_recsys.py [--quick] [--ranks 4] [--repeats 3]

Every scheme trains the same batches in interleaved rounds (`furnace.recsys.bench.run_bench`);
a step's time is its slowest rank's, ratios are paired medians. Times are wall-clock with the
network emulated (netem sleep mode) for our engine; TorchRec's traffic is real loopback gloo
and its bytes are intercepted from torch.distributed. Without TorchRec installed its row is
replaced by a note saying why.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from furnace.recsys.bench import BenchConfig, run_bench
from furnace.recsys.torchrec_baseline import available


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, small batch, 1 repeat")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ok, message = available()
    if not ok:
        print(f"TorchRec skipped: {message}")
    if args.quick:
        config = BenchConfig(world_size=2, steps=4, warmup=1, repeats=1, batch_size=256)
    else:
        config = BenchConfig(world_size=args.ranks, repeats=args.repeats)
    run_bench(config).print(Console(width=160))
    return 0


if __name__ == "__main__":
    sys.exit(main())
