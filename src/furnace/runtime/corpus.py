"""A byte-level text corpus made from the Python standard library's own source files.

Every Python installation ships the ``.py`` sources of its standard library, so the
language models of several Furnace systems (the MoE LM whose routing traces drive the
FasterMoE benchmarks, and the DeltaFormer LM) can train on real text with no download
and no data set to vendor. The corpus is bytes (vocabulary 256), split by file so that no
file is in both the training and the validation split.

The file order, the split and every batch are deterministic: file lists are sorted by
relative POSIX path, and `batches` draws its windows only from the ``torch.Generator``
it is given. The exact bytes depend on the Python version that runs the code.

Shape suffixes: B = batch, T = sequence length (window), N = bytes in a split.
"""

from __future__ import annotations

import math
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "EXCLUDED_DIRS",
    "FILE_SEPARATOR",
    "Corpus",
    "CorpusConfig",
    "batches",
    "eval_batches",
    "load_corpus",
    "stdlib_source_files",
]

# third-party packages are not the standard library, and the test suites are mostly
# generated data and fixtures rather than ordinary code
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib",
                           "lib2to3", "__pycache__"})
FILE_SEPARATOR = b"\n\n"


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(max_files: int | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted by path relative to the stdlib root.

    Directories named in `EXCLUDED_DIRS` (site-packages, test, tests, idlelib, lib2to3)
    are skipped at any depth.

    Args:
        max_files: keep only the first ``max_files`` files of the sorted list.

    Raises:
        FileNotFoundError: the stdlib directory does not exist or holds no ``.py`` files
            (a Python built or packaged without its sources).
    """
    if max_files is not None and max_files < 1:
        raise ValueError(f"max_files must be >= 1 or None, got {max_files}")
    root = _stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library directory {root} does not exist; this "
                                "Python ships no stdlib sources to build a corpus from")
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # pruning in place keeps os.walk out of the excluded trees entirely
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    if not found:
        raise FileNotFoundError(f"no .py files under the standard library directory {root}; "
                                "this Python ships no stdlib sources to build a corpus from")
    found.sort(key=lambda item: item[0])
    paths = [path for _, path in found]
    return paths if max_files is None else paths[:max_files]


@dataclass(frozen=True)
class CorpusConfig:
    """How much of the stdlib to take and how to split it.

    Attributes:
        num_bytes: total bytes of both splits together (fewer if the files run out).
        val_fraction: share of files for validation; every k-th file with
            ``k = round(1 / val_fraction)`` goes to the validation split.
        max_files: read at most this many files (None: as many as ``num_bytes`` needs).
    """

    num_bytes: int = 2_000_000
    val_fraction: float = 0.1
    max_files: int | None = None

    def __post_init__(self) -> None:
        if self.num_bytes < 1:
            raise ValueError(f"num_bytes must be >= 1, got {self.num_bytes}")
        if not (math.isfinite(self.val_fraction) and 0.0 < self.val_fraction <= 0.5):
            raise ValueError(f"val_fraction must be in (0, 0.5] so that both splits hold "
                             f"files, got {self.val_fraction}")
        if self.max_files is not None and self.max_files < 1:
            raise ValueError(f"max_files must be >= 1 or None, got {self.max_files}")

    @property
    def val_every(self) -> int:
        """k: file i (from 0) is a validation file when ``i % k == k - 1``."""
        return max(2, round(1.0 / self.val_fraction))


# eq=False: field-wise == on tensors is ambiguous, so corpora compare by identity
@dataclass(frozen=True, eq=False)
class Corpus:
    """The two splits as flat uint8 tensors, and how many files each came from."""

    train: torch.Tensor
    val: torch.Tensor
    files_train: int
    files_val: int

    @property
    def vocab_size(self) -> int:
        return 256

    @property
    def num_bytes(self) -> int:
        return self.train.numel() + self.val.numel()


def load_corpus(config: CorpusConfig | None = None) -> Corpus:
    """Concatenate stdlib files (each followed by a blank line) up to ``num_bytes`` and split.

    Files are taken in `stdlib_source_files` order; the last one is cut where the byte
    budget runs out. File i goes to validation when ``i % k == k - 1`` (see
    `CorpusConfig.val_every`), otherwise to training, so the split is by whole files.

    Raises:
        FileNotFoundError: no stdlib sources (see `stdlib_source_files`).
        ValueError: too few files to put at least one in each split.
    """
    config = config or CorpusConfig()
    k = config.val_every
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    remaining = config.num_bytes
    used = 0
    for i, path in enumerate(stdlib_source_files(config.max_files)):
        if remaining <= 0:
            break
        chunk = (path.read_bytes() + FILE_SEPARATOR)[:remaining]
        remaining -= len(chunk)
        used = i + 1
        (val_parts if i % k == k - 1 else train_parts).append(chunk)
    if not train_parts or not val_parts:
        raise ValueError(f"the corpus used {used} file(s), too few to give every {k}-th one to "
                         "validation and keep some for training; raise num_bytes or max_files, "
                         "or raise val_fraction")
    return Corpus(train=_to_tensor(b"".join(train_parts)), val=_to_tensor(b"".join(val_parts)),
                  files_train=len(train_parts), files_val=len(val_parts))


def _to_tensor(data: bytes) -> torch.Tensor:
    # bytearray gives frombuffer a writable buffer; clone detaches it from that buffer
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _check_windows(data: torch.Tensor, batch_size: int, seq_len: int) -> None:
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor of tokens, got "
                         f"{tuple(data.shape) if isinstance(data, torch.Tensor) else type(data)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if data.numel() < seq_len + 1:
        raise ValueError(f"a window of seq_len={seq_len} needs {seq_len + 1} tokens (inputs "
                         f"plus one shifted target), data has {data.numel()}")


def batches(data: torch.Tensor, *, batch_size: int, seq_len: int,
            generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless random training windows: ``(inputs_BT, targets_BT)``, int64.

    ``targets_BT[b, t] == inputs_BT[b, t + 1]`` within the data. Window starts are drawn
    uniformly with ``generator`` only, so the same generator state gives the same batches
    and the global RNG is neither read nor advanced.
    """
    _check_windows(data, batch_size, seq_len)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return _random_windows(data, batch_size, seq_len, generator)


def _random_windows(data: torch.Tensor, batch_size: int, seq_len: int,
                    generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    offsets_T = torch.arange(seq_len + 1)
    while True:
        start_B = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=generator)
        window_BT = data[start_B[:, None] + offsets_T].long()
        yield window_BT[:, :-1], window_BT[:, 1:]


def eval_batches(data: torch.Tensor, batch_size: int, seq_len: int,
                 max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic evaluation windows from the start of ``data``, inputs not overlapping.

    Window j has inputs ``data[j*T : (j+1)*T]`` and targets one byte later. Windows are
    grouped ``batch_size`` at a time; the last batch may be smaller. At most
    ``max_batches`` batches (None: every whole window in ``data``).
    """
    _check_windows(data, batch_size, seq_len)
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
    return _ordered_windows(data, batch_size, seq_len, max_batches)


def _ordered_windows(data: torch.Tensor, batch_size: int, seq_len: int,
                     max_batches: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    num_windows = (data.numel() - 1) // seq_len
    offsets_T = torch.arange(seq_len + 1)
    for i, first in enumerate(range(0, num_windows, batch_size)):
        if max_batches is not None and i >= max_batches:
            return
        start_B = torch.arange(first, min(first + batch_size, num_windows)) * seq_len
        window_BT = data[start_B[:, None] + offsets_T].long()
        yield window_BT[:, :-1], window_BT[:, 1:]
