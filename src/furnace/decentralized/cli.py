"""`furnace decentralized`: Prague's heterogeneity-aware decentralized training (Luo et al.,
ASPLOS '20; design note `prague.md`) from the command line.

``furnace decentralized train --mode prague --policy ready_window --slow 0:4`` trains on
local gloo ranks (or the ranks torchrun launched) with a progress bar, and reports the
average model's held-out accuracy against wall time, the time to a target accuracy, the
throughput and the overhead breakdown. Compute is emulated by sleeping (labelled).

``furnace decentralized simulate --workers 64`` runs the discrete-event simulator
(labelled simulated): throughput and time to target of every mode at that size.

Every mistake exits 2 with one line naming the flag, before any rank starts.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from furnace.runtime.atomic import atomic_write_text
from furnace.runtime.cliargs import (
    ConfigFieldError,
    UsageError,
    float_in,
    int_in,
    output_file,
    require,
)

from .config import BACKENDS, MODES, POLICIES, TASKS

MAX_LOCAL_RANKS = 8
DEFAULT_GROUP_SIZE = 3
# config fields as the flags that set them, so a config error names the user's flag
_FLAG_OF_FIELD = {
    "mode": "--mode", "policy": "--policy", "group_size": "--group-size",
    "window_ms": "--window-ms", "divisions": "--divisions",
    "division_period": "--division-period", "grid_rows": "--grid-rows",
    "backend": "--backend", "task": "--task", "world_size": "--ranks",
    "batch_size": "--batch-size", "lr": "--lr", "momentum": "--momentum",
    "compute_ms": "--compute-ms", "duration_s": "--duration", "max_steps": "--max-steps",
    "stop_at_accuracy": "--stop-at-accuracy", "snapshot_every_s": "--snapshot-every",
    "local_sgd_period": "--local-sgd-period", "timeout_s": "--timeout",
    "mlp_hidden": "--mlp-hidden", "label_alpha": "--label-alpha", "slow": "--slow",
    "slow_links": "--slow-link",
    "transient_prob": "--transient", "transient_factor": "--transient",
    "workers": "--workers", "compute_s": "--compute-ms", "model_bytes": "--model-mb",
}


def _config_error(exc: ConfigFieldError) -> UsageError:
    return UsageError(_FLAG_OF_FIELD.get(exc.field, f"--{exc.field.replace('_', '-')}"),
                      exc.allowed)


def _rank_value(kind: str) -> Any:
    """RANK:VALUE, as --slow 0:4 or --slow-link 1:50."""
    def parse(text: str) -> tuple[int, float]:
        rank_text, sep, value_text = text.partition(":")
        try:
            if not sep:
                raise ValueError
            rank, value = int(rank_text), float(value_text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be RANK:{kind} (for example 0:4), got {text!r}") from None
        return rank, value
    return parse


def _transient(text: str) -> tuple[float, float]:
    prob_text, sep, factor_text = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(prob_text), float(factor_text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be PROBABILITY:FACTOR (for example 0.1:3), got {text!r}") from None


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", choices=POLICIES, default="ready_window",
                        help="how the group generator forms groups (prague mode)")
    parser.add_argument("--group-size", type=int_in(2, 1024), default=None,
                        help="g of random/buffered/division; the largest ready_window group "
                        "(default: 3, or all workers when there are fewer)")
    parser.add_argument("--window-ms", type=float_in(0.0, 1e4), default=10.0,
                        help="ready_window: how long the first ready worker waits for others")
    parser.add_argument("--divisions", type=int_in(1, 1024), default=2,
                        help="division: disjoint sets of workers groups form in")
    parser.add_argument("--division-period", type=int_in(1, 10**6), default=16,
                        help="division: groups between two re-draws of the divisions")
    parser.add_argument("--grid-rows", type=int_in(1, 1024), default=2,
                        help="static: rows of the grid whose rows, then columns, average")


def add_parser(subparsers: Any) -> None:
    dec = subparsers.add_parser("decentralized", help="Prague: heterogeneity-aware "
                                "decentralized training with Partial All-Reduce (train, "
                                "simulate)")
    sub = dec.add_subparsers(dest="decentralized_command", metavar="COMMAND")
    dec.set_defaults(func=lambda args: (dec.print_help(), 0)[1])

    train = sub.add_parser("train", help="train on local gloo ranks (or under torchrun); "
                           "accuracy against wall time, throughput, overheads (emulated "
                           "compute)")
    train.add_argument("--mode", choices=MODES, default="prague",
                       help="prague: P-Reduce among generated groups; the rest are the "
                       "baselines")
    add_policy_arguments(train)
    train.add_argument("--backend", choices=BACKENDS, default="p2p",
                       help="how P-Reduce runs: p2p leader on the world group, cached "
                       "member-only gloo groups, or groups precreated (static only)")
    train.add_argument("--ranks", type=int_in(2, MAX_LOCAL_RANKS), default=4,
                       help="local gloo ranks (under torchrun: the launched ranks; if given "
                       "it must match them)")
    train.add_argument("--task", choices=TASKS, default="digits_cnn",
                       help="digits_cnn: 38k-parameter CNN; digits_mlp: a wide MLP "
                       "(bandwidth-bound); both on scikit-learn's digits, 297 held out")
    train.add_argument("--mlp-hidden", type=int_in(1, 1 << 16), default=1024,
                       help="digits_mlp: hidden width")
    train.add_argument("--label-alpha", type=float_in(0.0, 1e6, lo_open=True), default=None,
                       help="label-skewed shards: each class split among the workers by "
                       "Dirichlet(ALPHA) proportions (small: a few classes per worker; "
                       "none: iid shards)")
    train.add_argument("--batch-size", type=int_in(1, 1 << 16), default=32,
                       help="samples per worker and step")
    train.add_argument("--lr", type=float_in(0.0, 100.0, lo_open=True), default=0.05,
                       help="SGD learning rate")
    train.add_argument("--momentum", type=float_in(0.0, 1.0, hi_open=True), default=0.9,
                       help="SGD momentum (state local to each worker)")
    train.add_argument("--compute-ms", type=float_in(0.0, 1e5), default=20.0,
                       help="emulated accelerator time per step at factor 1 (slept)")
    train.add_argument("--duration", type=float_in(0.0, 1e5, lo_open=True), default=5.0,
                       help="wall seconds each worker trains")
    train.add_argument("--max-steps", type=int_in(1, 10**9), default=10**9,
                       help="steps per worker at most")
    train.add_argument("--stop-at-accuracy", type=float_in(0.0, 1.0, lo_open=True),
                       default=None, help="synchronous modes: stop once the model reaches "
                       "this held-out accuracy (default: run the whole duration)")
    train.add_argument("--target", type=float_in(0.0, 1.0, lo_open=True), default=0.95,
                       help="held-out accuracy whose time to reach is reported")
    train.add_argument("--snapshot-every", type=float_in(0.0, 1e3, lo_open=True),
                       default=0.1, help="seconds between model snapshots (the curve)")
    train.add_argument("--local-sgd-period", type=int_in(1, 10**6), default=8,
                       help="localsgd: steps between world averages")
    train.add_argument("--no-overlap", action="store_true",
                       help="prague: block on each own group instead of computing on")
    train.add_argument("--max-staleness", type=int_in(1, 10**6), default=1,
                       help="prague and adpsgd with overlap: steps a worker may compute "
                       "while its own group (exchange) is in flight before it waits")
    train.add_argument("--slow", type=_rank_value("FACTOR"), action="append", default=[],
                       help="RANK:FACTOR, that rank's compute factor times slower "
                       "(repeatable; default: none)")
    train.add_argument("--transient", type=_transient, default=None,
                       help="PROBABILITY:FACTOR, a step of any rank slowed by FACTOR with "
                       "that probability (default: none)")
    train.add_argument("--slow-link", type=_rank_value("MBPS"), action="append", default=[],
                       help="RANK:MBPS, that rank's sends emulated at MBPS megabytes/s "
                       "(repeatable; default: none)")
    train.add_argument("--timeout", type=float_in(0.0, 1e4, lo_open=True), default=30.0,
                       help="seconds any wait may take before it names whom it waited for")
    train.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0,
                       help="data, initialisation and group draws")
    train.add_argument("--trace", type=output_file, default=None,
                       help="write a Chrome/Perfetto trace of the run here (default: none)")
    train.add_argument("--json", type=output_file, default=None,
                       help="also write the run's figures here (default: none)")
    train.set_defaults(func=_train)

    _add_simulate_parser(sub)


MAX_SIM_WORKERS = 1024
SIM_COMPARE = ("allreduce", "prague", "adpsgd")


def _add_simulate_parser(sub: Any) -> None:
    sim = sub.add_parser("simulate", help="the discrete-event simulator: every mode at one "
                         "size (simulated; the note's cluster unless you set the links)")
    sim.add_argument("--workers", type=int_in(2, MAX_SIM_WORKERS), default=16,
                     help="simulated workers")
    sim.add_argument("--mode", choices=("all", "allreduce", "prague", "adpsgd",
                                        "adpsgd_naive"), default="all",
                     help="all: allreduce, prague and adpsgd side by side")
    add_policy_arguments(sim)
    sim.add_argument("--compute-ms", type=float_in(0.0, 1e6, lo_open=True), default=100.0,
                     help="compute per step at factor 1")
    sim.add_argument("--jitter", type=float_in(0.0, 10.0), default=0.0,
                     help="sigma of a lognormal multiplier of every step (0: none)")
    sim.add_argument("--slow", type=_rank_value("FACTOR"), action="append", default=[],
                     help="RANK:FACTOR, that worker's compute factor times slower "
                     "(repeatable; default: none)")
    sim.add_argument("--model-mb", type=float_in(0.0, 1e6), default=100.0,
                     help="model size, MB (10^6 bytes), averaged by every P-Reduce")
    sim.add_argument("--bandwidth-gbps", type=float_in(0.0, 1e5, lo_open=True),
                     default=10.0, help="link bandwidth per worker, Gbit/s (10 GbE, the "
                     "note's section 6.3 cluster)")
    sim.add_argument("--latency-us", type=float_in(0.0, 1e6), default=50.0,
                     help="alpha, per message step")
    sim.add_argument("--ranks-per-node", type=int_in(1, 1024), default=4,
                     help="workers per node (1: a flat machine)")
    sim.add_argument("--intra-gbps", type=float_in(0.0, 1e5, lo_open=True), default=80.0,
                     help="link bandwidth inside a node, Gbit/s")
    sim.add_argument("--pair-overhead-ms", type=float_in(0.0, 1e5), default=20.0,
                     help="AD-PSGD's per-exchange host overhead (the note's assumption)")
    sim.add_argument("--no-overlap", action="store_true",
                     help="prague and adpsgd block on their own synchronization")
    sim.add_argument("--duration", type=float_in(0.0, 1e6, lo_open=True), default=30.0,
                     help="simulated seconds")
    sim.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0,
                     help="jitter, noise and group draws")
    sim.add_argument("--trace", type=output_file, default=None,
                     help="write the (first) simulated run's Chrome/Perfetto trace here "
                     "(default: none)")
    sim.add_argument("--json", type=output_file, default=None,
                     help="also write the figures here (default: none)")
    sim.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from rich.console import Console
    from rich.table import Table

    from .config import PolicyConfig
    from .simulate import CommCosts, SimConfig, simulate

    require(all(factor >= 1 for _, factor in args.slow), "--slow",
            "RANK:FACTOR with factors >= 1 (a slowdown)")
    rpn = args.ranks_per_node
    require(rpn == 1 or args.workers % rpn == 0 or args.workers < rpn, "--ranks-per-node",
            f"a divisor of --workers ({args.workers}), or more than it")
    try:
        costs = CommCosts(latency_s=args.latency_us * 1e-6,
                          bandwidth_Bps=args.bandwidth_gbps * 1e9 / 8,
                          pair_overhead_s=args.pair_overhead_ms * 1e-3,
                          ranks_per_node=None if rpn == 1 else rpn,
                          intra_bandwidth_Bps=None if rpn == 1 else args.intra_gbps * 1e9 / 8)
        policy = PolicyConfig(name=args.policy, group_size=_group_size(args, args.workers),
                              window_ms=args.window_ms, divisions=args.divisions,
                              division_period=args.division_period,
                              grid_rows=args.grid_rows, seed=args.seed)
        base = SimConfig(mode="allreduce", world_size=args.workers, policy=policy,
                         compute_s=args.compute_ms * 1e-3, compute_jitter=args.jitter,
                         slow=tuple(args.slow), model_bytes=args.model_mb * 1e6, costs=costs,
                         overlap=not args.no_overlap, duration_s=args.duration,
                         seed=args.seed)
        modes = SIM_COMPARE if args.mode == "all" else (args.mode,)
        configs = [replace(base, mode=m) for m in modes]
    except ConfigFieldError as exc:
        field = {"world_size": "workers", "compute_s": "compute_ms",
                 "model_bytes": "model_mb"}.get(exc.field, exc.field)
        raise _config_error(ConfigFieldError(field, exc.allowed)) from None
    console = Console(width=max(Console().width, 120))
    results = []
    with console.status(f"simulating {len(configs)} mode(s) on {args.workers} workers ..."):
        for config in configs:
            results.append(simulate(config))
    table = Table(title=f"{args.workers} workers, {args.compute_ms:g} ms compute, "
                  f"{args.model_mb:g} MB model, {args.bandwidth_gbps:g} Gbit/s links "
                  "(simulated)")
    for col in ("mode", "steps/s", "steps min/max", "time to target (s)", "groups",
                "conflicts", "timeouts", "wait s/worker"):
        table.add_column(col, justify="right")
    for r in results:
        c = r.config
        table.add_row(c.mode + (f" ({c.policy.name})" if c.mode == "prague" else ""),
                      f"{r.throughput:.1f}", f"{min(r.steps)}/{max(r.steps)}",
                      "not reached" if r.time_to_target is None else f"{r.time_to_target:.2f}",
                      str(r.groups_completed), str(r.conflicts), str(r.timeouts),
                      f"{sum(r.wait_s) / c.world_size:.2f}")
    console.print(table)
    if args.trace is not None:
        results[0].write_trace(args.trace)
        console.print(f"wrote {args.trace} (simulated; open in https://ui.perfetto.dev)")
    if args.json is not None:
        payload = [{"mode": r.config.mode, "policy": r.config.policy.name,
                    "kind": "simulated", "throughput": r.throughput, "steps": list(r.steps),
                    "time_to_target": r.time_to_target, "groups": r.groups_completed,
                    "conflicts": r.conflicts, "timeouts": r.timeouts} for r in results]
        atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def _group_size(args: argparse.Namespace, world: int) -> int:
    return min(DEFAULT_GROUP_SIZE, world) if args.group_size is None else args.group_size


def _world_size(ranks: int) -> int:
    import os

    from furnace.runtime.launch import is_torchrun

    if not is_torchrun():
        return ranks
    launched = int(os.environ["WORLD_SIZE"])
    require(ranks in (launched, 4), "--ranks",
            f"must match torchrun's {launched} ranks, got {ranks}")
    return launched


def run_config(args: argparse.Namespace) -> Any:
    """The `RunConfig` of ``decentralized train``'s arguments; a `UsageError` names the
    flag."""
    from .config import HeteroConfig, PolicyConfig, RunConfig

    try:
        prob, factor = args.transient if args.transient is not None else (0.0, 1.0)
        world = _world_size(args.ranks)
        policy = PolicyConfig(name=args.policy, group_size=_group_size(args, world),
                              window_ms=args.window_ms, divisions=args.divisions,
                              division_period=args.division_period,
                              grid_rows=args.grid_rows, seed=args.seed)
        hetero = HeteroConfig(slow=tuple(args.slow), transient_prob=prob,
                              transient_factor=factor,
                              slow_links=tuple((r, mbps * 1e6) for r, mbps in args.slow_link),
                              seed=args.seed)
        return RunConfig(mode=args.mode, world_size=world, policy=policy,
                         backend=args.backend, task=args.task, batch_size=args.batch_size,
                         lr=args.lr, momentum=args.momentum, compute_ms=args.compute_ms,
                         duration_s=args.duration, max_steps=args.max_steps,
                         stop_at_accuracy=args.stop_at_accuracy,
                         snapshot_every_s=args.snapshot_every,
                         local_sgd_period=args.local_sgd_period,
                         overlap=not args.no_overlap, max_staleness=args.max_staleness,
                         hetero=hetero, timeout_s=args.timeout,
                         mlp_hidden=args.mlp_hidden, label_alpha=args.label_alpha,
                         seed=args.seed)
    except ConfigFieldError as exc:
        raise _config_error(exc) from None


def _check_shards(config: Any) -> None:
    """A label skew that leaves a worker (almost) without data is refused here, before
    any rank loads it."""
    if config.label_alpha is None:
        return
    from .tasks import label_skewed_indices, load_digits_split

    labels = load_digits_split(seed=config.seed).train_y
    try:
        label_skewed_indices(labels, config.world_size, config.label_alpha, config.seed)
    except ValueError as exc:
        raise UsageError("--label-alpha", str(exc)) from None


def _train(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .report import print_run
    from .train import train, write_trace

    config = run_config(args)
    _check_shards(config)
    result = train(config, progress=True)
    if result is None:  # a torchrun rank other than 0
        return 0
    console = Console(width=max(Console().width, 120))
    print_run(console, result, target=args.target)
    if args.trace is not None:
        write_trace(result, args.trace)
        console.print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.summary(), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0
