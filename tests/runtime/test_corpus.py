"""Tests of the stdlib byte corpus: file list, split by file, sizes, and batch windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from furnace.runtime import corpus as corpus_mod
from furnace.runtime.corpus import (
    FILE_SEPARATOR,
    Corpus,
    CorpusConfig,
    batches,
    eval_batches,
    load_corpus,
    stdlib_source_files,
)

SMALL = CorpusConfig(num_bytes=200_000, val_fraction=0.25)


@pytest.fixture(scope="module")
def small() -> Corpus:
    return load_corpus(SMALL)


def test_stdlib_files_sorted_and_filtered():
    files = stdlib_source_files()
    root = corpus_mod._stdlib_root()
    rel = [p.relative_to(root).as_posix() for p in files]
    assert len(files) > 50
    assert rel == sorted(rel)
    assert all(p.suffix == ".py" and p.is_file() for p in files)
    for r in rel:
        parts = r.split("/")[:-1]
        assert not set(parts) & {"site-packages", "test", "tests", "idlelib", "lib2to3"}, r
    assert stdlib_source_files(max_files=7) == files[:7]


def test_stdlib_files_missing_sources(monkeypatch, tmp_path):
    monkeypatch.setattr(corpus_mod, "_stdlib_root", lambda: tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stdlib_source_files()
    (tmp_path / "empty" / "test").mkdir(parents=True)
    (tmp_path / "empty" / "test" / "x.py").write_text("x = 1\n")
    monkeypatch.setattr(corpus_mod, "_stdlib_root", lambda: tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no .py files"):
        load_corpus(SMALL)


def test_load_is_deterministic(small):
    again = load_corpus(SMALL)
    assert torch.equal(small.train, again.train)
    assert torch.equal(small.val, again.val)
    assert (small.files_train, small.files_val) == (again.files_train, again.files_val)


def test_sizes_and_dtype(small):
    assert small.train.dtype == torch.uint8 and small.val.dtype == torch.uint8
    assert small.train.dim() == 1 and small.val.dim() == 1
    assert small.num_bytes == SMALL.num_bytes
    assert small.vocab_size == 256
    assert small.files_val >= 1 and small.files_train >= 3 * small.files_val - 3
    # the validation share of files is about val_fraction
    share = small.files_val / (small.files_train + small.files_val)
    assert 0.15 < share < 0.35


def test_split_is_by_whole_files(small):
    # rebuild the split from the documented rule and check each file's bytes land in
    # exactly one split, in order
    k = SMALL.val_every
    assert k == 4
    used = small.files_train + small.files_val
    files = stdlib_source_files()[:used]
    train_parts, val_parts = [], []
    for i, path in enumerate(files):
        (val_parts if i % k == k - 1 else train_parts).append(path.read_bytes() + FILE_SEPARATOR)
    expect_train = b"".join(train_parts)
    expect_val = b"".join(val_parts)
    train = bytes(small.train.tolist())
    val = bytes(small.val.tolist())
    # the last file is cut where the byte budget ends, so one split may be a prefix
    assert expect_train.startswith(train) and expect_val.startswith(val)
    assert len(train_parts) == small.files_train and len(val_parts) == small.files_val
    val_names = {p for i, p in enumerate(files) if i % k == k - 1}
    train_names = set(files) - val_names
    assert not val_names & train_names
    # the one cut file is the last one used, so all but it are whole
    last_split_short = (len(expect_train) - len(train)) + (len(expect_val) - len(val))
    assert last_split_short < len(files[-1].read_bytes()) + len(FILE_SEPARATOR)


def test_max_files_limits_bytes():
    c = load_corpus(CorpusConfig(num_bytes=10**9, val_fraction=0.5, max_files=6))
    assert c.files_train == 3 and c.files_val == 3
    total = sum(len(p.read_bytes()) + 2 for p in stdlib_source_files(max_files=6))
    assert c.num_bytes == total


def test_config_errors():
    with pytest.raises(ValueError, match="num_bytes"):
        CorpusConfig(num_bytes=0)
    for bad in (0.0, -0.1, 0.6, float("nan")):
        with pytest.raises(ValueError, match="val_fraction"):
            CorpusConfig(val_fraction=bad)
    with pytest.raises(ValueError, match="max_files"):
        CorpusConfig(max_files=0)
    with pytest.raises(ValueError, match="max_files"):
        stdlib_source_files(max_files=0)
    with pytest.raises(ValueError, match="too few"):
        load_corpus(CorpusConfig(num_bytes=10, val_fraction=0.1))


def test_batches_shapes_and_shift(small):
    g = torch.Generator().manual_seed(0)
    it = batches(small.train, batch_size=5, seq_len=33, generator=g)
    for _ in range(3):
        x, y = next(it)
        assert x.shape == (5, 33) and y.shape == (5, 33)
        assert x.dtype == torch.int64 and y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert int(x.min()) >= 0 and int(x.max()) < 256
    # every row is a real window of the data
    data = small.train.long()
    for row_x, row_y in zip(x, y, strict=True):
        starts = torch.nonzero(data[:-33] == row_x[0]).reshape(-1)
        assert any(torch.equal(data[s:s + 33], row_x)
                   and torch.equal(data[s + 1:s + 34], row_y) for s in starts.tolist())


def test_batches_use_only_the_generator(small):
    def take(seed):
        it = batches(small.train, batch_size=4, seq_len=16,
                     generator=torch.Generator().manual_seed(seed))
        return [next(it) for _ in range(4)]

    torch.manual_seed(1)
    a = take(7)
    torch.manual_seed(2)
    global_state = torch.get_rng_state()
    b = take(7)
    # the global RNG was not advanced
    assert torch.equal(global_state, torch.get_rng_state())
    c = take(8)
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb)
               for (xa, ya), (xb, yb) in zip(a, b, strict=True))
    assert not all(torch.equal(xa, xc) for (xa, _), (xc, _) in zip(a, c, strict=True))


def test_batches_errors(small):
    g = torch.Generator()
    with pytest.raises(ValueError, match="seq_len"):
        batches(small.train[:10], batch_size=1, seq_len=10, generator=g)
    with pytest.raises(ValueError, match="batch_size"):
        batches(small.train, batch_size=0, seq_len=10, generator=g)
    with pytest.raises(ValueError, match="seq_len"):
        batches(small.train, batch_size=1, seq_len=0, generator=g)
    with pytest.raises(ValueError, match="1-D"):
        batches(small.train[:100].reshape(2, -1), batch_size=1, seq_len=4, generator=g)
    with pytest.raises(ValueError, match="generator"):
        batches(small.train, batch_size=1, seq_len=4, generator=0)
    with pytest.raises(ValueError, match="max_batches"):
        eval_batches(small.train, 1, 4, 0)


def test_eval_batches_deterministic_non_overlapping():
    data = torch.arange(0, 200, dtype=torch.uint8)
    out = list(eval_batches(data, 3, 10))
    # (200 - 1) // 10 = 19 windows: six batches of 3 and one of 1
    assert [x.shape[0] for x, _ in out] == [3] * 6 + [1]
    xs = torch.cat([x for x, _ in out])
    ys = torch.cat([y for _, y in out])
    assert torch.equal(xs.reshape(-1), torch.arange(190))
    assert torch.equal(ys.reshape(-1), torch.arange(1, 191))
    assert len(list(eval_batches(data, 3, 10, max_batches=2))) == 2
    again = list(eval_batches(data, 3, 10))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out, again, strict=True))


def test_real_corpus_default_config_is_text():
    c = load_corpus()
    assert c.num_bytes == CorpusConfig().num_bytes
    assert b"def " in bytes(c.val[:50_000].tolist())
    assert isinstance(stdlib_source_files()[0], Path)
