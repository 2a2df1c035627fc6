"""`furnace deltaformer`: train DeltaFormer (Xu et al., NeurIPS 2025) or its same-size
Transformer on the state-tracking tasks (paper Sec. 4.1, App. D) or the byte-level LM, and
benchmark its kernels (paper Sec. 3.4).

    furnace deltaformer train --task swap --mixer deltaformer --kappa1 linear --steps 1500
    furnace deltaformer train --task parity --num-layers 2 --num-heads 2 --beta-activation 2sigmoid
    furnace deltaformer train --task lm --checkpoint run.pt [--resume | --overwrite]
    furnace deltaformer bench [--lengths 256 1024] [--json bench.json]

Every mistake in the arguments (a number out of range, an impossible combination, an
unwritable output, a missing, corrupt or mismatched checkpoint) is found before any
training and ends with exit status 2 and one line on stderr naming the argument. The
options of `train` that set `TrainConfig` fields are declared from its fields (flag = field
name, default, choices and help from the field).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from furnace.runtime.cliargs import (
    UsageError,
    add_config_arguments,
    checkpoint_usage_error,
    config_from_args,
    float_in,
    int_in,
    nonnegative_int,
    output_file,
    positive_float,
    positive_int,
    require,
)

from . import bench
from .config import TrainConfig
from .naive import KAPPA1_KINDS

# the TrainConfig fields `train` sets, in the order of its --help; the flag of each is the
# field's name (add_config_arguments), which the messages about a checkpoint's config use
MODEL_FIELDS = ("task", "mixer", "kappa1", "num_layers", "d_model", "num_heads", "chunk_size",
                "steps", "batch_size", "lr", "weight_decay", "length", "eval_sequences",
                "eval_lengths", "rotary", "beta_activation", "seed")
CHECKPOINT_FIELDS = ("checkpoint", "checkpoint_every")
FIELD_FLAGS = {name: "--" + name.replace("_", "-") for name in MODEL_FIELDS + CHECKPOINT_FIELDS}
MAX_THREADS = 1024


def _kappa1(text: str) -> str | tuple[str, ...]:
    # "softmax,softmax,linear,linear" gives one kernel per head (the note's "mix" variant)
    names = tuple(part.strip() for part in text.split(","))
    bad = [n for n in names if n not in KAPPA1_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(KAPPA1_KINDS)} or a "
                                         f"comma-separated list of them, got {bad[0]!r}")
    return names[0] if len(names) == 1 else names


def _seed(text: str) -> int:
    # torch seeds are 64-bit; the range is spelled out because int_in would print 9.22e+18
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**63 - 1], got "
                                         f"{text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**63 - 1], got {value}")
    return value


def add_parser(subparsers) -> None:
    df = subparsers.add_parser("deltaformer", help="DeltaFormer: train on state tracking or "
                               "an LM, benchmark the kernels")
    sub = df.add_subparsers(dest="deltaformer_command", metavar="COMMAND")
    df.set_defaults(func=lambda args: (df.print_help(), 0)[1])

    tr = sub.add_parser("train", help="train one model and print its final metrics")
    add_config_arguments(tr, TrainConfig, MODEL_FIELDS, overrides={
        "kappa1": {"type": _kappa1},
        "num_layers": {"type": positive_int},
        "d_model": {"type": positive_int},
        "num_heads": {"type": positive_int},
        "chunk_size": {"type": positive_int},
        "steps": {"type": positive_int},
        "batch_size": {"type": positive_int},
        "lr": {"type": positive_float},
        "weight_decay": {"type": float_in(0.0)},
        "length": {"type": positive_int},
        "eval_sequences": {"type": positive_int},
        "eval_lengths": {"type": positive_int, "metavar": "T"},
        "seed": {"type": _seed},
    })
    tr.add_argument("--threads", type=int_in(0, MAX_THREADS), default=1,
                    help="torch threads (0: leave the default); one is fastest on a shared "
                    "2-core box")
    add_config_arguments(tr, TrainConfig, CHECKPOINT_FIELDS, overrides={
        "checkpoint": {"type": output_file, "metavar": "FILE"},
        "checkpoint_every": {"type": nonnegative_int},
    })
    tr.add_argument("--resume", action="store_true",
                    help="continue the run in --checkpoint (same settings; a larger --steps "
                    "extends it with a second OneCycle cycle)")
    tr.add_argument("--overwrite", action="store_true",
                    help="replace an existing --checkpoint with a new run")
    tr.add_argument("--json", type=output_file, metavar="FILE",
                    help="also write the result (config, curves, metrics) as JSON")
    tr.set_defaults(func=_train)

    be = sub.add_parser("bench", help="naive vs chunk vs SDPA kernel timings")
    bench.add_arguments(be)
    be.set_defaults(func=bench.run)


def _check_train_args(args: argparse.Namespace) -> None:
    """Checks spanning several arguments; each names the argument to change."""
    require(not args.resume or args.checkpoint is not None, "--resume", "needs --checkpoint FILE")
    require(not args.overwrite or args.checkpoint is not None, "--overwrite",
            "needs --checkpoint FILE")
    require(not (args.resume and args.overwrite), "--overwrite",
            "cannot be combined with --resume (resume continues the checkpoint's run, "
            "overwrite replaces it)")
    require(args.checkpoint_every == 0 or args.checkpoint is not None, "--checkpoint-every",
            "needs --checkpoint FILE")
    require(args.json is None or args.checkpoint is None
            or args.json.resolve() != args.checkpoint.resolve(), "--json",
            f"must differ from --checkpoint, got {args.json} for both")
    require(args.d_model % args.num_heads == 0, "--num-heads",
            f"must divide --d-model {args.d_model}, got {args.num_heads}")
    head_width = args.d_model // args.num_heads
    require(not args.rotary or head_width % 2 == 0, "--d-model",
            f"--d-model / --num-heads must be even with rotary positions, got {args.d_model} "
            f"/ {args.num_heads} = {head_width} (change them or pass --no-rotary)")
    require(isinstance(args.kappa1, str) or len(args.kappa1) == args.num_heads, "--kappa1",
            f"must name one kernel or one per head (--num-heads {args.num_heads}), got "
            f"{len(args.kappa1) if not isinstance(args.kappa1, str) else 1}")
    require(not (args.eval_lengths and args.task == "lm"), "--eval-lengths",
            "applies to the tasks, not to --task lm")


def _show(field: str, value: Any) -> str:
    if field == "kappa1" and isinstance(value, (list, tuple)):
        return ",".join(value)
    return str(value)


def _mismatch_error(exc) -> UsageError:
    """The library's mismatch in the CLI's words: flags, checkpoint and given values."""
    from .train import STEPS_RULE

    parts, flags = [], []
    for field, old, new in exc.differences:
        if field == "rotary":
            flag = "--rotary/--no-rotary"
            parts.append(f"{flag} {'on' if old else 'off'} (checkpoint) vs "
                         f"{'on' if new else 'off'} (given)")
        elif field in FIELD_FLAGS:
            flag = FIELD_FLAGS[field]
            parts.append(f"{flag} {_show(field, old)} (checkpoint) vs {_show(field, new)} "
                         "(given)")
        else:  # a TrainConfig field the CLI does not set
            flag = "--checkpoint"
            parts.append(f"config field {field} {old!r} (checkpoint) vs {new!r} (this CLI)")
        flags.append(flag)
    message = (f"the checkpoint {exc.path} was written with other settings: "
               f"{', '.join(parts)}")
    if any(field == "steps" for field, _, _ in exc.differences):
        message += f"; {STEPS_RULE}"
    message += ("; give the checkpoint's values to resume it, or --overwrite without "
                "--resume to start a new run")
    return UsageError(flags[0], message)


def _train(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from furnace.runtime.atomic import OutputError, atomic_write_text
    from furnace.runtime.timing import torch_threads
    from furnace.runtime.training import progress_bar

    from .train import (
        CheckpointError,
        CheckpointMismatchError,
        TrainDataError,
        prepare_checkpoint,
        train,
    )

    _check_train_args(args)
    try:
        config = config_from_args(TrainConfig, args)
    except ValueError as exc:
        # every combination the config refuses is checked above with its flag; this is a
        # last resort that still keeps the one-line contract
        raise UsageError("", f"invalid settings: {exc}") from None
    try:
        state = prepare_checkpoint(config, resume=args.resume, overwrite=args.overwrite)
    except CheckpointMismatchError as exc:
        raise _mismatch_error(exc) from None
    except (CheckpointError, OutputError) as exc:
        raise checkpoint_usage_error(exc) from None

    console = Console()
    if state is not None:
        done, planned = state["step"], state["cycles"][-1]
        console.print(f"resuming {args.checkpoint} at step {done} of {planned}")
        if config.steps > planned:
            console.print(f"extending the run to {config.steps} steps: steps {planned + 1}.."
                          f"{config.steps} follow a second OneCycle cycle (a warm restart), "
                          f"not the schedule of a fresh --steps {config.steps} run")
    threads = torch_threads(args.threads) if args.threads > 0 else contextlib.nullcontext()
    try:
        with threads, Progress(TextColumn("{task.description}"), BarColumn(),
                               TextColumn("{task.completed}/{task.total}"),
                               TimeElapsedColumn(), console=console) as progress:
            bar = progress_bar(progress, total=config.steps,
                               label=f"{config.mixer} {config.task}")
            result = train(config, bar, resume=args.resume, overwrite=args.overwrite)
    except TrainDataError as exc:
        raise UsageError("--length", str(exc)) from None
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result.to_dict(), indent=2) + "\n")
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
