"""`furnace moe`: the FasterMoE benchmark and simulator from the command line (He et al.,
PPoPP'22, sections 4-5: the techniques side by side, and the step simulator).

    furnace moe bench [--mode emulated|virtual|measured] [--world-size 4] [--routing hot]
        [--tokens-per-rank 2048] ...
    furnace moe simulate --gpus 256 [--routing zipf --zipf-exponent 1.0] [--trace t.json]

Every argument is checked before a rank is spawned or a step simulated (the contract of
`furnace.runtime.cliargs`): a mistake exits 2 with one line naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os

from furnace.runtime.atomic import atomic_write_text
from furnace.runtime.cliargs import (
    UsageError,
    add_config_arguments,
    config_from_args,
    float_in,
    int_in,
    output_file,
    positive_float,
    positive_int,
)

from .config import MAX_ZIPF_EXPONENT, BenchConfig, BenchConfigError

# the simulator's task graph and the W x W counts grow with the square of the GPUs
MAX_SIMULATED_GPUS = 1024
# spawning more local gloo ranks than this is a typo, not a benchmark
MAX_LOCAL_RANKS = 64

# the BenchConfig fields `moe bench` sets, in the order of its --help; the options are
# declared from the fields (flag = field name), so a config error names the flag
BENCH_FIELDS = ("mode", "world_size", "experts_per_rank", "routing", "hot_share",
                "zipf_exponent", "tokens_per_rank", "d_model", "d_hidden", "top_k", "steps",
                "group_size", "policies")
# BenchConfig field -> the flag that sets it
BENCH_FLAGS = {name: "--" + name.replace("_", "-") for name in BENCH_FIELDS}
# routing "trace" needs per-expert shares, which the command line does not take
CLI_ROUTINGS = ("hot", "zipf", "uniform")

share = float_in(0.0, 1.0)
zipf_exponent = float_in(0.0, MAX_ZIPF_EXPONENT)


def _node_presets() -> dict[str, str]:
    """Topology presets with a node size, and the keyword their factory takes it by."""
    from furnace.runtime.presets import PRESETS

    out = {}
    for name, factory in PRESETS.items():
        params = inspect.signature(factory).parameters
        for keyword in ("gpus_per_node", "ranks_per_node"):
            if keyword in params:
                out[name] = keyword
                break
    return out


def add_parser(subparsers) -> None:
    moe = subparsers.add_parser("moe", help="FasterMoE: expert-parallel MoE benchmark and "
                                "simulator")
    sub = moe.add_subparsers(dest="moe_command", metavar="COMMAND")
    moe.set_defaults(func=lambda args: (moe.print_help(), 0)[1])

    bench = sub.add_parser("bench", help="baseline vs shadowing vs smart schedule, side by "
                           "side on local gloo ranks")
    default_ranks = {f.name: f.default for f in dataclasses.fields(BenchConfig)}["world_size"]
    add_config_arguments(bench, BenchConfig, BENCH_FIELDS, overrides={
        "world_size": {"type": int_in(1, MAX_LOCAL_RANKS), "default": None,
                       "help": f"local gloo ranks to spawn (default: {default_ranks}); under "
                       "torchrun the launched ranks, and if given it must match them"},
        "experts_per_rank": {"type": positive_int},
        "routing": {"choices": CLI_ROUTINGS},
        "hot_share": {"type": share},
        "zipf_exponent": {"type": zipf_exponent},
        # --tokens: the short spelling, which `moe simulate` shares
        "tokens_per_rank": {"flags": ("--tokens-per-rank", "--tokens"), "type": positive_int,
                            "metavar": "TOKENS"},
        "d_model": {"type": positive_int},
        "d_hidden": {"type": positive_int},
        "top_k": {"type": positive_int},
        "steps": {"type": positive_int},
        "group_size": {"type": positive_int},
        "policies": {"metavar": "POLICY"},
    })
    bench.add_argument("--json", type=output_file, help="also write the full result here")
    bench.set_defaults(func=_bench)

    presets = _node_presets()
    sim = sub.add_parser("simulate", help="simulate one layer step at 16-1024 GPUs")
    sim.add_argument("--gpus", type=int_in(1, MAX_SIMULATED_GPUS), nargs="+",
                     default=[16, 64, 256], help="GPU counts to simulate")
    sim.add_argument("--preset", choices=tuple(presets), default="v100-50gbps",
                     help="topology preset")
    sim.add_argument("--gpus-per-node", type=positive_int, default=4,
                     help="GPUs (ranks) that share a node's fast links")
    sim.add_argument("--routing", choices=("hot", "zipf", "uniform"), default="zipf",
                     help="synthetic routing skew of the first choices")
    sim.add_argument("--hot-share", type=share, default=0.05,
                     help="share of first choices on expert 0 (--routing hot)")
    sim.add_argument("--zipf-exponent", type=zipf_exponent, default=1.0,
                     help="skew of --routing zipf")
    sim.add_argument("--tokens", type=positive_int, default=2048, help="tokens per GPU")
    sim.add_argument("--d-model", type=positive_int, default=1024, help="token width H")
    sim.add_argument("--d-hidden", type=positive_int, default=4096,
                     help="expert hidden width F")
    sim.add_argument("--capacity-factor", type=positive_float, default=1.2,
                     help="also simulate a GShard capacity gate with this factor")
    sim.add_argument("--max-steps", type=positive_int, default=32,
                     help="at most this many smart-schedule steps")
    sim.add_argument("--trace", type=output_file, help="write the Chrome trace of the best "
                     "policy's step (largest GPU count) here")
    sim.set_defaults(func=_simulate, _node_keyword=presets)


def bench_config(args: argparse.Namespace):
    """The `BenchConfig` of ``moe bench``'s arguments; raises `UsageError` naming the flag.

    Under torchrun the ranks are the launched ones, so the checks that depend on the
    number of ranks (``--top-k``, ``--group-size``) use torchrun's world size.
    """
    from furnace.runtime.launch import is_torchrun

    world_size = (BenchConfig().world_size if args.world_size is None
                  else args.world_size)
    if is_torchrun():
        launched = int(os.environ["WORLD_SIZE"])
        if args.world_size is not None and args.world_size != launched:
            raise UsageError("--world-size", f"must match torchrun's {launched} ranks, "
                             f"got {args.world_size}")
        world_size = launched
    try:
        return config_from_args(BenchConfig, args, world_size=world_size)
    except BenchConfigError as exc:
        raise UsageError(BENCH_FLAGS.get(exc.field, exc.field), exc.allowed) from None


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from furnace.runtime.launch import is_torchrun

    from .bench import format_table, run_bench

    cfg = bench_config(args)
    console = Console()
    if is_torchrun():
        # every rank runs and leaves the process group inside run_bench; rank 0 reports
        result = run_bench(cfg)
        if int(os.environ["RANK"]) != 0:
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
        atomic_write_text(args.json, json.dumps(result.to_dict(), indent=2) + "\n")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from furnace.runtime.presets import GPU_EXCHANGE_STEP_OVERHEAD_S, get_preset

    from .perfmodel import MoEPerfModel
    from .simulate import choose_policy, simulate_policies, simulate_step, synthetic_counts
    from .workload import hot_expert, uniform, zipf

    topology = get_preset(args.preset, **{args._node_keyword[args.preset]: args.gpus_per_node})
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
        # the 20 us per exchange step is an assumed NCCL-scale cost (README, deviations)
        perf = MoEPerfModel.from_topology(topology, d_model=args.d_model,
                                          d_hidden=args.d_hidden, world_size=W,
                                          step_overhead_s=GPU_EXCHANGE_STEP_OVERHEAD_S)
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
    print("simulated times (discrete-event simulator on the preset's constants)")
    if args.trace and last is not None:
        W, perf, counts, best = last
        timeline = simulate_step(counts, perf, 1, choose_policy(best, perf, counts, 1,
                                                                max_steps=args.max_steps))
        # the simulator's own writer is not atomic; write its dict through atomic.py
        atomic_write_text(args.trace, json.dumps(timeline.to_chrome_trace(), indent=1) + "\n",
                          encoding="ascii")
        print(f"wrote the Chrome trace of '{best}' at {W} GPUs to {args.trace} "
              "(open it in Perfetto)")
    return 0
