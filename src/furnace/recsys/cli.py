"""`furnace recsys`: pattern-aware sparse communication for DLRM training (He, Chen, Zhai,
PPoPP '24 poster; design note `recsys.md`) from the command line.

``furnace recsys train --ranks 4`` trains DLRM on synthetic Criteo-like data (or a Criteo TSV
file, ``--data``) on local gloo ranks, or as the ranks torchrun launched, with a progress bar,
and scores a held-out split: log loss and AUC.

``furnace recsys plan --ranks 32`` runs the performance model: the hot set it replicates
within the memory budget, and every scheme's expected bytes per phase on the busiest rank with
the modelled communication time (modelled, closed form; no process starts).

``furnace recsys bench --ranks 4`` runs the schemes side by side on local gloo ranks over the
emulated network (labelled emulated), and TorchRec's table-wise sharding at the same shapes
when the `recsys-baselines` extra is installed.

Every mistake exits 2 with one line naming the flag, before any rank starts.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from furnace.runtime.atomic import atomic_write_text
from furnace.runtime.cliargs import (
    ConfigFieldError,
    UsageError,
    float_in,
    input_file,
    int_in,
    output_file,
    require,
)

from .config import SCHEMES, SPARSE_OPTIMIZERS

MAX_LOCAL_RANKS = 8
MAX_PLAN_RANKS = 4096
PRESETS = ("h100-ib", "h200-ib", "v100-50gbps")
# config fields as the flags that set them, so a config error names the user's flag
_FLAG_OF_FIELD = {
    "world_size": "--ranks", "batch_size": "--batch-size", "steps": "--steps",
    "eval_batches": "--eval-batches", "profile_batches": "--profile-batches",
    "row_scale": "--row-scale", "zipf_exponent": "--zipf", "bag_size": "--bag-size",
    "embedding_dim": "--embedding-dim", "interaction": "--interaction",
    "optimizer": "--optimizer", "sparse": "--optimizer", "lr": "--lr",
    "dense_lr": "--dense-lr", "hot_budget_mib": "--hot-budget-mib",
    "memory_budget": "--hot-budget-mib", "memory_budget_bytes": "--hot-budget-mib",
    "ranks_per_node": "--ranks-per-node", "data": "--data", "table_rows": "--rows-per-table",
    "rows_per_table": "--rows-per-table", "scheme": "--scheme", "schemes": "--schemes",
}


def _config_error(exc: ConfigFieldError) -> UsageError:
    return UsageError(_FLAG_OF_FIELD.get(exc.field, f"--{exc.field.replace('_', '-')}"),
                      exc.allowed)


def add_parser(subparsers: Any) -> None:
    rec = subparsers.add_parser("recsys", help="pattern-aware sparse communication for DLRM "
                                "training (train, plan, bench)")
    sub = rec.add_subparsers(dest="recsys_command", metavar="COMMAND")
    rec.set_defaults(func=lambda args: (rec.print_help(), 0)[1])

    train = sub.add_parser("train", help="train DLRM on local gloo ranks (or under torchrun) "
                           "and score a held-out split (log loss, AUC)")
    train.add_argument("--ranks", type=int_in(1, MAX_LOCAL_RANKS), default=2,
                       help="local gloo ranks (under torchrun: the launched ranks; if given it "
                       "must match them)")
    train.add_argument("--scheme", choices=SCHEMES, default="hybrid",
                       help="hybrid: row-wise, deduplicated, hot rows replicated (the "
                       "planner's set); the others are the baselines")
    train.add_argument("--no-schedule", action="store_true",
                       help="turn off prefetch, overlap, pairwise rounds and the fused "
                       "all-reduce")
    train.add_argument("--steps", type=int_in(1, 10**7), default=100, help="training steps")
    train.add_argument("--batch-size", type=int_in(1, 1 << 20), default=512,
                       help="global batch (a multiple of --ranks)")
    train.add_argument("--eval-batches", type=int_in(1, 10**6), default=8,
                       help="held-out batches scored after training")
    train.add_argument("--profile-batches", type=int_in(1, 10**6), default=4,
                       help="training batches whose access counts the planner reads")
    _add_data_arguments(train)
    _add_model_arguments(train)
    train.add_argument("--lr", type=float_in(0.0, 100.0, lo_open=True), default=0.05,
                       help="learning rate of the embedding rows")
    train.add_argument("--dense-lr", type=float_in(0.0, 100.0, lo_open=True), default=0.05,
                       help="learning rate of the MLPs (SGD)")
    _add_cluster_arguments(train, ranks=None)
    train.add_argument("--data", type=input_file, default=None,
                       help="a Criteo TSV file (label, 13 integers, 26 hex categories, tab "
                       "separated) instead of synthetic data (default: synthetic)")
    train.add_argument("--data-format", choices=("hashed", "indexed"), default="hashed",
                       help="hashed: categories are Criteo's hex strings, hashed into "
                       "--rows-per-table rows; indexed: categories are row indices already")
    train.add_argument("--rows-per-table", type=int_in(1, 1 << 31), default=10000,
                       help="rows of each of the 26 tables when reading --data")
    train.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0,
                       help="data and initialisation")
    train.add_argument("--json", type=output_file, default=None,
                       help="also write the run's figures here (default: none)")
    train.set_defaults(func=_train)

    plan = sub.add_parser("plan", help="the performance model's hot set and every scheme's "
                          "expected bytes and time on a cluster (modelled; nothing runs)")
    _add_cluster_arguments(plan, ranks=32)
    _add_data_arguments(plan)
    _add_model_arguments(plan)
    plan.add_argument("--batch-size-per-rank", type=int_in(1, 1 << 20), default=2048,
                      help="samples per rank and step")
    plan.add_argument("--json", type=output_file, default=None,
                      help="also write the plan's figures here (default: none)")
    plan.set_defaults(func=_plan)

    bench = sub.add_parser("bench", help="the schemes side by side on local gloo ranks over "
                           "the emulated network, with TorchRec when installed")
    bench.add_argument("--ranks", type=int_in(2, MAX_LOCAL_RANKS), default=4,
                       help="local gloo ranks")
    bench.add_argument("--schemes", type=_scheme_list, default=",".join(SCHEMES),
                       help=f"comma-separated, from {', '.join(SCHEMES)}")
    bench.add_argument("--steps", type=int_in(3, 10**5), default=10,
                       help="timed steps per scheme (interleaved; medians compared)")
    bench.add_argument("--warmup", type=int_in(1, 10**4), default=2,
                       help="untimed steps first; their access counts feed the planner")
    bench.add_argument("--batch-size", type=int_in(1, 1 << 20), default=1024,
                       help="global batch (a multiple of --ranks)")
    _add_data_arguments(bench)
    _add_model_arguments(bench)
    bench.add_argument("--hot-budget-mib", type=float_in(0.0, 1e6), default=8.0,
                       help="memory per rank for the hot replicas (weights and optimizer "
                       "state)")
    bench.add_argument("--bandwidth-mbps", type=float_in(0.0, 1e6, lo_open=True),
                       default=100.0, help="emulated link bandwidth per rank, MB/s")
    bench.add_argument("--latency-ms", type=float_in(0.0, 1e3), default=0.2,
                       help="emulated link latency per message, ms")
    bench.add_argument("--ranks-per-node", type=int_in(1, MAX_LOCAL_RANKS), default=1,
                       help="ranks sharing a node: above 1 (and below --ranks, dividing it) "
                       "the machine has two levels, --bandwidth-mbps/--latency-ms become "
                       "the link between nodes and the all-reduces hierarchical")
    bench.add_argument("--intra-bandwidth-mbps", type=float_in(0.0, 1e6, lo_open=True),
                       default=1000.0, help="emulated link inside a node, MB/s (two levels)")
    bench.add_argument("--intra-latency-ms", type=float_in(0.0, 1e3), default=0.02,
                       help="emulated latency inside a node, ms (two levels)")
    bench.add_argument("--no-emulation", action="store_true",
                       help="plain gloo loopback, no emulated network")
    bench.add_argument("--no-torchrec", action="store_true",
                       help="leave TorchRec out even when it is installed")
    bench.add_argument("--json", type=output_file, default=None,
                       help="also write the measurements here (default: none)")
    bench.set_defaults(func=_bench)


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--row-scale", type=float_in(0.0, 1.0, lo_open=True), default=1e-3,
                        help="synthetic tables: Criteo Kaggle's cardinalities times this")
    parser.add_argument("--zipf", type=float_in(0.0, 4.0), default=1.05,
                        help="Zipf exponent of the synthetic IDs (0: uniform)")
    parser.add_argument("--bag-size", type=int_in(1, 1024), default=1,
                        help="mean IDs per bag (1: one-hot, as Criteo)")


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--embedding-dim", type=int_in(1, 4096), default=16,
                        help="D, the width of every embedding row")
    parser.add_argument("--interaction", choices=("dot", "dcn"), default="dot",
                        help="dot: DLRM's pairwise dots; dcn: DCN-v2 cross layers")
    parser.add_argument("--optimizer", choices=SPARSE_OPTIMIZERS, default="rowwise_adagrad",
                        help="sparse optimizer of the embedding rows")


def _add_cluster_arguments(parser: argparse.ArgumentParser, *, ranks: int | None) -> None:
    if ranks is not None:
        parser.add_argument("--ranks", type=int_in(1, MAX_PLAN_RANKS), default=ranks,
                            help="GPUs of the cluster")
        parser.add_argument("--profile-batches", type=int_in(0, 10**6), default=0,
                            help="plan from the access counts of this many generated batches "
                            "(0: from the generator's exact probabilities)")
    parser.add_argument("--hot-budget-mib", type=float_in(0.0, 1e6), default=8.0,
                        help="memory per rank for the hot replicas (weights and optimizer "
                        "state)")
    parser.add_argument("--preset", choices=PRESETS, default="h100-ib",
                        help="the cluster the performance model plans for "
                        "(furnace.runtime.presets)")
    parser.add_argument("--ranks-per-node", type=int_in(1, 64), default=8,
                        help="GPUs per node of that cluster (train: above it, the all-reduces are "
                        "hierarchical)")


def _scheme_list(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in SCHEMES]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of {', '.join(SCHEMES)}, got {text!r}")
    return names


def _world_size(args: argparse.Namespace, default: int) -> int:
    from furnace.runtime.launch import is_torchrun

    if not is_torchrun():
        return default
    launched = int(os.environ["WORLD_SIZE"])
    require(default == launched or default == 2, "--ranks",
            f"must match torchrun's {launched} ranks, got {default}")
    return launched


def train_config(args: argparse.Namespace) -> Any:
    """The `RecsysTrainConfig` of ``recsys train``'s arguments; a `UsageError` names the flag."""
    from .train import RecsysTrainConfig

    try:
        return RecsysTrainConfig(
            world_size=_world_size(args, args.ranks), scheme=args.scheme,
            schedule=not args.no_schedule, steps=args.steps, batch_size=args.batch_size,
            eval_batches=args.eval_batches, profile_batches=args.profile_batches,
            row_scale=args.row_scale, zipf_exponent=args.zipf, bag_size=args.bag_size,
            embedding_dim=args.embedding_dim, interaction=args.interaction,
            optimizer=args.optimizer, lr=args.lr, dense_lr=args.dense_lr,
            hot_budget_mib=args.hot_budget_mib, preset=args.preset,
            ranks_per_node=args.ranks_per_node,
            data=None if args.data is None else str(args.data),
            data_format=args.data_format, rows_per_table=args.rows_per_table,
            seed=args.seed)
    except ConfigFieldError as exc:
        raise _config_error(exc) from None


