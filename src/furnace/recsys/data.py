"""Click-log data for pattern-aware sparse communication in DLRM training (He, Chen, Zhai,
PPoPP '24 poster; design note `recsys.md` Sec. 6 "Data usable offline", "Recommended
generator", and Sec. 7 component 1 "data").

The poster's full paper is not public and its datasets cannot be downloaded here, so the
skewed access pattern it exploits is reproduced by a LABELLED SYNTHETIC generator,
`SyntheticClickLog`:

- each table draws row ranks from a Zipf law ``p_k ∝ k^-s`` over ranks ``1..n`` (``s = 0``
  is uniform), mapped to row IDs by a fixed seeded permutation per table, so that hotness
  does not correlate with ``id % W`` or with ID ranges (which would flatter row sharding);
- dense features are heavy-tailed counts like Criteo's ``I1..I13`` (``floor(exp(normal))``),
  transformed by ``log1p`` as the DLRM reference does;
- labels come from a planted logistic model (dense weights and one bias per row), so a
  trained model's loss and AUC fall and mean something (the Bayes AUC is about 0.75-0.8).

Every batch is a pure function of ``(seed, index)``: any rank, or any rerun, can produce
batch ``i`` without the ones before it.

`CriteoTSVReader` streams the real Criteo format for users who have the files; the
generator's probabilities (`SyntheticClickLog.probabilities`) or profiled counts
(`access_counts`) feed the planner.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from .batch import Batch
from .config import DataConfig, DataError

__all__ = ["CriteoTSVReader", "SyntheticClickLog", "access_counts", "hash_category",
           "write_criteo_tsv", "zipf_probabilities"]

# spawn keys of the generator's fixed structure, apart from the batches' [seed, index] streams
_PERMUTATION_KEY = 0x5045524D
_PLANTED_KEY = 0x504C414E


def zipf_probabilities(rows: int, exponent: float) -> np.ndarray:
    """``p_k ∝ k^-s`` for ranks ``k = 1..rows`` (index ``k - 1``), summing to 1."""
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -float(exponent)
    return np.asarray(weights / weights.sum())


class SyntheticClickLog:
    """A seeded Criteo-like click log (see the module docstring).

    The planted model: ``z = dense_part + sparse_part`` with
    ``dense_part = latent @ w_dense`` (``latent [B, F]`` standard normal, the log-count
    behind each dense feature, ``w_dense ~ N(0, 1/F)``) and
    ``sparse_part = sum_t mean(bias_t[bag_t])`` (``bias_t ~ N(0, 1/T)`` per row), so ``z``
    has a standard deviation of about 1.0-1.3 and ``label ~ Bernoulli(sigmoid(z))``: the
    planted logit itself scores an AUC of about 0.75-0.78 (measured on the default config
    and small ones), the ceiling a trained model can approach.
    """

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        offsets = [0]
        for rows in config.table_rows[:-1]:
            offsets.append(offsets[-1] + rows)
        self.table_offsets: tuple[int, ...] = tuple(offsets)
        self._permutations: list[np.ndarray] = []
        self._biases: list[np.ndarray] = []
        for t, rows in enumerate(config.table_rows):
            perm_rng = np.random.default_rng(
                np.random.SeedSequence(config.seed, spawn_key=(_PERMUTATION_KEY, t)))
            # rank i (0-based, the (i+1)-th hottest) is row permutation[i]
            self._permutations.append(perm_rng.permutation(rows))
            bias_rng = np.random.default_rng(
                np.random.SeedSequence(config.seed, spawn_key=(_PLANTED_KEY, t)))
            self._biases.append(bias_rng.normal(0.0, 1.0 / math.sqrt(config.num_tables),
                                                size=rows))
        dense_rng = np.random.default_rng(
            np.random.SeedSequence(config.seed, spawn_key=(_PLANTED_KEY, config.num_tables)))
        f = config.num_dense
        self.dense_weights = dense_rng.normal(0.0, 1.0 / math.sqrt(f), size=f)
        # per-feature location and spread of the log-counts: some features are mostly
        # zero, some large, as Criteo's are
        self.dense_log_mean = dense_rng.uniform(-1.0, 3.0, size=f)
        self.dense_log_std = dense_rng.uniform(0.5, 1.5, size=f)
        self._cdfs: dict[int, np.ndarray] = {}

    @property
    def num_tables(self) -> int:
        return self.config.num_tables

    def row_biases(self, table: int) -> np.ndarray:
        """The planted model's bias of each row of ``table`` (by row ID)."""
        return self._biases[table]

    def rank_to_row(self, table: int) -> np.ndarray:
        """Row ID of each popularity rank of ``table`` (index 0 is the hottest row)."""
        return self._permutations[table]

    def row_probabilities(self, table: int) -> np.ndarray:
        """The exact per-lookup probability of each row ID of ``table`` (sums to 1)."""
        rows = self.config.table_rows[table]
        probs = np.empty(rows, dtype=np.float64)
        probs[self._permutations[table]] = zipf_probabilities(rows, self.config.zipf_exponent)
        return probs

    def probabilities(self) -> np.ndarray:
        """`row_probabilities` of every table, concatenated in table order (indexed by global
        row ID; each table's block sums to 1)."""
        return np.concatenate([self.row_probabilities(t) for t in range(self.num_tables)])

    def _cdf(self, table: int) -> np.ndarray:
        cdf = self._cdfs.get(table)
        if cdf is None:
            rows = self.config.table_rows[table]
            cdf = np.cumsum(zipf_probabilities(rows, self.config.zipf_exponent))
            self._cdfs[table] = cdf
        return cdf

    def batch(self, index: int, batch_size: int) -> Batch:
        """Batch ``index``: a pure function of ``(config, index, batch_size)``, drawn from
        ``np.random.default_rng([seed, index])``. One-hot when ``bag_size == 1``; else each
        bag's length is uniform in ``1..2*bag_size-1``."""
        if not (isinstance(index, (int, np.integer)) and not isinstance(index, bool)
                and index >= 0):
            raise DataError("index", f"must be an int >= 0, got {index!r}")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise DataError("batch_size", f"must be an int >= 1, got {batch_size!r}")
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, int(index)])
        latent = rng.standard_normal((batch_size, cfg.num_dense))
        counts = np.floor(np.exp(self.dense_log_mean + self.dense_log_std * latent))
        dense = np.log1p(counts)
        z = latent @ self.dense_weights
        ids: list[torch.Tensor] = []
        offsets: list[torch.Tensor] = []
        for t, rows in enumerate(cfg.table_rows):
            if cfg.bag_size == 1:
                lengths = np.ones(batch_size, dtype=np.int64)
            else:
                lengths = rng.integers(1, 2 * cfg.bag_size, size=batch_size, dtype=np.int64)
            ranks = np.searchsorted(self._cdf(t), rng.random(int(lengths.sum())), side="right")
            # cumsum rounding can leave the last cdf entry a hair below 1
            rows_t = self._permutations[t][np.minimum(ranks, rows - 1)]
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            bag_sums = np.add.reduceat(self._biases[t][rows_t], bounds[:-1])
            z += bag_sums / lengths
            ids.append(torch.from_numpy(rows_t.astype(np.int64)))
            offsets.append(torch.from_numpy(bounds.astype(np.int64)))
        labels = (rng.random(batch_size) < 1.0 / (1.0 + np.exp(-z))).astype(np.float32)
        return Batch(torch.from_numpy(dense.astype(np.float32)), tuple(ids), tuple(offsets),
                     torch.from_numpy(labels))

    def batches(self, batch_size: int, num_batches: int, start: int = 0) -> Iterator[Batch]:
        """Batches ``start .. start + num_batches - 1``, generated one at a time."""
        for index in range(start, start + num_batches):
            yield self.batch(index, batch_size)


