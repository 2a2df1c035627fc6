"""Side-by-side CPU benchmark of the DeltaFormer kernels (Xu, Ao, He, Lu, Shi, Zhong, NeurIPS
2025): the literal token loop of Sec. 3.2 (`deltaformer_naive`), the chunk-wise u-stage of
Sec. 3.4 / App. E (`deltaformer_chunk`), and plain causal softmax attention (SDPA) as the
Transformer it extends.

For each sequence length T all three run on the same float32 [B, T, H, D] inputs with
``requires_grad``. Forward time is measured with autograd recording (as in training);
forward+backward includes ``backward`` of a fixed random output gradient. Each time is the
median of ``repeats`` calls after one warm-up call (`furnace.runtime.timing.time_call`).
Peak memory of one forward+backward is the resident-set high-water mark of a spawned child
(`furnace.runtime.timing.measure_in_subprocess`, with the parent's thread count), so it
includes what BLAS and LAPACK allocate, the inputs and their gradients (a few MiB at most),
and the first call's one-time cost of faulting in torch's code and workspaces: a floor of
about 40 MiB (SDPA) to 47 MiB (chunk) that a T = 16 call already shows. Compare peaks across
T or against that floor, not as absolute sizes of the kernel's working set.

Ratios are of times measured in the same run, side by side, never against stored numbers.
Run ``python -m furnace.deltaformer.bench --lengths 256 1024``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

from furnace.runtime.atomic import OutputError, atomic_write_text
from furnace.runtime.cliargs import (
    Parser,
    UsageError,
    int_in,
    nonnegative_int,
    output_file,
    positive_int,
)
from furnace.runtime.timing import measure_in_subprocess, time_call, torch_threads

from .chunk import deltaformer_chunk
from .naive import KAPPA1_KINDS, deltaformer_naive

IMPLS = ("naive", "chunk", "sdpa")
# max |chunk - naive| / max(max |naive|, max |v|) in float32: the chunked path reorders the
# sums of the loop, ~1e-6 at T = 1024 here; 1e-4 leaves room for other BLAS and thread counts
AGREEMENT_TOLERANCE = 1e-4


def make_inputs(
    batch: int, seq_len: int, heads: int, dim: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """float32 q, k, v, w [B, T, H, D], beta in (0, 1) [B, T, H] and an output gradient,
    all leaves with requires_grad except the output gradient."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    shape = (batch, seq_len, heads, dim)
    tensors = {name: randn(*shape) for name in ("q", "k", "v", "w")}
    tensors["beta"] = torch.sigmoid(randn(batch, seq_len, heads))
    for tensor in tensors.values():
        tensor.requires_grad_(True)
    tensors["grad_out"] = randn(*shape)
    return tensors


def _forward(impl: str, x: dict[str, torch.Tensor], kappa1: str, chunk_size: int):
    if impl == "naive":
        return deltaformer_naive(x["q"], x["k"], x["v"], x["w"], x["beta"], kappa1=kappa1)
    if impl == "chunk":
        return deltaformer_chunk(
            x["q"], x["k"], x["v"], x["w"], x["beta"], kappa1=kappa1, chunk_size=chunk_size
        )
    if impl == "sdpa":
        q, k, v = (x[name].transpose(1, 2) for name in ("q", "k", "v"))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _forward_backward(impl: str, x: dict[str, torch.Tensor], kappa1: str, chunk_size: int):
    for name in ("q", "k", "v", "w", "beta"):
        x[name].grad = None
    out = _forward(impl, x, kappa1, chunk_size)
    out.backward(x["grad_out"])
    return out


def agreement_error(reference: torch.Tensor, actual: torch.Tensor, v: torch.Tensor) -> float:
    """max |actual - reference| / max(max |reference|, max |v|).

    The output is a softmax-weighted sum of the u_i, which are built from the values v, so
    max |v| is the scale rounding is relative to. It is also the floor: a reference that is
    exactly zero (zero values) would otherwise turn ~1e-8 of rounding into an error of 1e22.
    """
    scale = max(reference.detach().abs().max().item(), v.detach().abs().max().item())
    if not scale > 0:
        return 0.0 if torch.equal(reference, actual) else math.inf
    return (actual.detach() - reference.detach()).abs().max().item() / scale


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    return time_call(call, repeats=repeats, warmup=1).median


