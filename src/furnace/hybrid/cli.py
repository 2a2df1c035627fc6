"""`furnace hybrid`: BaGuaLu's MoDa planner for a Sunway-class machine (issue 13, item 6).

``furnace hybrid plan --params 14.5T --nodes 96000`` calibrates the one GEMM-efficiency
factor on the paper's anchor (14.5T parameters at 1 EFLOPS on about 96,000 nodes, Ma et al.,
PPoPP'22), then searches the MoDa layouts of the requested model and prints the best few
with their memory, FLOPs, traffic per network level and step time. Every figure is
modelled (`furnace.hybrid.planner`), never measured.

``furnace hybrid train --world-size 4 --expert-parallel-size 2 --steps 20 --precision bf16
--checkpoint DIR [--checkpoint-every N] [--resume]`` trains the MoE LM under MoDa on local
gloo ranks (or as the launched ranks under torchrun; `furnace.hybrid.train`). Every mistake
in its arguments, a checkpoint's included, exits 2 with one line before any rank starts.

``furnace hybrid validate`` prints the planner's figures against counts and virtual-clock
times of one emulated MoDa step at 2, 4 and 8 ranks (`furnace.hybrid.validation`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from furnace.runtime.atomic import atomic_write_text
from furnace.runtime.cliargs import UsageError, float_in, int_in, output_file, positive_int

MACHINES = ("sunway",)
# the machine's node count bounds --nodes: a plan for more nodes than exist is a typo
MAX_NODES = 1_000_000


def _param_count(text: str) -> float:
    from .config import parse_param_count

    try:
        return parse_param_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(subparsers: Any) -> None:
    hyb = subparsers.add_parser("hybrid", help="BaGuaLu: MoDa hybrid parallelism (train, "
                                "plan, validate the planner)")
    sub = hyb.add_subparsers(dest="hybrid_command", metavar="COMMAND")
    hyb.set_defaults(func=lambda args: (hyb.print_help(), 0)[1])
    plan = sub.add_parser("plan", help="modelled MoDa layouts of an MoE model on a Sunway-class "
                          "machine, calibrated on the paper's 14.5T at 1 EFLOPS")
    plan.add_argument("--machine", choices=MACHINES, default="sunway",
                      help="the machine preset (sunway: sunway-oceanlight, 6 core groups per "
                      "node, 256-node supernodes, 16:3 oversubscription)")
    plan.add_argument("--params", type=_param_count, default="14.5T",
                      help="total parameters, e.g. 14.5T, 174T, 1.93e12")
    plan.add_argument("--nodes", type=int_in(1, MAX_NODES), default=96_000,
                      help="nodes of the machine to plan for")
    plan.add_argument("--tokens-per-rank", type=positive_int, default=4096,
                      help="tokens per core group and optimizer step")
    plan.add_argument("--injection-gbps", type=float_in(0.0, 1e4, lo_open=True),
                      default=None, help="per-node injection bandwidth in GB/s, which the "
                      "paper does not give (default: the preset's assumed figure)")
    plan.add_argument("--top", type=int_in(1, 20), default=3, help="layouts to show")
    plan.add_argument("--json", type=output_file, default=None,
                      help="also write the plans here (default: none)")
    plan.set_defaults(func=_plan)

    from furnace.runtime.cliargs import add_config_arguments, nonnegative_int

    from .train import MAX_LOCAL_RANKS, HybridTrainConfig

    train = sub.add_parser("train", help="train the MoE LM under MoDa on local gloo ranks or "
                           "under torchrun, with checkpoints and resume")
    add_config_arguments(train, HybridTrainConfig, overrides={
        "world_size": {"type": int_in(1, MAX_LOCAL_RANKS)},
        "checkpoint": {"metavar": "DIR"},
        "checkpoint_every": {"type": nonnegative_int},
        "lr": {"type": float_in(0.0, lo_open=True)},
        "seed": {"type": int_in(0, 2**63 - 1)},
        **{name: {"type": positive_int} for name in (
            "d_model", "num_layers", "num_heads", "num_experts", "top_k", "d_hidden",
            "seq_len", "expert_parallel_size", "ranks_per_node", "nodes_per_supernode",
            "batch_size", "steps", "corpus_bytes")},
    })
    train.set_defaults(func=_train)

    validate = sub.add_parser("validate", help="the planner against one emulated MoDa step "
                              "at 2, 4 and 8 gloo ranks (virtual clock); exits 1 if a "
                              "quantity is outside its tolerance")
    validate.set_defaults(func=_validate)


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .planner import (
        PAPER_EFLOPS,
        PAPER_NODES,
        PAPER_PARAMS,
        CalibrationError,
        calibrate,
        default_topology,
        search_layouts,
        spec_for_machine,
    )

    params = args.params if isinstance(args.params, float) else _param_count(args.params)
    bandwidth = None if args.injection_gbps is None else args.injection_gbps * 1e9
    topology = default_topology(bandwidth)
    try:
        anchor = spec_for_machine(PAPER_PARAMS, PAPER_NODES, topology,
                                  tokens_per_rank=args.tokens_per_rank)
        cal = calibrate(anchor, PAPER_NODES * topology.ranks_per_node, topology)
    except CalibrationError as exc:
        raise UsageError("--tokens-per-rank", f"leaves no efficiency that reaches the paper's "
                         f"1 EFLOPS on its anchor: {exc}") from None
    spec = spec_for_machine(params, args.nodes, topology, tokens_per_rank=args.tokens_per_rank)
    world = args.nodes * topology.ranks_per_node
    found = search_layouts(spec, world, topology, efficiency=cal.efficiency, top=args.top)

    # eleven columns: narrower than this, rich would truncate the figures themselves
    console = Console(width=max(Console().width, 132))
    console.print(f"{spec.total_params / 1e12:.3g}T parameters ({spec.num_layers} layers, "
                  f"width {spec.d_model}, {spec.num_experts} experts per layer, top-{spec.top_k})"
                  f" on {args.nodes:,} nodes ({world:,} core groups) of {topology.name}; "
                  f"all figures modelled")
    console.print(f"GEMM efficiency {cal.efficiency:.3f} of bf16 peak, calibrated on "
                  f"{PAPER_PARAMS} at {PAPER_EFLOPS:g} EFLOPS on {PAPER_NODES:,} nodes (paper)")
    if args.json is not None:
        record = {"label": "modelled", "efficiency": cal.efficiency,
                  "feasible": [p.to_dict() for p in found.feasible],
                  "infeasible": [p.to_dict() for p in found.infeasible],
                  "reason": found.reason}
        atomic_write_text(args.json, json.dumps(record, indent=2) + "\n")
    if not found.ok:
        console.print(f"no layout fits: {found.reason}")
        return 1
    table = Table(title="MoDa layouts, fastest first (modelled)")
    for column in ("ep", "copies", "shard", "recomp", "GB per CG", "EFLOP/step",
                   "a2a GB in/out SN", "sync GB", "step s", "EFLOPS", "binding"):
        table.add_column(column, no_wrap=column != "binding")
    for p in found.feasible:
        inside = sum(v for k, v in p.a2a_bytes.items() if k != "inter_group")
        across = p.a2a_bytes.get("inter_group", 0.0)
        table.add_row(str(p.layout.ep_size), str(p.layout.dp_size),
                      "yes" if p.layout.shard_states else "no",
                      "yes" if p.layout.recompute else "no",
                      f"{p.memory.total / 1e9:.2f}/{p.memory.capacity / 1e9:.0f}",
                      f"{p.flops_total / 1e18:.4g}", f"{inside / 1e9:.2f} / {across / 1e9:.2f}",
                      f"{sum(p.sync_bytes.values()) / 1e9:.1f}", f"{p.step_s:.1f}",
                      f"{p.achieved_flops / 1e18:.3f}", p.binding)
    console.print(table)
    return 0


def _train(args: argparse.Namespace) -> int:
    from furnace.runtime.atomic import OutputError
    from furnace.runtime.cliargs import checkpoint_usage_error, config_from_args
    from furnace.runtime.training import (
        CheckpointError,
        CheckpointMismatchError,
    )

    from .train import HybridTrainConfig, HybridTrainConfigError, train_hybrid

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    try:
        config = config_from_args(HybridTrainConfig, args)
        result = train_hybrid(config)
    except HybridTrainConfigError as exc:
        raise UsageError(flag(exc.field), exc.allowed) from None
    except CheckpointMismatchError as exc:
        listed = ", ".join(f"{flag(name)} {old!r} (checkpoint) vs {new!r} (given)"
                           for name, old, new in exc.differences)
        raise UsageError(flag(exc.differences[0][0]), f"the checkpoint {exc.path} was "
                         f"written by another run: {listed}; give its values to resume it "
                         "or --overwrite without --resume to start over") from None
    except (CheckpointError, OutputError) as exc:
        raise checkpoint_usage_error(exc) from None
    if result.rank != 0:  # under torchrun every rank returns here; rank 0 reports
        return 0 if result.diverged_at is None else 1
    if result.diverged_at is not None:
        print(f"diverged: the loss was not finite at step {result.diverged_at}")
        return 1
    skipped = (f", {len(result.skipped_steps)} fp16 steps skipped"
               if config.precision == "fp16" else "")
    print(f"MoDa W={result.world_size} P={result.expert_parallel_size} {result.precision}: "
          f"{result.steps_done} steps, final loss {result.losses[-1]:.4f} (global batch)"
          f"{skipped}, {result.seconds:.1f} s")
    if config.checkpoint is not None:
        print(f"checkpoint: {config.checkpoint} (step {result.steps_done})")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .validation import PlannerValidationError, assert_validated, format_rows, validate_planner

    rows = validate_planner()
    print(format_rows(rows))
    try:
        assert_validated(rows)
    except PlannerValidationError as exc:
        print(exc)
        return 1
    return 0