def access_counts(batches: Iterable[Batch], table_rows: tuple[int, ...]) -> np.ndarray:
    """Lookups of each global row ID over ``batches`` (int64 ``[total_rows]``): the profile
    the planner turns into probabilities. An ID outside its table is a `DataError`."""
    offsets = np.concatenate([[0], np.cumsum(table_rows)[:-1]]).astype(np.int64)
    total = int(sum(table_rows))
    counts = np.zeros(total, dtype=np.int64)
    for batch in batches:
        if batch.num_tables != len(table_rows):
            raise DataError("table_rows", f"batch has {batch.num_tables} tables, "
                            f"expected {len(table_rows)}")
        for t, ids in enumerate(batch.ids):
            local = ids.numpy().astype(np.int64)
            if local.size and (local.min() < 0 or local.max() >= table_rows[t]):
                raise DataError("ids", f"table {t} has rows 0..{table_rows[t] - 1}, got "
                                f"IDs in {local.min()}..{local.max()}")
            counts += np.bincount(local + offsets[t], minlength=total)
    return counts


_HEX = re.compile(r"[0-9a-fA-F]+")
_DECIMAL = re.compile(r"[0-9]+")


def hash_category(value: str | None, rows: int) -> int:
    """Row of a Criteo categorical value in a table of ``rows`` rows.

    A missing value (None or "") is row 0, reserved for it; any other hex string maps to
    ``int(value, 16) % (rows - 1) + 1``, stable across processes and runs (unlike Python's
    ``hash``). A one-row table maps everything to row 0.
    """
    if not (isinstance(rows, int) and rows >= 1):
        raise DataError("table_rows", f"must be >= 1, got {rows!r}")
    if value is None or value == "":
        return 0
    if not _HEX.fullmatch(value):
        raise DataError("data", f"categorical value {value!r} is not hexadecimal")
    if rows == 1:
        return 0
    return int(value, 16) % (rows - 1) + 1


