"""`furnace cp`: UltraAttn's context parallelism (Yang et al., SC'25) from the command line.

``furnace cp plan --mask causal --ranks 4`` plans one attention mask for every scheme (ring,
zigzag and striped ring, all-gather of K/V, needed-KV, Ulysses and the 2-D context tiling of
paper §4) and prints the bytes per rank, the compute balance and the messages of each, and
which plan the planner keeps. These are counts, machine-independent.

``furnace cp bench --mask strided --ranks 4`` runs the schemes side by side on local gloo
ranks over the emulated network (measured wall time, labelled emulated), checks every output
against the dense reference, and prints the median time of each and its ratio to ring.

``furnace cp simulate --mask causal --ranks 64`` projects ring and the hierarchical tiling
to a GPU cluster with the discrete-event simulator (labelled simulated).

``--mask`` is one of the built-in masks or ``MODULE:FUNCTION`` / ``FILE.py:FUNCTION``
naming a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)``. Every mistake exits 2 with one line
before any rank starts or any solve begins.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from furnace.runtime.atomic import atomic_write_text
from furnace.runtime.cliargs import (
    ConfigFieldError,
    UsageError,
    float_in,
    int_in,
    output_file,
    require,
)

# importing this module has imported the package (and torch) already: the names are shared
from .bench import SCHEMES
from .masks import MASK_NAMES

if TYPE_CHECKING:
    from .masks import BlockGrid, MaskMod
    from .plan import AttentionShape

DTYPES = ("float32", "float64", "bfloat16", "float16")
# a plan's grid is evaluated exactly up to this many (q, kv) pairs; beyond it, sampled
EXACT_GRID_ELEMENTS = 1 << 26
MAX_PLAN_RANKS = 1024
MAX_LOCAL_RANKS = 8
PRESETS = ("h100-ib", "h200-ib")
# the shape fields as the flags that set them, so a config error names the user's flag
_FLAG_OF_FIELD = {"batch": "--batch", "num_heads": "--heads", "num_kv_heads": "--kv-heads",
                  "head_dim": "--head-dim", "dtype": "--dtype", "num_blocks": "--num-blocks",
                  "block_size": "--num-blocks", "ranks": "--ranks", "num_ranks": "--ranks",
                  "seq_len": "--seq-len", "time_limit_s": "--time-limit",
                  "granularity": "--granularity"}


def add_parser(subparsers: Any) -> None:
    cp = subparsers.add_parser("cp", help="UltraAttn: context parallelism for block-sparse "
                               "attention (plan, bench, simulate)")
    sub = cp.add_subparsers(dest="cp_command", metavar="COMMAND")
    cp.set_defaults(func=lambda args: (cp.print_help(), 0)[1])

    plan = sub.add_parser("plan", help="bytes per rank, balance and messages of every scheme "
                          "for one mask (counts, machine-independent)")
    # the paper's Llama2-7B attention (32 heads of 128, bf16), as `furnace reproduce` uses
    _add_problem_arguments(plan, ranks_hi=MAX_PLAN_RANKS, seq_len=4096, ranks=4, heads=32,
                           kv_heads=32, head_dim=128, dtype="bfloat16")
    plan.add_argument("--show-tiling", action="store_true",
                      help="also draw the chosen plan's tiling of the block grid (one "
                      "character per block: the rank that computes it)")
    plan.add_argument("--json", type=output_file, default=None,
                      help="also write every scheme's figures here (default: none)")
    plan.set_defaults(func=_plan)

    bench = sub.add_parser("bench", help="the schemes side by side on local gloo ranks over "
                           "the emulated network (measured, checked against the reference)")
    _add_problem_arguments(bench, ranks_hi=MAX_LOCAL_RANKS, seq_len=512, ranks=4, heads=2,
                           kv_heads=2, head_dim=32)
    bench.add_argument("--schemes", default="ring,zigzag_ring,needed_kv,tiled,tiled_2d",
                       type=_scheme_list, help=f"comma-separated, from {', '.join(SCHEMES)} "
                       "(tiled: the planner's choice, which may be a baseline; tiled_2d: "
                       "the best 2-D tiling alone)")
    bench.add_argument("--repeats", type=int_in(3, 1000), default=5,
                       help="timed rounds per scheme (interleaved; medians compared)")
    bench.add_argument("--bandwidth-mbps", type=float_in(0.0, 1e6, lo_open=True),
                       default=100.0, help="emulated link bandwidth per rank, MB/s")
    bench.add_argument("--latency-ms", type=float_in(0.0, 1e3), default=1.0,
                       help="emulated link latency per message, ms")
    bench.add_argument("--no-emulation", action="store_true",
                       help="plain gloo loopback, no emulated network")
    bench.add_argument("--forward-only", action="store_true", help="time the forward only")
    bench.set_defaults(func=_bench)

    sim = sub.add_parser("simulate", help="ring against the hierarchical tiling on a GPU "
                         "cluster (discrete-event simulation, labelled simulated)")
    _add_problem_arguments(sim, ranks_hi=4096, seq_len=524288, ranks=64, heads=32,
                           kv_heads=32, head_dim=128, dtype="bfloat16", num_blocks=128)
    sim.add_argument("--preset", choices=PRESETS, default="h100-ib",
                     help="the cluster (runtime presets: 8 GPUs a node, one 400 Gb/s NIC "
                     "per GPU)")
    sim.add_argument("--ranks-per-node", type=int_in(1, 64), default=8,
                     help="GPUs per node (the first level of the hierarchy)")
    sim.add_argument("--trace", type=output_file, default=None,
                     help="write the tiled plan's simulated timeline as a Chrome/Perfetto "
                     "trace here (default: none)")
    sim.set_defaults(func=_simulate)


def _add_problem_arguments(parser: argparse.ArgumentParser, *, ranks_hi: int, seq_len: int,
                           ranks: int, heads: int, kv_heads: int, head_dim: int,
                           dtype: str = "float32", num_blocks: int | None = 16) -> None:
    parser.add_argument("--mask", default="causal",
                        help=f"one of {', '.join(MASK_NAMES)}, or MODULE:FUNCTION or "
                        "FILE.py:FUNCTION naming a mask_mod(b, h, q_idx, kv_idx) -> bool")
    parser.add_argument("--mask-param", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of a built-in mask, e.g. window=512 (repeatable; "
                        "default: the mask's defaults, proportional to --seq-len)")
    parser.add_argument("--ranks", type=int_in(1, ranks_hi), default=ranks,
                        help="context-parallel ranks")
    parser.add_argument("--seq-len", type=int_in(1, 1 << 26), default=seq_len,
                        help="tokens in the sequence")
    parser.add_argument("--num-blocks", type=int_in(1, 4096), default=num_blocks,
                        help="blocks per side of the attention grid (a multiple of --ranks; "
                        "of 2 x --ranks for zigzag)")
    parser.add_argument("--batch", type=int_in(1, 1 << 16), default=1, help="sequences")
    parser.add_argument("--heads", type=int_in(1, 1024), default=heads, help="query heads")
    parser.add_argument("--kv-heads", type=int_in(1, 1024), default=kv_heads,
                        help="key/value heads (grouped-query when fewer than --heads)")
    parser.add_argument("--head-dim", type=int_in(1, 4096), default=head_dim,
                        help="channels per head")
    parser.add_argument("--dtype", choices=DTYPES, default=dtype, help="element type")
    parser.add_argument("--granularity", choices=("block", "row"), default="block",
                        help="kernel granularity: one kernel per block, or one per row of "
                        "blocks (paper §4.3)")
    parser.add_argument("--time-limit", type=float_in(0.0, 3600.0, lo_open=True),
                        default=1.0, help="seconds for each tiling search (HiGHS ILP with "
                        "its greedy warm-up), per layout")


def _scheme_list(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in SCHEMES]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of {', '.join(SCHEMES)}, got {text!r}")
    return names


def _mask_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        require(bool(sep) and bool(key.strip()), "--mask-param",
                f"KEY=VALUE, e.g. window=512; got {item!r}")
        params[key.strip()] = _parse_value(value.strip())
    return params


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _load_mask_function(spec: str) -> Callable[..., Any]:
    where, _, name = spec.rpartition(":")
    allowed = "MODULE:FUNCTION or FILE.py:FUNCTION naming a mask_mod(b, h, q_idx, kv_idx)"
    require(bool(where) and bool(name), "--mask",
            f"one of {', '.join(MASK_NAMES)}, or {allowed}; got {spec!r}")
    try:
        if where.endswith(".py"):
            path = Path(where)
            require(path.is_file(), "--mask", f"{allowed}; no file {where}")
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError("--mask", f"{allowed}; importing {where} failed: "
                         f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    require(callable(fn), "--mask", f"{allowed}; {where} has no function {name!r}")
    assert fn is not None
    return fn  # type: ignore[no-any-return]


def resolve_mask(args: argparse.Namespace) -> MaskMod:
    """The mask the arguments name, checked to be a FlexAttention mask_mod."""
    from .config import MaskError
    from .masks import check_mask_mod, make_mask

    params = _mask_params(args.mask_param)
    if args.mask in MASK_NAMES:
        try:
            return make_mask(args.mask, args.seq_len, **params)
        except MaskError as exc:
            raise UsageError("--mask-param", f"{args.mask}: {exc}") from None
    require(not params, "--mask-param", "only with a built-in --mask")
    fn = _load_mask_function(args.mask)
    try:
        check_mask_mod(fn, min(args.seq_len, 64))
    except MaskError as exc:
        raise UsageError("--mask", str(exc)) from None
    return fn


def _config_error(exc: ConfigFieldError) -> UsageError:
    return UsageError(_FLAG_OF_FIELD.get(exc.field, f"--{exc.field.replace('_', '-')}"),
                      exc.allowed)


def resolve_problem(args: argparse.Namespace) -> tuple[BlockGrid, AttentionShape]:
    """The block grid and shape the arguments describe; every mistake as a UsageError."""
    from .layout import make_layout
    from .masks import build_block_grid, sampled_block_grid
    from .plan import AttentionShape

    require(args.seq_len >= args.ranks, "--seq-len",
            f"at least --ranks ({args.ranks}) tokens, so that every rank holds some; "
            f"got {args.seq_len}")
    require(args.heads % args.kv_heads == 0, "--kv-heads",
            f"a divisor of --heads ({args.heads}); got {args.kv_heads}")
    num_blocks = args.num_blocks
    require(num_blocks is not None, "--num-blocks", "an integer >= 1")
    require(num_blocks <= args.seq_len, "--num-blocks",
            f"at most --seq-len ({args.seq_len}) blocks; got {num_blocks}")
    block_size = -(-args.seq_len // num_blocks)
    require(-(-args.seq_len // block_size) == num_blocks, "--num-blocks",
            f"a count that cuts {args.seq_len} tokens into equal blocks with a shorter "
            f"last one (blocks of ceil(S/P) tokens); {num_blocks} leaves an empty block")
    require(num_blocks % args.ranks == 0 and num_blocks >= args.ranks, "--num-blocks",
            f"a multiple of --ranks ({args.ranks}); got {num_blocks}")
    mask = resolve_mask(args)
    try:
        shape = AttentionShape(batch=args.batch, num_heads=args.heads,
                               num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                               dtype=args.dtype)
        make_layout("contiguous", num_blocks, args.ranks)
        if args.seq_len * args.seq_len <= EXACT_GRID_ELEMENTS:
            grid = build_block_grid(mask, args.seq_len, block_size)
        else:
            grid = sampled_block_grid(mask, args.seq_len, block_size)
    except ConfigFieldError as exc:
        raise _config_error(exc) from None
    return grid, shape


def _tiling_config(args: argparse.Namespace) -> Any:
    from .context_tiling import TilingConfig

    return TilingConfig(time_limit_s=args.time_limit)


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .compare import compare_schemes, scheme_table, tiling_picture

    grid, shape = resolve_problem(args)
    comparison = compare_schemes(grid, args.ranks, shape, config=_tiling_config(args),
                                 granularity=args.granularity)
    console = Console(width=max(Console().width, 180))
    console.print(scheme_table(comparison, title=f"furnace cp plan: {args.mask} mask, "
                               f"S = {grid.seq_len}, {grid.num_blocks} blocks, on {args.ranks} "
                               "ranks (counts per rank, forward + backward)"))
    console.print(comparison.summary())
    if args.show_tiling:
        console.print(tiling_picture(comparison.chosen), highlight=False)
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(comparison.to_dict(), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .bench import BenchConfig, bench_table, measure_schemes

    grid, shape = resolve_problem(args)
    if "ulysses" in args.schemes:
        require(args.heads % args.ranks == 0 and args.kv_heads % args.ranks == 0,
                "--schemes", f"ulysses only when --ranks ({args.ranks}) divides --heads and "
                "--kv-heads")
    config = BenchConfig(
        mask=args.mask, mask_params=tuple(sorted(_mask_params(args.mask_param).items())),
        seq_len=args.seq_len, num_blocks=grid.num_blocks, num_ranks=args.ranks,
        batch=args.batch, num_heads=args.heads, num_kv_heads=args.kv_heads,
        head_dim=args.head_dim, dtype=args.dtype, schemes=args.schemes,
        repeats=args.repeats, granularity=args.granularity, time_limit_s=args.time_limit,
        bandwidth_Bps=None if args.no_emulation else args.bandwidth_mbps * 1e6,
        latency_s=args.latency_ms * 1e-3, backward=not args.forward_only)
    result = measure_schemes(config)
    console = Console(width=max(Console().width, 120))
    console.print(bench_table(result))
    if not result.all_correct:
        console.print("[red]some scheme's output differs from the dense reference[/red]")
        return 1
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .simulate import simulate_cli

    grid, shape = resolve_problem(args)
    require(args.ranks % args.ranks_per_node == 0 or args.ranks < args.ranks_per_node,
            "--ranks-per-node", f"a divisor of --ranks ({args.ranks})")
    console = Console(width=max(Console().width, 120))
    return simulate_cli(grid, shape, num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                        preset=args.preset, config=_tiling_config(args),
                        trace=args.trace, console=console)
