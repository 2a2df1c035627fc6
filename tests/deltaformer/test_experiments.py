"""Tests for `furnace reproduce deltaformer`'s experiments (DeltaFormer, Xu et al., NeurIPS
2025): with the recipes shrunk to a few steps, the full set's tables are assembled from the
runs, and the kappa1 trade-off table reuses the runs of the experiments before it in the
same reproduce run (its `RunContext` artifacts), and only those."""

from __future__ import annotations

import pytest

from furnace.deltaformer import experiments as ex
from furnace.deltaformer.train import TrainConfig, train_many
from furnace.runtime.reproduce import RunContext


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(ex, "STEPS", {"swap": 3, "parity": 3, "modarith": 3})
    # small batches and evaluations too: the tables' assembly is under test, not accuracy
    monkeypatch.setattr(ex, "TrainConfig", lambda **kw: TrainConfig(
        **{"batch_size": 8, "eval_sequences": 64, **kw}))
    monkeypatch.setattr(ex, "LM_RECIPE", dict(task="lm", length=16, d_model=16, num_layers=1,
                                              num_heads=4, steps=3, batch_size=4,
                                              eval_sequences=8, corpus_bytes=200_000))
    trained = []
    real = train_many

    def counting(configs, workers=None, on_done=None):
        trained.extend(configs)
        return real(configs, workers=1, on_done=on_done)  # in-process: faster for 3 steps

    monkeypatch.setattr(ex, "train_many", counting)
    return trained


@pytest.mark.timeout(300)
def test_full_set_tables_and_reuse_of_runs(tiny, tmp_path):
    ctx = RunContext(out_dir=tmp_path, quick=False)
    tracking = ex.parity_modarith(ctx)
    assert len(tracking.tables[0].rows) == 8  # 2 tasks x (DeltaFormer + 3 Transformers)
    assert all(0 <= row[6] <= 1 for row in tracking.tables[0].rows)  # accuracy at T=64
    lm = ex.lm(ctx)
    assert len(lm.tables[0].rows) == 9 and (tmp_path / lm.figures[0]).exists()
    before = len(tiny)
    tradeoff = ex.kappa1(ctx)
    rows = tradeoff.tables[0].rows
    assert [row[0] for row in rows] == ["linear", "softmax", "relu", "round",
                                        "mix softmax,softmax,linear,linear"]
    # the LM runs and the linear parity/modarith runs come from before; swap was not run
    new = len(tiny) - before
    assert new == 3 * 5 - 2
    assert all(0 <= value <= 1 for row in rows for value in row[1:5])
    # another reproduce run shares nothing with this one: it trains every run again
    before = len(tiny)
    ex.lm(RunContext(out_dir=tmp_path, quick=False))
    assert len(tiny) - before == 9