class CriteoTSVReader:
    """Streams ``Batch``es from a Criteo TSV file: ``label \\t I1..I{num_dense} \\t
    C1..C{len(table_rows)}`` per line.

    Dense values are ints; empty (missing) and negative values become 0; each is then
    ``log1p``-transformed (the DLRM reference's transform). Categorical values are hex
    strings hashed by `hash_category` (empty = row 0). Batches hold ``batch_size`` samples,
    in file order, and the last one holds whatever is left (it may be smaller). A malformed
    line is a `DataError` naming ``path:line``.

    ``hashed=False`` reads the "indexed" variant: each categorical value is already a row,
    a decimal integer in ``0..n-1`` (an empty value is row 0, as in the hashed format).
    """

    def __init__(self, path: str | Path, *, table_rows: tuple[int, ...], batch_size: int,
                 num_dense: int = 13, hashed: bool = True) -> None:
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise DataError("batch_size", f"must be an int >= 1, got {batch_size!r}")
        if not table_rows or any(not isinstance(n, int) or n < 1 for n in table_rows):
            raise DataError("table_rows", f"must be tables of >= 1 rows, got {table_rows!r}")
        if not (isinstance(num_dense, int) and num_dense >= 1):
            raise DataError("num_dense", f"must be an int >= 1, got {num_dense!r}")
        self.path = Path(path)
        self.table_rows = tuple(table_rows)
        self.batch_size = batch_size
        self.num_dense = num_dense
        self.hashed = hashed

    def _parse(self, line: str, lineno: int) -> tuple[float, list[int], list[int]]:
        def bad(what: str) -> DataError:
            return DataError("data", f"{self.path}:{lineno}: {what}")

        fields = line.rstrip("\r\n").split("\t")
        expected = 1 + self.num_dense + len(self.table_rows)
        if len(fields) != expected:
            raise bad(f"expected {expected} tab-separated columns, got {len(fields)}")
        if fields[0] not in ("0", "1"):
            raise bad(f"label must be 0 or 1, got {fields[0]!r}")
        dense = []
        for j, text in enumerate(fields[1:1 + self.num_dense]):
            if text == "":
                dense.append(0)
                continue
            try:
                value = int(text)
            except ValueError:
                raise bad(f"dense feature I{j + 1} is not an integer: {text!r}") from None
            dense.append(max(value, 0))
        cats = []
        for j, (text, rows) in enumerate(zip(fields[1 + self.num_dense:], self.table_rows)):
            if not self.hashed:
                if text == "":
                    cats.append(0)
                elif _DECIMAL.fullmatch(text) and int(text) < rows:
                    cats.append(int(text))
                else:
                    raise bad(f"categorical feature C{j + 1} must be a row in 0..{rows - 1}, "
                              f"got {text!r}")
                continue
            if text and not _HEX.fullmatch(text):
                raise bad(f"categorical feature C{j + 1} is not hexadecimal: {text!r}")
            cats.append(hash_category(text, rows))
        return float(fields[0]), dense, cats

    def _batch(self, labels: list[float], dense: list[list[int]],
               cats: list[list[int]]) -> Batch:
        b = len(labels)
        dense_t = torch.log1p(torch.tensor(dense, dtype=torch.float64)).to(torch.float32)
        ids = torch.tensor(cats, dtype=torch.int64).reshape(b, len(self.table_rows))
        one_hot = torch.arange(b + 1, dtype=torch.int64)
        return Batch(dense_t, tuple(ids[:, t].contiguous() for t in range(ids.shape[1])),
                     tuple(one_hot.clone() for _ in self.table_rows),
                     torch.tensor(labels, dtype=torch.float32))

    def __iter__(self) -> Iterator[Batch]:
        labels: list[float] = []
        dense: list[list[int]] = []
        cats: list[list[int]] = []
        with self.path.open("r", encoding="ascii", errors="replace") as handle:
            for lineno, line in enumerate(handle, start=1):
                label, d, c = self._parse(line, lineno)
                labels.append(label)
                dense.append(d)
                cats.append(c)
                if len(labels) == self.batch_size:
                    yield self._batch(labels, dense, cats)
                    labels, dense, cats = [], [], []
        if labels:
            yield self._batch(labels, dense, cats)


def write_criteo_tsv(path: str | Path,
                     rows: Iterable[tuple[int, list[int | None], list[str | None]]]) -> None:
    """Write samples ``(label, dense values, categorical hex strings)`` in Criteo's TSV
    format; None is written as an empty (missing) field."""
    with Path(path).open("w", encoding="ascii") as handle:
        for label, dense, cats in rows:
            fields = [str(int(label))]
            fields += ["" if v is None else str(int(v)) for v in dense]
            fields += ["" if c is None else c for c in cats]
            handle.write("\t".join(fields) + "\n")