def peak_worker(
    impl: str,
    batch: int,
    seq_len: int,
    heads: int,
    dim: int,
    kappa1: str,
    chunk_size: int,
    threads: int,
) -> None:
    """One forward+backward of ``impl`` with ``threads`` torch threads (restored after), as
    run in a measuring child (module level so it pickles)."""
    with torch_threads(threads):
        x = make_inputs(batch, seq_len, heads, dim)
        _forward_backward(impl, x, kappa1, chunk_size)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


def bench_kernels(
    lengths: Sequence[int] = (128, 256, 512, 1024),
    *,
    batch: int = 1,
    heads: int = 4,
    dim: int = 64,
    chunk_size: int = 64,
    kappa1: str = "softmax",
    repeats: int = 3,
    include_naive_up_to: int = 1024,
    measure_memory: bool = True,
) -> list[dict]:
    """Time naive, chunk and SDPA side by side for each T; return one dict per T.

    Keys: ``T``; ``fwd_ms_<impl>`` and ``fwdbwd_ms_<impl>`` (median milliseconds);
    ``peak_mib_<impl>`` (forward+backward, None when ``measure_memory`` is False);
    ``naive_over_chunk`` and ``chunk_over_sdpa`` (forward+backward time ratios) and their
    forward-only versions ``fwd_naive_over_chunk``, ``fwd_chunk_over_sdpa``;
    ``max_rel_err_chunk_vs_naive`` (`agreement_error`). Naive entries are None for
    T > ``include_naive_up_to``.

    Raises:
        RuntimeError: chunk's output differs from naive's by more than `AGREEMENT_TOLERANCE`.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    threads = torch.get_num_threads()
    rows = []
    for seq_len in lengths:
        impls = [i for i in IMPLS if i != "naive" or seq_len <= include_naive_up_to]
        x = make_inputs(batch, seq_len, heads, dim)
        row: dict = {"T": seq_len}
        for impl in IMPLS:
            for key in ("fwd_ms", "fwdbwd_ms", "peak_mib"):
                row[f"{key}_{impl}"] = None
        row["max_rel_err_chunk_vs_naive"] = None
        if "naive" in impls:
            with torch.no_grad():
                ref = _forward("naive", x, kappa1, chunk_size)
                got = _forward("chunk", x, kappa1, chunk_size)
            err = agreement_error(ref, got, x["v"])
            row["max_rel_err_chunk_vs_naive"] = err
            if not err <= AGREEMENT_TOLERANCE:
                raise RuntimeError(
                    f"chunk and naive disagree at T={seq_len}: max relative error {err:.3g}"
                )
        for impl in impls:
            with torch.enable_grad():
                fwd = _median_seconds(partial(_forward, impl, x, kappa1, chunk_size), repeats)
                both = _median_seconds(
                    partial(_forward_backward, impl, x, kappa1, chunk_size), repeats
                )
            row[f"fwd_ms_{impl}"] = fwd * 1e3
            row[f"fwdbwd_ms_{impl}"] = both * 1e3
            if measure_memory:
                measured = measure_in_subprocess(
                    peak_worker, impl, batch, seq_len, heads, dim, kappa1, chunk_size, threads
                )
                row[f"peak_mib_{impl}"] = measured.peak_bytes / 2**20
        row["naive_over_chunk"] = _ratio(row["fwdbwd_ms_naive"], row["fwdbwd_ms_chunk"])
        row["chunk_over_sdpa"] = _ratio(row["fwdbwd_ms_chunk"], row["fwdbwd_ms_sdpa"])
        row["fwd_naive_over_chunk"] = _ratio(row["fwd_ms_naive"], row["fwd_ms_chunk"])
        row["fwd_chunk_over_sdpa"] = _ratio(row["fwd_ms_chunk"], row["fwd_ms_sdpa"])
        rows.append(row)
    return rows


COLUMNS = (
    ("T", "T", "{}"),
    ("fwd_ms_naive", "naive fwd ms", "{:.1f}"),
    ("fwd_ms_chunk", "chunk fwd ms", "{:.2f}"),
    ("fwd_ms_sdpa", "sdpa fwd ms", "{:.2f}"),
    ("fwdbwd_ms_naive", "naive f+b ms", "{:.1f}"),
    ("fwdbwd_ms_chunk", "chunk f+b ms", "{:.2f}"),
    ("fwdbwd_ms_sdpa", "sdpa f+b ms", "{:.2f}"),
    ("naive_over_chunk", "naive/chunk f+b", "{:.1f}x"),
    ("chunk_over_sdpa", "chunk/sdpa f+b", "{:.2f}x"),
    ("peak_mib_naive", "naive MiB", "{:.1f}"),
    ("peak_mib_chunk", "chunk MiB", "{:.1f}"),
    ("peak_mib_sdpa", "sdpa MiB", "{:.1f}"),
    ("max_rel_err_chunk_vs_naive", "chunk-naive rel err", "{:.1e}"),
)


def format_rows(rows: list[dict]) -> list[list[str]]:
    """The rows as strings in `COLUMNS` order; missing values print as '-'."""
    return [
        [("-" if row.get(key) is None else fmt.format(row[key])) for key, _, fmt in COLUMNS]
        for row in rows
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, shared by ``furnace deltaformer bench`` and ``python -m``."""
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 256, 512, 1024],
                        metavar="T", help="sequence lengths")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size B")
    parser.add_argument("--heads", type=positive_int, default=4, help="heads H")
    parser.add_argument("--dim", type=positive_int, default=64, help="head width D")
    parser.add_argument("--chunk-size", type=positive_int, default=64,
                        help="rows per triangular solve of the chunked path")
    parser.add_argument("--kappa1", choices=KAPPA1_KINDS, default="softmax",
                        help="erase kernel")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="timed calls per figure (the median is reported)")
    parser.add_argument("--include-naive-up-to", type=nonnegative_int, default=1024,
                        metavar="T", help="skip the naive loop above this length")
    parser.add_argument("--no-memory", action="store_true", help="skip peak-memory children")
    parser.add_argument("--threads", type=int_in(0, 1024), default=1,
                        help="torch threads (0: leave the default)")
    parser.add_argument("--json", type=output_file, metavar="FILE",
                        help="also write the rows as JSON")


