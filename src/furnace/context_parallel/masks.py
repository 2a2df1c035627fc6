"""Attention masks and their block grids for UltraAttn's context parallelism (Yang et al.,
SC'25; design note §2.1 workload model, §3 the paper's masks, §6.1 item 1).

A mask is a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = attend). The
factories build the patterns the paper evaluates (causal, full, strided, global+local, star,
streaming) and the ones it leaves out (sliding window, documents packed by ``cu_seqlens``,
random block-sparse). Each works two ways: broadcast over index tensors
(`evaluate_mask`) and element by element under ``torch.vmap`` (what
``create_block_mask`` and FlexAttention do), so one function serves our kernels, the dense
reference and FlexAttention alike.

A `BlockGrid` is the §2.1 workload: the sequence is cut into ``num_blocks`` blocks of
``block_size`` tokens (the last may be shorter), and each (query block, kv block) pair is
EMPTY, PARTIAL or FULL with the exact number of allowed elements as its compute weight. The
paper weighs a diagonal block 0.5; we count elements, which is what the kernels do.
Batch- or head-dependent masks are folded by union: a block is skipped only if it is empty
for every (batch, head), and run without a mask only if it is full for every one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from .config import LayoutError, MaskError

__all__ = [
    "DOCUMENT_PROPORTIONS",
    "EMPTY",
    "FULL",
    "MASK_DEFAULTS",
    "MASK_NAMES",
    "PARTIAL",
    "BlockGrid",
    "MaskMod",
    "build_block_grid",
    "causal_mask",
    "check_mask_mod",
    "document_mask",
    "evaluate_mask",
    "full_mask",
    "global_local_mask",
    "grid_from_block_mask",
    "make_mask",
    "random_block_mask",
    "sampled_block_grid",
    "sliding_window_mask",
    "star_mask",
    "streaming_mask",
    "strided_mask",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

EMPTY = 0
PARTIAL = 1
FULL = 2

_SIGNATURE = "a function mask_mod(b, h, q_idx, kv_idx) -> bool tensor"


# --------------------------------------------------------------------------- evaluation


def evaluate_mask(mask_mod: MaskMod, q_idx: Tensor, kv_idx: Tensor, *, batch: int = 1,
                  heads: int = 1) -> Tensor:
    """The mask as a bool tensor ``(batch, heads, len(q_idx), len(kv_idx))``.

    ``q_idx`` and ``kv_idx`` are 1-D global token ids (any order, any subset). The mask_mod
    sees ``b`` (B,1,1,1), ``h`` (1,H,1,1), ``q_idx`` (1,1,Lq,1), ``kv_idx`` (1,1,1,Lk), all
    int64 on ``q_idx``'s device. Raises MaskError if the result is not a bool tensor that
    broadcasts to that shape.
    """
    device = q_idx.device
    b = torch.arange(batch, device=device, dtype=torch.int64).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device, dtype=torch.int64).view(1, heads, 1, 1)
    q = q_idx.to(torch.int64).reshape(1, 1, -1, 1)
    kv = kv_idx.to(device=device, dtype=torch.int64).reshape(1, 1, 1, -1)
    target = (batch, heads, q.shape[2], kv.shape[3])
    result = mask_mod(b, h, q, kv)
    if not isinstance(result, Tensor) or result.dtype != torch.bool:
        kind = result.dtype if isinstance(result, Tensor) else type(result).__name__
        raise MaskError("mask", f"{_SIGNATURE}; {_name_of(mask_mod)} returned {kind}")
    shape = tuple(result.shape)
    if len(shape) > 4 or any(n not in (1, t) for n, t in zip(shape[::-1], target[::-1])):
        raise MaskError("mask", f"{_SIGNATURE} broadcastable to (batch, heads, Lq, Lk) = "
                                f"{target}; {_name_of(mask_mod)} returned shape "
                                f"{shape}")
    return result.expand(target)


def check_mask_mod(mask_mod: object, seq_len: int) -> None:
    """Raise MaskError unless ``mask_mod`` takes 4 positional arguments and gives a bool
    tensor of the right shape on a trial evaluation over ``seq_len`` tokens."""
    if not callable(mask_mod):
        raise MaskError("mask", f"{_SIGNATURE}; got {type(mask_mod).__name__}")
    try:
        signature = inspect.signature(mask_mod)
    except (TypeError, ValueError):
        signature = None  # builtins and some C callables have none; the trial call decides
    if signature is not None:
        try:
            signature.bind(0, 0, 0, 0)
        except TypeError:
            raise MaskError("mask", f"{_SIGNATURE}; {_name_of(mask_mod)} has signature "
                                    f"{signature}") from None
    # the ends and the middle of the sequence: where off-by-one and table-size bugs show
    ids = torch.tensor(sorted({0, 1, seq_len // 2, seq_len - 2, seq_len - 1}), dtype=torch.int64)
    ids = ids[(ids >= 0) & (ids < seq_len)]
    try:
        evaluate_mask(cast(MaskMod, mask_mod), ids, ids)
    except MaskError:
        raise
    except Exception as error:  # any failure of user code is the mask's fault, not ours
        raise MaskError("mask", f"{_SIGNATURE}; calling {_name_of(mask_mod)} raised "
                                f"{type(error).__name__}: {error}") from error


def _name_of(fn: object) -> str:
    return str(getattr(fn, "__name__", repr(fn)))


def _named(fn: MaskMod, name: str) -> MaskMod:
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


# ---------------------------------------------------------------------------- factories


def _require_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise MaskError(name, f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _require_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise MaskError(name, f"must be True or False, got {value!r}")
    return value


def causal_mask() -> MaskMod:
    """Causal: a token attends to itself and everything before it."""

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx >= kv_idx

    return _named(mask, "causal")


def full_mask() -> MaskMod:
    """No mask: every token attends to every token."""

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= 0) & (kv_idx >= 0)

    return _named(mask, "full")


def sliding_window_mask(window: int) -> MaskMod:
    """Causal sliding window: ``0 <= q - kv < window``."""
    window = _require_int("window", window, 1)

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < window)

    return _named(mask, f"sliding_window({window})")


def strided_mask(granule: int, stride: int, local: int = 1) -> MaskMod:
    """Sparse-Transformer-style strided pattern at granule level (the paper's "stride"):
    causal, and with ``gq = q // granule``, ``gk = kv // granule`` either the granule
    distance is a multiple of ``stride`` or it is below ``local``."""
    granule = _require_int("granule", granule, 1)
    stride = _require_int("stride", stride, 1)
    local = _require_int("local", local, 0)

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        distance = q_idx // granule - kv_idx // granule
        return (kv_idx <= q_idx) & ((distance % stride == 0) | (distance < local))

    return _named(mask, f"strided({granule},{stride},{local})")


def global_local_mask(num_global: int, window: int) -> MaskMod:
    """BigBird/Longformer-style global + local, causal: the first ``num_global`` tokens are
    seen by all, and each token sees the ``window`` tokens ending at itself."""
    num_global = _require_int("num_global", num_global, 0)
    window = _require_int("window", window, 1)

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & ((kv_idx < num_global) | (q_idx - kv_idx < window))

    return _named(mask, f"global_local({num_global},{window})")


def star_mask(anchor: int, chunk: int) -> MaskMod:
    """StarAttention prefill, causal: every token sees the anchor (the first ``anchor``
    tokens) and the tokens of its own ``chunk``-sized context block."""
    anchor = _require_int("anchor", anchor, 0)
    chunk = _require_int("chunk", chunk, 1)

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & ((kv_idx < anchor) | (q_idx // chunk == kv_idx // chunk))

    return _named(mask, f"star({anchor},{chunk})")


def streaming_mask(num_sink: int, window: int) -> MaskMod:
    """StreamingLLM, causal: attention sinks (the first ``num_sink`` tokens) plus a window
    of the last ``window`` tokens."""
    num_sink = _require_int("num_sink", num_sink, 0)
    window = _require_int("window", window, 1)

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & ((kv_idx < num_sink) | (q_idx - kv_idx < window))

    return _named(mask, f"streaming({num_sink},{window})")


def _cu_seqlens(cu_seqlens: Tensor | Sequence[int]) -> list[int]:
    allowed = "a 1-D sequence of integers starting at 0 and strictly increasing"
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or \
                cu_seqlens.dtype == torch.bool:
            raise MaskError("cu_seqlens", f"{allowed}, got a tensor of shape "
                                          f"{tuple(cu_seqlens.shape)} and {cu_seqlens.dtype}")
        values: list[object] = [int(v) for v in cu_seqlens.tolist()]
    else:
        values = list(cu_seqlens)
    ints = [int(v) for v in values
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    if len(values) < 2 or len(ints) != len(values):
        raise MaskError("cu_seqlens", f"{allowed} with at least 2 entries, got {values!r}")
    if ints[0] != 0 or any(a >= b for a, b in zip(ints, ints[1:])):
        raise MaskError("cu_seqlens", f"{allowed}, got {ints}")
    return ints


def document_mask(cu_seqlens: Tensor | Sequence[int], causal: bool = True) -> MaskMod:
    """Packed documents (varlen): tokens attend within their own document, causally if
    ``causal``. Document ``i`` holds tokens ``[cu_seqlens[i], cu_seqlens[i+1])``; tokens at
    or past ``cu_seqlens[-1]`` (padding) attend nothing, so their rows are fully masked."""
    bounds = _cu_seqlens(cu_seqlens)
    causal = _require_bool("causal", causal)
    end = bounds[-1]
    doc_of = torch.empty(end + 1, dtype=torch.int64)
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        doc_of[lo:hi] = i
    doc_of[end] = -1  # every position at or past the end clamps here: no document

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        table = doc_of.to(q_idx.device)
        doc_q = table[q_idx.clamp(0, end)]
        same = (doc_q == table[kv_idx.clamp(0, end)]) & (doc_q >= 0)
        return same & (kv_idx <= q_idx) if causal else same

    kind = "causal" if causal else "bidirectional"
    return _named(mask, f"document({len(bounds) - 1} docs,{kind})")


def random_block_mask(seq_len: int, granule: int, density: float, seed: int,
                      causal: bool = True, keep_diagonal: bool = True) -> MaskMod:
    """Random block-sparse: each (query granule, kv granule) pair is kept with probability
    ``density``, drawn from ``torch.Generator().manual_seed(seed)`` (the same on every
    rank); ``causal`` also masks kv > q, ``keep_diagonal`` keeps every diagonal granule so
    no row is left empty. Tokens at or past ``seq_len`` attend nothing."""
    seq_len = _require_int("seq_len", seq_len, 1)
    granule = _require_int("granule", granule, 1)
    if isinstance(density, bool) or not isinstance(density, (int, float)) or \
            not 0.0 <= density <= 1.0:
        raise MaskError("density", f"must be a number in [0, 1], got {density!r}")
    seed = _require_int("seed", seed, 0)
    causal = _require_bool("causal", causal)
    keep_diagonal = _require_bool("keep_diagonal", keep_diagonal)
    num_granules = math.ceil(seq_len / granule)
    generator = torch.Generator().manual_seed(seed)
    table = torch.rand(num_granules, num_granules, generator=generator) < density
    if keep_diagonal:
        table |= torch.eye(num_granules, dtype=torch.bool)
    last = num_granules - 1

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        kept = table.to(q_idx.device)[(q_idx // granule).clamp(0, last),
                                      (kv_idx // granule).clamp(0, last)]
        kept = kept & (q_idx < seq_len) & (kv_idx < seq_len)
        return kept & (kv_idx <= q_idx) if causal else kept

    return _named(mask, f"random({granule},{density:g},seed={seed})")


# ------------------------------------------------------------------- names and defaults

MASK_NAMES = ("causal", "full", "sliding_window", "strided", "global_local", "star",
              "streaming", "document", "random")

# document lengths in parts of the sum (16ths of the sequence): a realistic packing of
# several short documents and one long one; part C2 may retune it
DOCUMENT_PROPORTIONS = (3, 1, 2, 1, 1, 4, 2, 2)


def _granule(seq_len: int) -> int:
    return max(1, seq_len // 16)


def _document_cu_seqlens(seq_len: int) -> tuple[int, ...]:
    # floors of the cumulative boundaries, so rounding never accumulates and the last
    # document absorbs it; documents that round to nothing on tiny sequences are dropped
    total = sum(DOCUMENT_PROPORTIONS)
    bounds = [0]
    running = 0
    for share in DOCUMENT_PROPORTIONS[:-1]:
        running += share
        bound = running * seq_len // total
        if bounds[-1] < bound < seq_len:
            bounds.append(bound)
    bounds.append(seq_len)
    return tuple(bounds)


MASK_DEFAULTS: dict[str, Callable[[int], dict[str, Any]]] = {
    "causal": lambda s: {},
    "full": lambda s: {},
    "sliding_window": lambda s: {"window": max(1, s // 8)},
    # "stride(1/16,4,3)": granules of S/16, every 4th granule back, plus the local ones
    "strided": lambda s: {"granule": _granule(s), "stride": 4, "local": 2},
    # "(1/16,1,1)": one granule of global tokens and a one-granule local window
    "global_local": lambda s: {"num_global": _granule(s), "window": _granule(s)},
    # "star 1/4": anchor of S/8, context chunks of S/4
    "star": lambda s: {"anchor": max(1, s // 8), "chunk": max(1, s // 4)},
    # "(1/8,3)": a sink of S/8 and a window of three S/8 units
    "streaming": lambda s: {"num_sink": max(1, s // 8), "window": max(1, 3 * (s // 8))},
    "document": lambda s: {"cu_seqlens": _document_cu_seqlens(s), "causal": True},
    "random": lambda s: {"granule": _granule(s), "density": 0.3, "seed": 0, "causal": True,
                         "keep_diagonal": True},
}

_FACTORIES: dict[str, Callable[..., MaskMod]] = {
    "causal": causal_mask,
    "full": full_mask,
    "sliding_window": sliding_window_mask,
    "strided": strided_mask,
    "global_local": global_local_mask,
    "star": star_mask,
    "streaming": streaming_mask,
    "document": document_mask,
    "random": random_block_mask,
}


def make_mask(name: str, seq_len: int, **params: Any) -> MaskMod:
    """The mask called ``name`` (one of MASK_NAMES) for ``seq_len`` tokens, with the
    paper-proportional defaults of MASK_DEFAULTS overridden by ``params``."""
    if name not in _FACTORIES:
        raise MaskError("mask", f"must be one of {', '.join(MASK_NAMES)}, got {name!r}")
    seq_len = _require_int("seq_len", seq_len, 1)
    defaults = MASK_DEFAULTS[name](seq_len)
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        known = ", ".join(defaults) if defaults else "none"
        raise MaskError(unknown[0], f"is not a parameter of the {name} mask (parameters: "
                                    f"{known})")
    arguments: Mapping[str, Any] = {**defaults, **params}
    if name == "random":
        return random_block_mask(seq_len, **arguments)
    return _FACTORIES[name](**arguments)


# ---------------------------------------------------------------------------- the grid


@dataclass(frozen=True, eq=False)
class BlockGrid:
    """The ``num_blocks x num_blocks`` block workload of a mask (design note §2.1).

    ``kinds[r, c]`` is EMPTY, PARTIAL or FULL for query block ``r`` and kv block ``c``;
    ``counts[r, c]`` the allowed (q, kv) elements (max over batch and heads: the work of
    running the block for all of them). ``exact`` is False for a sampled estimate, which
    only planners and the simulator may use.
    """

    seq_len: int
    block_size: int
    num_blocks: int
    counts: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.int8]
    mask_mod: MaskMod = field(repr=False)
    batch: int = 1
    heads: int = 1
    exact: bool = True

    def __post_init__(self) -> None:
        expected = math.ceil(self.seq_len / self.block_size)
        shape = (self.num_blocks, self.num_blocks)
        if self.num_blocks != expected or self.counts.shape != shape or \
                self.kinds.shape != shape:
            raise LayoutError("num_blocks", f"must be ceil(seq_len / block_size) = {expected} "
                                            f"with counts and kinds of shape {shape}")
        self.counts.setflags(write=False)
        self.kinds.setflags(write=False)

    def _check_block(self, i: int) -> None:
        if not 0 <= i < self.num_blocks:
            raise LayoutError("block", f"must be in [0, {self.num_blocks}), got {i}")

    def block_start(self, i: int) -> int:
        self._check_block(i)
        return i * self.block_size

    def block_len(self, i: int) -> int:
        self._check_block(i)
        return min(self.block_size, self.seq_len - i * self.block_size)

    def block_tokens(self, i: int) -> Tensor:
        """Global token ids of block ``i`` (int64)."""
        start = self.block_start(i)
        return torch.arange(start, start + self.block_len(i), dtype=torch.int64)

    @property
    def block_lens(self) -> npt.NDArray[np.int64]:
        """Tokens per block (all ``block_size`` but a possibly shorter last one)."""
        return _block_lens(self.seq_len, self.block_size)

    def nonempty(self) -> list[tuple[int, int]]:
        """The non-empty blocks (r, c), row-major."""
        rows, cols = np.nonzero(self.kinds != EMPTY)
        return [(int(r), int(c)) for r, c in zip(rows, cols)]

    def work(self, r: int, c: int) -> int:
        return int(self.counts[r, c])

    @property
    def total_work(self) -> int:
        return int(self.counts.sum())

    @property
    def density(self) -> float:
        """Allowed fraction of the seq_len x seq_len attention matrix."""
        return self.total_work / (self.seq_len * self.seq_len)

    @property
    def num_full(self) -> int:
        return int((self.kinds == FULL).sum())

    @property
    def num_partial(self) -> int:
        return int((self.kinds == PARTIAL).sum())

    def describe(self) -> str:
        """An ASCII picture: '#' full, '+' partial, '.' empty; query blocks top to bottom."""
        symbols = np.array([".", "+", "#"])
        head = (f"{_name_of(self.mask_mod)}: seq_len {self.seq_len}, block_size "
                f"{self.block_size}, {self.num_blocks}x{self.num_blocks} blocks, "
                f"{self.num_full} full, {self.num_partial} partial, density "
                f"{self.density:.3f}{'' if self.exact else ' (sampled)'}")
        rows = ["".join(symbols[row]) for row in self.kinds.astype(np.int64)]
        return "\n".join([head, *rows])

    def to_block_mask(self, batch: int | None = None, heads: int | None = None) -> BlockMask:
        """This grid as a FlexAttention BlockMask (``batch``/``heads`` size its tables;
        None broadcasts). A full block that touches the ragged edge goes in as partial, as
        ``create_block_mask`` does, so the mask_mod cuts the padding."""
        batch_dim = 1 if batch is None else _require_int("batch", batch, 1)
        heads_dim = 1 if heads is None else _require_int("heads", heads, 1)
        full = self.kinds == FULL
        partial = self.kinds == PARTIAL
        if self.seq_len % self.block_size:
            full = full.copy()
            full[-1, :] = False
            full[:, -1] = False
            partial = self.kinds != EMPTY
            partial &= ~full
        kv_num, kv_indices = _kv_tables(partial)
        full_num, full_indices = _kv_tables(full)
        expand = (batch_dim, heads_dim, self.num_blocks)
        return BlockMask.from_kv_blocks(
            kv_num.expand(expand).contiguous(),
            kv_indices.expand((*expand, self.num_blocks)).contiguous(),
            full_num.expand(expand).contiguous(),
            full_indices.expand((*expand, self.num_blocks)).contiguous(),
            BLOCK_SIZE=self.block_size,
            mask_mod=self.mask_mod,
            seq_lengths=(self.seq_len, self.seq_len),
        )


def _block_lens(seq_len: int, block_size: int) -> npt.NDArray[np.int64]:
    num_blocks = math.ceil(seq_len / block_size)
    lens = np.full(num_blocks, block_size, dtype=np.int64)
    lens[-1] = seq_len - (num_blocks - 1) * block_size
    return lens


def _kv_tables(selected: npt.NDArray[np.bool_]) -> tuple[Tensor, Tensor]:
    # per row: how many columns are selected and which (increasing, the rest padding)
    chosen = torch.from_numpy(selected.copy())
    num = chosen.sum(dim=1).to(torch.int32)
    # a stable sort of "not selected" puts the selected columns first, in increasing order
    order = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True).to(torch.int32)
    return num.view(1, 1, -1), order.view(1, 1, *order.shape)


def _check_geometry(seq_len: int, block_size: int) -> None:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise LayoutError("seq_len", f"must be an integer >= 1, got {seq_len!r}")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or \
            not 1 <= block_size <= seq_len:
        raise LayoutError("block_size", f"must be an integer in [1, seq_len={seq_len}], "
                                        f"got {block_size!r}")


def _row_counts(mask_mod: MaskMod, q_idx: Tensor, seq_len: int, block_size: int,
                num_blocks: int, batch: int, heads: int) -> Tensor:
    """Allowed elements of one query block against every kv block: (batch, heads, P)."""
    allowed = evaluate_mask(mask_mod, q_idx, torch.arange(seq_len), batch=batch, heads=heads)
    per_kv = allowed.sum(dim=2, dtype=torch.int64)  # (B, H, S)
    padded = torch.nn.functional.pad(per_kv, (0, num_blocks * block_size - seq_len))
    return padded.view(batch, heads, num_blocks, block_size).sum(dim=-1)


def _fold(counts: Tensor, areas: Tensor) -> tuple[npt.NDArray[np.int64],
                                                  npt.NDArray[np.int8]]:
    """Union over (batch, heads) of per-(b, h) counts (B, H, ...) -> counts and kinds."""
    flat = counts.reshape(-1, *counts.shape[2:])
    kinds = torch.full(flat.shape[1:], PARTIAL, dtype=torch.int8)
    kinds[(flat == 0).all(dim=0)] = EMPTY
    kinds[(flat == areas).all(dim=0)] = FULL
    return flat.max(dim=0).values.numpy().astype(np.int64), kinds.numpy()


def build_block_grid(mask_mod: MaskMod, seq_len: int, block_size: int, *, batch: int = 1,
                     heads: int = 1) -> BlockGrid:
    """The exact block grid of ``mask_mod`` over ``seq_len`` tokens, one query block at a
    time (memory about ``block_size * seq_len * batch * heads`` bools)."""
    _check_geometry(seq_len, block_size)
    batch = _require_int("batch", batch, 1)
    heads = _require_int("heads", heads, 1)
    check_mask_mod(mask_mod, seq_len)
    num_blocks = math.ceil(seq_len / block_size)
    lens = torch.from_numpy(_block_lens(seq_len, block_size))
    rows = [_row_counts(mask_mod, torch.arange(r * block_size, r * block_size + int(lens[r])),
                        seq_len, block_size, num_blocks, batch, heads)
            for r in range(num_blocks)]
    counts = torch.stack(rows, dim=2)  # (B, H, P, P)
    counts_np, kinds = _fold(counts, lens[:, None] * lens[None, :])
    return BlockGrid(seq_len=seq_len, block_size=block_size, num_blocks=num_blocks,
                     counts=counts_np, kinds=kinds, mask_mod=mask_mod, batch=batch,
                     heads=heads, exact=True)


def _block_mask_kinds(block_mask: BlockMask, num_blocks: int) -> Tensor:
    """Per-(b, h) kinds (B, H, P, P) int8 as the BlockMask states them."""
    def scatter(num: Tensor, indices: Tensor, kinds: Tensor, kind: int) -> None:
        if indices.shape[-1] and (indices.min() < 0 or indices.max() >= num_blocks):
            raise MaskError("block_mask", f"kv indices must be in [0, {num_blocks})")
        used = torch.arange(indices.shape[-1]) < num.to(torch.int64).unsqueeze(-1)
        target = indices.to(torch.int64).clamp(0, num_blocks - 1)
        # padding entries past num may repeat a listed index: add, so they cannot unset it
        hits = torch.zeros(kinds.shape, dtype=torch.int64)
        hits.scatter_add_(-1, target, used.to(torch.int64))
        kinds[hits > 0] = kind

    batch, heads = block_mask.kv_num_blocks.shape[:2]
    kinds = torch.full((batch, heads, num_blocks, num_blocks), EMPTY, dtype=torch.int8)
    scatter(block_mask.kv_num_blocks.cpu(), block_mask.kv_indices.cpu(), kinds, PARTIAL)
    if block_mask.full_kv_num_blocks is not None and block_mask.full_kv_indices is not None:
        scatter(block_mask.full_kv_num_blocks.cpu(), block_mask.full_kv_indices.cpu(), kinds,
                FULL)
    return kinds


def grid_from_block_mask(block_mask: BlockMask, seq_len: int) -> BlockGrid:
    """The exact grid of a FlexAttention BlockMask (from ``create_block_mask``, ragged
    included, or ``from_kv_blocks``).

    The BlockMask's tables decide which blocks run: a block it leaves out is EMPTY whatever
    its mask_mod says, a block it marks full is FULL; its mask_mod counts the partial
    blocks, which become EMPTY or FULL when the count says so. The grid's mask_mod
    reproduces exactly what FlexAttention computes (the mask_mod inside the BlockMask's
    partial blocks), so batch- or head-dependent block tables survive the union.
    """
    q_block, kv_block = block_mask.BLOCK_SIZE
    if q_block != kv_block:
        raise MaskError("block_mask", f"BLOCK_SIZE must be square, got {block_mask.BLOCK_SIZE}")
    block_size = int(q_block)
    num_blocks = math.ceil(seq_len / block_size) if seq_len >= 1 else 0
    if tuple(block_mask.seq_lengths) != (seq_len, seq_len):
        raise MaskError("block_mask", f"seq_lengths must be ({seq_len}, {seq_len}), got "
                                      f"{tuple(block_mask.seq_lengths)}")
    _check_geometry(seq_len, min(block_size, seq_len))
    if block_mask.kv_num_blocks.dim() != 3 or block_mask.kv_num_blocks.shape[-1] != num_blocks:
        raise MaskError("block_mask", f"kv_num_blocks must have shape (B, H, {num_blocks}), "
                                      f"got {tuple(block_mask.kv_num_blocks.shape)}")
    stated = _block_mask_kinds(block_mask, num_blocks)  # (Bm, Hm, P, P)
    batch, heads = int(stated.shape[0]), int(stated.shape[1])
    inner: MaskMod = block_mask.mask_mod
    mask_mod = _block_table_mask(inner, stated, block_size)
    check_mask_mod(mask_mod, seq_len)

    lens = torch.from_numpy(_block_lens(seq_len, block_size))
    areas = lens[:, None] * lens[None, :]
    counts = torch.zeros((batch, heads, num_blocks, num_blocks), dtype=torch.int64)
    for r in range(num_blocks):
        row = stated[:, :, r, :]
        if bool((row == PARTIAL).any()):
            q_idx = torch.arange(r * block_size, r * block_size + int(lens[r]))
            exact = _row_counts(inner, q_idx, seq_len, block_size, num_blocks, batch, heads)
            counts[:, :, r, :] = torch.where(row == PARTIAL, exact, 0)
        counts[:, :, r, :] = torch.where(row == FULL, areas[r], counts[:, :, r, :])
    counts_np, kinds = _fold(counts, areas)
    return BlockGrid(seq_len=seq_len, block_size=block_size, num_blocks=num_blocks,
                     counts=counts_np, kinds=kinds, mask_mod=mask_mod, batch=batch,
                     heads=heads, exact=True)


def _block_table_mask(inner: MaskMod, stated: Tensor, block_size: int) -> MaskMod:
    """``inner`` restricted to a per-(b, h) block table: FULL blocks allow everything,
    PARTIAL ones what ``inner`` allows, EMPTY ones nothing (FlexAttention's semantics)."""
    batch, heads, num_blocks = int(stated.shape[0]), int(stated.shape[1]), int(stated.shape[2])

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        table = stated.to(q_idx.device)
        # a table of size 1 broadcasts over batch (heads), as in FlexAttention
        bi = b * 0 if batch == 1 else b
        hi = h * 0 if heads == 1 else h
        kind = table[bi, hi, (q_idx // block_size).clamp(0, num_blocks - 1),
                     (kv_idx // block_size).clamp(0, num_blocks - 1)]
        return (kind == FULL) | ((kind == PARTIAL) & inner(b, h, q_idx, kv_idx))

    return _named(mask, f"block_mask({_name_of(inner)})")


def sampled_block_grid(mask_mod: MaskMod, seq_len: int, block_size: int, *,
                       samples_per_block: int = 32, batch: int = 1,
                       heads: int = 1) -> BlockGrid:
    """An estimated grid (``exact=False``) for sequences too long to evaluate densely.

    Each block is sampled on a lattice of ``samples_per_block`` query positions by
    ``samples_per_block`` kv positions, evenly spaced and always including its first and
    last token; a block is EMPTY (FULL) if no (every) sample is allowed, and its count is the
    allowed fraction of the samples times its area. Cost: about
    ``(num_blocks * samples_per_block) ** 2`` evaluations. For planning and simulation only:
    executors refuse such grids.
    """
    _check_geometry(seq_len, block_size)
    samples = _require_int("samples_per_block", samples_per_block, 2)
    batch = _require_int("batch", batch, 1)
    heads = _require_int("heads", heads, 1)
    check_mask_mod(mask_mod, seq_len)
    num_blocks = math.ceil(seq_len / block_size)
    lens = _block_lens(seq_len, block_size)
    points = [np.unique(np.round(np.linspace(0, n - 1, min(samples, int(n)))).astype(np.int64))
              + i * block_size for i, n in enumerate(lens)]
    owner = np.concatenate([np.full(len(p), i) for i, p in enumerate(points)])
    all_points = torch.from_numpy(np.concatenate(points))
    owner_t = torch.from_numpy(owner)
    per_block = torch.bincount(owner_t, minlength=num_blocks)
    lens_t = torch.from_numpy(lens)
    areas = lens_t[:, None] * lens_t[None, :]
    hits = torch.zeros((batch, heads, num_blocks, num_blocks), dtype=torch.int64)
    for r in range(num_blocks):
        allowed = evaluate_mask(mask_mod, torch.from_numpy(points[r]), all_points, batch=batch,
                                heads=heads)
        per_kv = allowed.sum(dim=2, dtype=torch.int64)  # (B, H, number of samples)
        hits[:, :, r, :].index_add_(-1, owner_t, per_kv)
    total = per_block[:, None] * per_block[None, :]
    flat = hits.reshape(-1, num_blocks, num_blocks)
    kinds = torch.full((num_blocks, num_blocks), PARTIAL, dtype=torch.int8)
    kinds[(flat == 0).all(dim=0)] = EMPTY
    kinds[(flat == total).all(dim=0)] = FULL
    estimate = torch.round(flat.max(dim=0).values.double() / total * areas).to(torch.int64)
    # a partial estimate stays strictly between empty and full, so kinds and counts agree
    estimate = torch.where(kinds == PARTIAL, estimate.clamp(min=1).minimum(areas - 1), estimate)
    estimate = torch.where(kinds == FULL, areas, torch.where(kinds == EMPTY, 0, estimate))
    return BlockGrid(seq_len=seq_len, block_size=block_size, num_blocks=num_blocks,
                     counts=estimate.numpy().astype(np.int64), kinds=kinds.numpy(),
                     mask_mod=mask_mod, batch=batch, heads=heads, exact=False)
