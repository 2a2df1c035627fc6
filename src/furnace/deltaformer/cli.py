"""`furnace deltaformer`: train DeltaFormer (Xu et al., NeurIPS 2025) or its same-size
Transformer on the state-tracking tasks (paper §4.1, App. D) or the byte-level LM, and
benchmark its kernels.

    furnace deltaformer train --task swap --mixer deltaformer --kappa1 linear --steps 1500
    furnace deltaformer bench [--lengths 256 1024]
"""

from __future__ import annotations

import argparse
import sys

from .model import MIXERS
from .naive import KAPPA1_KINDS
from .tasks import TASKS


def _kappa1(text: str) -> str | tuple[str, ...]:
    # "softmax,softmax,linear,linear" gives one kernel per head (the note's "mix" variant)
    names = tuple(part.strip() for part in text.split(","))
    bad = [n for n in names if n not in KAPPA1_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown kappa1 {bad[0]!r}; known: "
                                         f"{', '.join(KAPPA1_KINDS)}")
    return names[0] if len(names) == 1 else names


def add_parser(subparsers) -> None:
    df = subparsers.add_parser("deltaformer", help="DeltaFormer: train on state tracking or "
                               "an LM, benchmark the kernels")
    sub = df.add_subparsers(dest="deltaformer_command", metavar="COMMAND")
    df.set_defaults(func=lambda args: (df.print_help(), 0)[1])

    tr = sub.add_parser("train", help="train one model and print its final metrics")
    tr.add_argument("--task", choices=sorted(TASKS) + ["lm"], default="swap")
    tr.add_argument("--mixer", choices=MIXERS, default="deltaformer")
    tr.add_argument("--kappa1", type=_kappa1, default="linear",
                    help="erase kernel, or comma-separated, one per head")
    tr.add_argument("--layers", type=int, default=1)
    tr.add_argument("--d-model", type=int, default=64)
    tr.add_argument("--heads", type=int, default=4)
    tr.add_argument("--steps", type=int, default=1500)
    tr.add_argument("--batch-size", type=int, default=128)
    tr.add_argument("--lr", type=float, default=3e-3)
    tr.add_argument("--weight-decay", type=float, default=0.01)
    tr.add_argument("--length", type=int, default=16)
    tr.add_argument("--eval-sequences", type=int, default=2000)
    tr.add_argument("--eval-lengths", type=int, nargs="+", default=[], metavar="T",
                    help="also report last-position accuracy at these lengths (length "
                    "generalisation)")
    tr.add_argument("--rotary", action=argparse.BooleanOptionalAction, default=True,
                    help="rotary positions (--no-rotary: none, NoPE)")
    tr.add_argument("--beta", choices=["sigmoid", "2sigmoid"], default="sigmoid",
                    help="beta activation (2sigmoid: beta in (0, 2), can blow up)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: leave the default); one is fastest on a shared "
                    "2-core box")
    tr.add_argument("--checkpoint", help="checkpoint file")
    tr.add_argument("--checkpoint-every", type=int, default=0)
    tr.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    tr.set_defaults(func=_train)

    bench = sub.add_parser("bench", help="naive vs chunk vs SDPA kernel timings")
    bench.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    bench.add_argument("--kappa1", choices=KAPPA1_KINDS, default="softmax")
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--no-memory", action="store_true", help="skip peak-memory children")
    bench.add_argument("--threads", type=int, default=1)
    bench.set_defaults(func=_bench)


def _train(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .train import TrainConfig, train

    if args.resume and not args.checkpoint:
        print("furnace deltaformer train: --resume needs --checkpoint", file=sys.stderr)
        return 2
    try:
        config = TrainConfig(task=args.task, mixer=args.mixer, kappa1=args.kappa1,
                             num_layers=args.layers, d_model=args.d_model,
                             num_heads=args.heads, steps=args.steps, batch_size=args.batch_size,
                             lr=args.lr, weight_decay=args.weight_decay, length=args.length,
                             eval_sequences=args.eval_sequences, seed=args.seed,
                             eval_lengths=tuple(args.eval_lengths), rotary=args.rotary,
                             beta_activation=args.beta,
                             checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
    except ValueError as exc:
        print(f"furnace deltaformer train: {exc}", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console) as progress:
        result = train(config, progress, resume=args.resume)
    if result.diverged_at is not None:
        console.print(f"{config.mixer} on {config.task} diverged: the loss was not finite at "
                      f"step {result.diverged_at}; training stopped (try kappa1 softmax, "
                      "a lower --lr or beta sigmoid)")
        return 1
    console.print(f"{config.mixer} ({result.params:,} params) on {config.task}, T="
                  f"{config.length}: {result.steps_done} steps, final train loss "
                  f"{result.losses[-1]:.4f}, {result.seconds:.1f} s")
    if result.val_loss is not None:
        console.print(f"validation loss {result.val_loss:.4f} nats/byte "
                      f"(perplexity {torch.tensor(result.val_loss).exp().item():.3f})")
    else:
        console.print(f"token accuracy {result.token_acc:.4f}, last-position accuracy "
                      f"{result.last_acc:.4f} on {config.eval_sequences} fresh sequences")
        for length, acc in result.last_acc_at.items():
            console.print(f"last-position accuracy at T={length}: {acc:.4f}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import main

    argv = ["--lengths", *map(str, args.lengths), "--kappa1", args.kappa1, "--repeats",
            str(args.repeats), "--threads", str(args.threads)]
    return main(argv + (["--no-memory"] if args.no_memory else []))
