"""`furnace moe`: the FasterMoE benchmark and simulator from the command line.

    furnace moe bench [--mode emulated|virtual] [--world-size 4] [--routing hot] ...
    furnace moe simulate --gpus 256 [--routing zipf --zipf-exponent 1.0] [--trace t.json]
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> None:
    moe = subparsers.add_parser("moe", help="FasterMoE: expert-parallel MoE benchmark and "
                                "simulator")
    sub = moe.add_subparsers(dest="moe_command", metavar="COMMAND")
    moe.set_defaults(func=lambda args: (moe.print_help(), 0)[1])

    bench = sub.add_parser("bench", help="baseline vs shadowing vs smart schedule, side by "
                           "side on local gloo ranks")
    bench.add_argument("--mode", choices=("emulated", "virtual", "measured"),
                       default="emulated",
                       help="emulated: wall clock on a sleeping link balance-matched to "
                       "V100 + 50 Gb/s; virtual: deterministic clock of that testbed; "
                       "measured: no emulation (use under torchrun on GPUs)")
    bench.add_argument("--world-size", type=int, default=4)
    bench.add_argument("--experts-per-rank", type=int, default=1)
    bench.add_argument("--routing", choices=("hot", "zipf", "uniform"), default="hot")
    bench.add_argument("--hot-share", type=float, default=0.5)
    bench.add_argument("--zipf-exponent", type=float, default=1.2)
    bench.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    bench.add_argument("--d-model", type=int, default=256)
    bench.add_argument("--d-hidden", type=int, default=1024)
    bench.add_argument("--top-k", type=int, default=1)
    bench.add_argument("--steps", type=int, default=3)
    bench.add_argument("--group-size", type=int, default=None,
                       help="force the smart schedule's G (default: the model chooses)")
    bench.add_argument("--policies", nargs="+", default=["baseline", "shadow", "smart", "both"])
    bench.add_argument("--json", help="also write the full result here")
    bench.set_defaults(func=_bench)

    sim = sub.add_parser("simulate", help="simulate one layer step at 16-1024 GPUs")
    sim.add_argument("--gpus", type=int, nargs="+", default=[16, 64, 256])
    sim.add_argument("--preset", default="v100-50gbps", help="topology preset")
    sim.add_argument("--gpus-per-node", type=int, default=4)
    sim.add_argument("--routing", choices=("hot", "zipf", "uniform"), default="zipf")
    sim.add_argument("--hot-share", type=float, default=0.05)
    sim.add_argument("--zipf-exponent", type=float, default=1.0)
    sim.add_argument("--tokens", type=int, default=2048, help="tokens per GPU")
    sim.add_argument("--d-model", type=int, default=1024)
    sim.add_argument("--d-hidden", type=int, default=4096)
    sim.add_argument("--capacity-factor", type=float, default=1.2,
                     help="also simulate a GShard capacity gate with this factor")
    sim.add_argument("--max-steps", type=int, default=32,
                     help="at most this many smart-schedule steps")
    sim.add_argument("--trace", help="write the Chrome trace of the best policy's step "
                     "(largest GPU count) here")
    sim.set_defaults(func=_simulate)


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .bench import BenchConfig, format_table, run_bench

    try:
        cfg = BenchConfig(world_size=args.world_size, experts_per_rank=args.experts_per_rank,
                          d_model=args.d_model, d_hidden=args.d_hidden,
                          tokens_per_rank=args.tokens, top_k=args.top_k, routing=args.routing,
                          hot_share=args.hot_share, zipf_exponent=args.zipf_exponent,
                          mode=args.mode, steps=args.steps, policies=tuple(args.policies),
                          group_size=args.group_size)
    except ValueError as exc:
        print(f"furnace moe bench: {exc}", file=sys.stderr)
        return 2
    from furnace.runtime.launch import is_torchrun

    console = Console()
    if is_torchrun():
        result = run_bench(cfg)
        import torch.distributed as dist

        if dist.get_rank() != 0:
            return 0
    else:
        with console.status(f"running {len(cfg.policies)} policies on {cfg.world_size} "
                            f"ranks ({cfg.mode}) ..."):
            result = run_bench(cfg)
    console.print(format_table(result))
    if result.label == "measured":
        console.print(f"wall clock, no emulation; the policies decide with the "
                      f"{result.topology} model ({result.flops_per_s / 1e12:.3g} TFLOP/s, "
                      f"{result.bandwidth_Bps / 1e9:.3g} GB/s)")
    else:
        console.print(f"{result.label} time: link {result.bandwidth_Bps / 1e6:.3g} MB/s, "
                      f"device {result.flops_per_s / 1e9:.3g} GFLOP/s per rank")
    console.print("bytes and messages are per rank and step, from the CommLog")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=2)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from furnace.runtime.presets import get_preset

    from .perfmodel import MoEPerfModel
    from .simulate import choose_policy, simulate_policies, simulate_step, synthetic_counts
    from .workload import hot_expert, uniform, zipf

    try:
        topology = get_preset(args.preset, gpus_per_node=args.gpus_per_node)
    except (TypeError, ValueError) as exc:
        print(f"furnace moe simulate: {exc}", file=sys.stderr)
        return 2
    table = Table(title=f"Simulated MoE layer step ({args.preset}, {args.routing} routing, "
                  f"{args.tokens} tokens/GPU)")
    for col in ("GPUs", "policy", "step ms", "speedup", "shadowed", "G", "dropped %"):
        table.add_column(col, justify="right")
    last = None
    for W in args.gpus:
        if args.routing == "hot":
            p = hot_expert(W, args.hot_share)
        elif args.routing == "zipf":
            p = zipf(W, args.zipf_exponent)
        else:
            p = uniform(W)
        perf = MoEPerfModel.from_topology(topology, d_model=args.d_model,
                                          d_hidden=args.d_hidden, world_size=W,
                                          step_overhead_s=20e-6)
        counts = synthetic_counts(W, 1, args.tokens, p)
        sims = simulate_policies(counts, perf, 1, capacity_factor=args.capacity_factor,
                                 tokens_per_rank=args.tokens, max_steps=args.max_steps)
        base = sims["baseline"].step_s
        for name, r in sims.items():
            table.add_row(str(W), name, f"{r.step_s * 1e3:.2f}", f"{base / r.step_s:.2f}x",
                          str(r.shadowed), str(r.group_size), f"{100 * r.dropped:.1f}")
        last = (W, perf, counts, min(("shadow", "smart", "both"),
                                     key=lambda n: sims[n].step_s))
    Console().print(table)
    if args.trace and last is not None:
        W, perf, counts, best = last
        timeline = simulate_step(counts, perf, 1, choose_policy(best, perf, counts, 1,
                                                                max_steps=args.max_steps))
        timeline.to_chrome_trace(args.trace)
        print(f"wrote the Chrome trace of '{best}' at {W} GPUs to {args.trace} "
              "(open it in Perfetto)")
    return 0