def _train(args: argparse.Namespace) -> int:
    from rich.console import Console

    from furnace.runtime.launch import is_torchrun

    from .train import load_batches, train_recsys

    config = train_config(args)
    try:
        load_batches(config)  # a malformed or short file is refused before any rank starts
    except ConfigFieldError as exc:
        raise _config_error(exc) from None
    result = train_recsys(config, progress=True)
    if is_torchrun() and result.rank != 0:
        return 0
    console = Console()
    console.print(f"trained {config.steps} steps of {config.batch_size} samples on "
                  f"{config.world_size} ranks ({config.scheme}, "
                  f"{'scheduled' if config.schedule else 'unscheduled'}) in "
                  f"{result.seconds:.1f} s (measured)")
    console.print(f"hot rows replicated: {result.hot_rows} ({result.hot_reason})")
    console.print(f"train loss: first {result.losses[0]:.4f}, last {result.losses[-1]:.4f}")
    console.print(f"held out ({config.eval_batches} batches): log loss "
                  f"{result.eval_logloss:.4f}, AUC {result.eval_auc:.4f}")
    phases = ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in result.bytes_per_step.items())
    console.print(f"bytes per step, all ranks (CommLog): {phases}; busiest rank "
                  f"{result.busiest_rank_bytes_per_step / 1024:.1f} KiB")
    if args.json is not None:
        from dataclasses import asdict

        atomic_write_text(args.json, json.dumps(asdict(result), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .compare import plan_report

    require(args.ranks % args.ranks_per_node == 0 or args.ranks < args.ranks_per_node,
            "--ranks-per-node", f"a divisor of --ranks ({args.ranks}), or more than it")
    try:
        report = plan_report(
            world_size=args.ranks, ranks_per_node=args.ranks_per_node, preset=args.preset,
            row_scale=args.row_scale, zipf_exponent=args.zipf, bag_size=args.bag_size,
            batch_size_per_rank=args.batch_size_per_rank, embedding_dim=args.embedding_dim,
            optimizer=args.optimizer, memory_budget_bytes=args.hot_budget_mib * 2**20,
            profile_batches=args.profile_batches)
    except ConfigFieldError as exc:
        raise _config_error(exc) from None
    console = Console(width=max(Console().width, 140))
    report.print(console)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(report.to_dict(), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .bench import BenchConfig, run_bench

    require(args.batch_size % args.ranks == 0, "--batch-size",
            f"a multiple of --ranks ({args.ranks}), got {args.batch_size}")
    require(args.ranks % args.ranks_per_node == 0, "--ranks-per-node",
            f"a divisor of --ranks ({args.ranks}), got {args.ranks_per_node}")
    try:
        config = BenchConfig(
            world_size=args.ranks, schemes=args.schemes, steps=args.steps, warmup=args.warmup,
            batch_size=args.batch_size, row_scale=args.row_scale, zipf_exponent=args.zipf,
            bag_size=args.bag_size, embedding_dim=args.embedding_dim,
            interaction=args.interaction, optimizer=args.optimizer,
            hot_budget_mib=args.hot_budget_mib,
            bandwidth_Bps=None if args.no_emulation else args.bandwidth_mbps * 1e6,
            latency_s=args.latency_ms * 1e-3, torchrec=not args.no_torchrec,
            ranks_per_node=args.ranks_per_node,
            intra_bandwidth_Bps=args.intra_bandwidth_mbps * 1e6,
            intra_latency_s=args.intra_latency_ms * 1e-3)
    except ConfigFieldError as exc:
        raise _config_error(exc) from None
    console = Console(width=max(Console().width, 140))
    with console.status(f"running {len(config.schemes)} schemes on {config.world_size} "
                        "ranks ..."):
        result = run_bench(config)
    result.print(console)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.to_dict(), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0
