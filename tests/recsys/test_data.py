"""Tests of the click-log data (`furnace.recsys.data`; pattern-aware sparse communication,
He, Chen, Zhai, PPoPP '24 poster, design note Sec. 6 "Recommended generator"): the Zipf
generator is a pure function of (seed, index), its exact row probabilities match sampled
frequencies and are permuted away from row 0, bags have the promised lengths, planted labels
can be learned, and the Criteo TSV reader round-trips and names the line of a bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from furnace.recsys.batch import Batch
from furnace.recsys.config import DataConfig, DataError, ModelConfig, OptimizerConfig
from furnace.recsys.data import (
    CriteoTSVReader,
    SyntheticClickLog,
    access_counts,
    hash_category,
    write_criteo_tsv,
    zipf_probabilities,
)
from furnace.recsys.naive import ReferenceTrainer, roc_auc

# single process on CPU: the generator and the reader are numpy/Python only; the one
# training test asserts an AUC margin that no thread-count rounding difference can move
pytestmark = pytest.mark.thread_independent


def _same(a: Batch, b: Batch) -> bool:
    return (torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
            and all(torch.equal(x, y) for x, y in zip(a.ids, b.ids))
            and all(torch.equal(x, y) for x, y in zip(a.offsets, b.offsets)))


def test_batches_are_a_pure_function_of_seed_and_index() -> None:
    config = DataConfig(table_rows=(20, 50, 3), num_dense=5, bag_size=2, seed=4)
    log = SyntheticClickLog(config)
    streamed = list(log.batches(16, 3, start=2))
    # a fresh generator, the batches asked for out of order
    other = SyntheticClickLog(config)
    assert _same(other.batch(4, 16), streamed[2])
    assert _same(other.batch(2, 16), streamed[0])
    assert _same(log.batch(3, 16), streamed[1])
    assert not _same(log.batch(5, 16), streamed[0])
    reseeded = SyntheticClickLog(DataConfig(table_rows=(20, 50, 3), num_dense=5, bag_size=2,
                                            seed=5))
    assert not _same(reseeded.batch(2, 16), streamed[0])
    batch = streamed[0]
    assert batch.dense.dtype == torch.float32 and batch.labels.dtype == torch.float32
    assert batch.dense.shape == (16, 5) and bool((batch.dense >= 0).all())
    assert set(batch.labels.tolist()) <= {0.0, 1.0}
    for t, rows in enumerate(config.table_rows):
        assert batch.ids[t].dtype == torch.int64
        assert 0 <= int(batch.ids[t].min()) and int(batch.ids[t].max()) < rows
    for bad_index in (-1, 1.5):
        with pytest.raises(DataError) as info:
            log.batch(bad_index, 4)  # type: ignore[arg-type]
        assert info.value.field == "index"
    with pytest.raises(DataError) as info:
        log.batch(0, 0)
    assert info.value.field == "batch_size"


def test_row_probabilities_are_exact_and_match_sampled_frequencies() -> None:
    rows = 1000
    config = DataConfig(table_rows=(rows, 40), num_dense=1, zipf_exponent=1.1, seed=2)
    log = SyntheticClickLog(config)
    probs = log.row_probabilities(0)
    assert probs.sum() == pytest.approx(1.0, rel=1e-12)
    ranks = np.arange(1, rows + 1, dtype=np.float64)
    assert np.allclose(np.sort(probs)[::-1], ranks ** -1.1 / (ranks ** -1.1).sum(), rtol=1e-12)
    glob = log.probabilities()
    assert glob.shape == (rows + 40,)
    assert np.array_equal(glob[:rows], probs) and np.array_equal(glob[rows:],
                                                                 log.row_probabilities(1))
    samples = 200_000
    counts = access_counts(log.batches(50_000, samples // 50_000), config.table_rows)
    assert counts[:rows].sum() == samples and counts[rows:].sum() == samples
    # the 50 hottest rows, each within 5 sigma of its binomial expectation
    top = np.argsort(probs)[::-1][:50]
    expected = samples * probs[top]
    sigma = np.sqrt(expected * (1 - probs[top]))
    assert np.all(np.abs(counts[top] - expected) <= 5 * sigma + 1)
    # and a chi-square over the 50 hottest rows plus one bin of the rest, well inside
    # the 99.9 % quantile of chi2(50) (86.7)
    observed = np.append(counts[top], samples - counts[top].sum())
    means = np.append(expected, samples - expected.sum())
    assert float(((observed - means) ** 2 / means).sum()) < 86.7


def test_uniform_exponent_and_zipf_helper() -> None:
    log = SyntheticClickLog(DataConfig(table_rows=(7,), num_dense=1, zipf_exponent=0.0))
    assert np.allclose(log.row_probabilities(0), 1 / 7, rtol=1e-14)
    p = zipf_probabilities(4, 1.0)
    assert np.allclose(p, np.array([1, 1 / 2, 1 / 3, 1 / 4]) / (25 / 12), rtol=1e-14)


def test_permutation_moves_the_hot_rows_off_low_ids() -> None:
    config = DataConfig(table_rows=(1000,) * 24, num_dense=1, seed=7)
    log = SyntheticClickLog(config)
    hottest = [int(np.argmax(log.row_probabilities(t))) for t in range(config.num_tables)]
    assert sum(h == 0 for h in hottest) <= 1
    assert len(set(hottest)) >= 20
    for t in range(config.num_tables):
        assert int(log.rank_to_row(t)[0]) == hottest[t]
    # hotness does not follow id % W: the mass per residue class mod 4 stays near 1/4
    # (unpermuted, the class holding rank 1 would carry about 0.36 of it)
    probs = log.row_probabilities(0)
    per_class = np.array([probs[r::4].sum() for r in range(4)])
    assert per_class.max() < 0.36
    # the permutation is seeded: the same seed gives the same hot rows
    again = SyntheticClickLog(config)
    assert all(np.array_equal(again.rank_to_row(t), log.rank_to_row(t)) for t in range(3))


@pytest.mark.parametrize("bag_size", [1, 3])
def test_bag_lengths_are_in_range(bag_size: int) -> None:
    config = DataConfig(table_rows=(30, 5), num_dense=2, bag_size=bag_size)
    batch = SyntheticClickLog(config).batch(0, 2000)
    for t in range(2):
        lengths = batch.lengths(t)
        assert int(batch.offsets[t][0]) == 0 and int(batch.offsets[t][-1]) == batch.ids[t].numel()
        if bag_size == 1:
            assert torch.equal(batch.offsets[t], torch.arange(2001))
        else:
            assert set(lengths.tolist()) == set(range(1, 2 * bag_size))
            assert float(lengths.double().mean()) == pytest.approx(bag_size, rel=0.05)


def test_access_counts_equal_an_explicit_count() -> None:
    table_rows = (6, 4)
    log = SyntheticClickLog(DataConfig(table_rows=table_rows, num_dense=1, bag_size=2))
    batches = list(log.batches(12, 3))
    expected = np.zeros(10, dtype=np.int64)
    for batch in batches:
        for t, ids in enumerate(batch.ids):
            for i in ids.tolist():
                expected[(0, 6)[t] + i] += 1
    counts = access_counts(iter(batches), table_rows)
    assert counts.dtype == np.int64 and np.array_equal(counts, expected)
    with pytest.raises(DataError) as info:
        access_counts(batches, (6, 3))
    assert info.value.field == "ids"


def test_planted_labels_are_learnable() -> None:
    data = DataConfig(table_rows=(50, 200, 30, 100), num_dense=4, seed=0)
    log = SyntheticClickLog(data)
    model = ModelConfig(embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1))
    trainer = ReferenceTrainer(data, model, OptimizerConfig(sparse="rowwise_adagrad", lr=0.1,
                                                            dense_lr=0.1),
                               dtype=torch.float32)
    held_out = log.batch(10**6, 4096)
    assert 0.3 < float(held_out.labels.mean()) < 0.7
    for batch in log.batches(128, 250):
        trainer.step(batch)
    _, logits = trainer.evaluate(held_out)
    assert roc_auc(held_out.labels, logits) > 0.68


def _write_sample_file(path: Path) -> list[tuple[int, list[int | None], list[str | None]]]:
    rows: list[tuple[int, list[int | None], list[str | None]]] = [
        (1, [3, None, 0], ["0000000a", "68fd1e64", None]),
        (0, [None, -5, 12], [None, "FFFFFFFF", "00000001"]),
        (0, [100, 7, None], ["ffffffff", "", "05db9164"]),
        (1, [0, 0, 0], ["80e26c9b", "fb936136", "7b4723c4"]),
        (0, [1, 2, 3], [None, None, None]),
    ]
    write_criteo_tsv(path, rows)
    return rows


def test_tsv_round_trip_with_missing_values_and_hashing(tmp_path: Path) -> None:
    path = tmp_path / "day_0.tsv"
    rows = _write_sample_file(path)
    table_rows = (11, 1000, 1)
    batches = list(CriteoTSVReader(path, table_rows=table_rows, batch_size=2, num_dense=3))
    # the last, partial batch is yielded too
    assert [b.batch_size for b in batches] == [2, 2, 1]
    labels = torch.cat([b.labels for b in batches])
    dense = torch.cat([b.dense for b in batches])
    assert labels.tolist() == [float(r[0]) for r in rows]
    raw = torch.tensor([[max(v or 0, 0) for v in r[1]] for r in rows], dtype=torch.float64)
    assert dense.dtype == torch.float32
    assert torch.equal(dense, torch.log1p(raw).to(torch.float32))
    for t, n in enumerate(table_rows):
        ids = torch.cat([b.ids[t] for b in batches]).tolist()
        expected = [0 if not r[2][t] or n == 1 else int(str(r[2][t]), 16) % (n - 1) + 1
                    for r in rows]
        assert ids == expected
        for b in batches:
            assert torch.equal(b.offsets[t], torch.arange(b.batch_size + 1))
    # the first row of table 0 by hand: 0xa = 10, 10 % 10 + 1 = 1
    assert int(batches[0].ids[0][0]) == 1
    assert int(batches[0].ids[1][0]) == int("68fd1e64", 16) % 999 + 1


def test_indexed_format_reads_rows_as_given(tmp_path: Path) -> None:
    path = tmp_path / "indexed.tsv"
    write_criteo_tsv(path, [(1, [4], ["3", None]), (0, [None], ["0", "9"])])
    (batch,) = CriteoTSVReader(path, table_rows=(5, 10), batch_size=4, num_dense=1,
                               hashed=False)
    assert batch.ids[0].tolist() == [3, 0] and batch.ids[1].tolist() == [0, 9]
    write_criteo_tsv(path, [(1, [4], ["3", "1"]), (0, [None], ["5", "9"])])
    with pytest.raises(DataError, match=r"indexed.tsv:2: categorical feature C1 must be a "
                                        r"row in 0..4"):
        list(CriteoTSVReader(path, table_rows=(5, 10), batch_size=4, num_dense=1,
                             hashed=False))


def test_hash_category() -> None:
    assert hash_category(None, 10) == 0 and hash_category("", 10) == 0
    assert hash_category("0000000a", 5) == 10 % 4 + 1
    assert hash_category("0000000A", 5) == hash_category("0000000a", 5)
    assert hash_category("deadbeef", 1) == 0
    for value in ("xyz", "0x12", " 12", "1_2"):
        with pytest.raises(DataError) as info:
            hash_category(value, 10)
        assert info.value.field == "data"
    with pytest.raises(DataError):
        hash_category("12", 0)


@pytest.mark.parametrize(("bad_line", "message"), [
    ("1\t1\t2\t3\taa\tbb", "columns"),                     # one categorical short
    ("1\t1\t2\t3\taa\tbb\tcc\tdd", "columns"),             # one too many
    ("1\t1\t2\t3\taa\tzz\tcc", "C2 is not hexadecimal"),
    ("1\t1\t2\t3\taa\t0x1\tcc", "C2 is not hexadecimal"),
    ("2\t1\t2\t3\taa\tbb\tcc", "label"),
    ("\t1\t2\t3\taa\tbb\tcc", "label"),
    ("1\t1\t2.5\t3\taa\tbb\tcc", "I2 is not an integer"),
    ("", "columns"),
])
def test_malformed_line_names_its_line_number(tmp_path: Path, bad_line: str,
                                              message: str) -> None:
    path = tmp_path / "bad.tsv"
    good = "0\t1\t\t3\taa\t\tcc"
    path.write_text("\n".join([good, good, bad_line, good]) + "\n", encoding="ascii")
    reader = CriteoTSVReader(path, table_rows=(10, 10, 10), batch_size=2, num_dense=3)
    with pytest.raises(DataError) as info:
        list(reader)
    assert info.value.field == "data"
    assert f"{path}:3:" in str(info.value) and message in str(info.value)


def test_reader_refuses_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    for kwargs, field in [({"batch_size": 0}, "batch_size"),
                          ({"table_rows": ()}, "table_rows"),
                          ({"num_dense": 0}, "num_dense")]:
        args = {"table_rows": (4,), "batch_size": 2, "num_dense": 1} | kwargs
        with pytest.raises(DataError) as info:
            CriteoTSVReader(path, **args)  # type: ignore[arg-type]
        assert info.value.field == field