def run(args: argparse.Namespace) -> int:
    """Run `bench_kernels` with parsed arguments, print a rich table, write ``--json``."""
    threads = torch_threads(args.threads) if args.threads > 0 else contextlib.nullcontext()
    with threads:
        used_threads = torch.get_num_threads()
        rows = bench_kernels(
            args.lengths,
            batch=args.batch,
            heads=args.heads,
            dim=args.dim,
            chunk_size=args.chunk_size,
            kappa1=args.kappa1,
            repeats=args.repeats,
            include_naive_up_to=args.include_naive_up_to,
            measure_memory=not args.no_memory,
        )
    if args.json is not None:
        settings = {key: getattr(args, key) for key in (
            "batch", "heads", "dim", "chunk_size", "kappa1", "repeats", "include_naive_up_to")}
        payload = {"settings": {**settings, "threads": used_threads}, "rows": rows}
        atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=(
            f"DeltaFormer kernels, B={args.batch} H={args.heads} D={args.dim} "
            f"C={args.chunk_size} kappa1={args.kappa1}, {used_threads} thread(s), "
            f"median of {args.repeats}"
        )
    )
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for cells in format_rows(rows):
        table.add_row(*cells)
    # piped output gets rich's 80 columns, which truncates every number of this wide table
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `run` with one-line errors (exit 2) like ``furnace deltaformer bench``."""
    parser = Parser(
        prog="python -m furnace.deltaformer.bench",
        description="DeltaFormer naive vs chunk vs causal SDPA, forward and forward+backward.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (UsageError, OutputError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
