"""Benchmark: ring attention against the 2-D context tiling and the planner's plan on every
sparse mask, at 4 gloo ranks over the emulated network (UltraAttn, Yang et al., SC'25 §6;
issue 14's measured evidence).

    python benchmarks/context_parallel/bench_cp.py [--quick] [--ranks 4] [--repeats 7]
                                                   [--check]

Each mask runs ring, the best 2-D tiling alone (``tiled_2d``) and the planner's choice
(``tiled``, which may keep a baseline) in interleaved rounds (`bench.measure_schemes`); a
round's time is the slowest rank's, ratios are paired medians. Links of 100 MB/s and 1 ms
per message (netem sleep mode): times are emulated, never measured network time; compute is
real. Every output is checked against the dense reference and every logged byte against
the plan.

``--check`` exits 1 unless, on every mask, both tiled schemes are faster than ring, their
outputs are exact and their bytes equal the plan's.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from furnace.context_parallel.bench import BenchConfig, measure_schemes

SPARSE_MASKS = ("sliding_window", "strided", "global_local", "star", "streaming", "document",
                "random")
QUICK_MASKS = ("strided", "global_local", "document")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three masks")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    table = Table(title=f"ring vs tiled, {args.ranks} gloo ranks, emulated 100 MB/s, 1 ms "
                  "(emulated time, fwd+bwd)")
    for name in ("mask", "ring ms", "2-D tiling ms", "/ring", "planner's plan", "ms", "/ring",
                 "exact", "bytes == plan"):
        table.add_column(name)
    failures = []
    for mask in QUICK_MASKS if args.quick else SPARSE_MASKS:
        res = measure_schemes(BenchConfig(
            mask=mask, seq_len=512, num_blocks=16, num_ranks=args.ranks, num_heads=2,
            num_kv_heads=2, head_dim=32, schemes=("ring", "tiled_2d", "tiled"),
            repeats=args.repeats, time_limit_s=0.5, bandwidth_Bps=100e6, latency_s=1e-3))
        ring, tiling, kept = res.scheme("ring"), res.scheme("tiled_2d"), res.scheme("tiled")
        table.add_row(mask, f"{ring.median_s * 1e3:.1f}", f"{tiling.median_s * 1e3:.1f}",
                      f"{tiling.ratio:.3f}", kept.plan_scheme, f"{kept.median_s * 1e3:.1f}",
                      f"{kept.ratio:.3f}", str(res.all_correct), str(res.all_bytes_match))
        if not (res.all_correct and res.all_bytes_match and (tiling.ratio or 2.0) < 1.0
                and (kept.ratio or 2.0) < 1.0):
            failures.append(mask)
    Console(width=140).print(table)
    if args.check and failures:
        print(f"check failed on: {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
