"""Tests of the tiny MoE LM: shapes, causality, training, routing traces, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from furnace.moe.layer import MoELayer
from furnace.moe.lm import MoELMConfig, MoETransformerLM, RoutingTrace, train_lm
from furnace.runtime.corpus import CorpusConfig, load_corpus

TINY = MoELMConfig(d_model=32, num_layers=2, num_heads=2, seq_len=32, num_experts=4,
                   top_k=2, d_hidden=64)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(CorpusConfig(num_bytes=100_000, val_fraction=0.2))


@pytest.mark.timeout(120)
def test_forward_shapes_and_loss():
    model = MoETransformerLM(TINY)
    idx = torch.randint(0, 256, (3, 20))
    logits, loss = model(idx)
    assert logits.shape == (3, 20, 256) and loss is None
    assert torch.isfinite(logits).all()
    logits2, loss = model(idx, torch.randint(0, 256, (3, 20)))
    assert loss.dim() == 0 and torch.isfinite(loss)
    # near-uniform predictions at init
    assert abs(loss.item() - np.log(256)) < 0.5
    layers = model.moe_layers()
    assert len(layers) == TINY.num_layers and all(isinstance(m, MoELayer) for m in layers)
    assert all(m.parallel is None for m in layers)


@pytest.mark.timeout(120)
def test_balance_loss_weight_enters_loss(monkeypatch):
    cfg = MoELMConfig(d_model=32, num_layers=2, num_heads=2, seq_len=16, num_experts=4)
    model = MoETransformerLM(cfg)
    idx = torch.randint(0, 256, (2, 16))
    _, plain = model(idx, idx)
    # the naive gate has no aux loss, so give each layer one to see the weighted sum
    orig = MoELayer.forward

    def forward_with_aux(self, x):
        out = orig(self, x)
        self.balance_loss = torch.tensor(2.0)
        return out

    monkeypatch.setattr(MoELayer, "forward", forward_with_aux)
    _, unweighted = model(idx, idx)
    assert torch.allclose(unweighted, plain)
    model.config.balance_loss_weight = 0.5
    _, weighted = model(idx, idx)
    assert torch.allclose(weighted, plain + 0.5 * 2.0 * cfg.num_layers)


@pytest.mark.timeout(120)
def test_causal():
    model = MoETransformerLM(TINY).eval()
    idx = torch.randint(0, 256, (2, 24))
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % 256
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert torch.equal(a[:, :15], b[:, :15])
    assert not torch.allclose(a[:, 15:], b[:, 15:])


@pytest.mark.timeout(120)
def test_forward_errors():
    model = MoETransformerLM(TINY)
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="targets shape"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))


def test_config_errors():
    with pytest.raises(ValueError, match="divide"):
        MoELMConfig(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="top_k"):
        MoELMConfig(num_experts=2, top_k=3)
    with pytest.raises(ValueError, match="gate"):
        MoELMConfig(gate="nope")
    # gates whose rule is defined for one number of choices refuse the others up front
    with pytest.raises(ValueError, match="top_k must be 1"):
        MoELMConfig(gate="switch", top_k=2)
    with pytest.raises(ValueError, match="top_k must be 2"):
        MoELMConfig(gate="gshard", top_k=1)
    assert MoELMConfig(gate="switch", top_k=1).top_k == 1
    with pytest.raises(ValueError, match="num_layers"):
        MoELMConfig(num_layers=0)
    with pytest.raises(ValueError, match="dropout"):
        MoELMConfig(dropout=1.0)
    with pytest.raises(ValueError, match="balance_loss_weight"):
        MoELMConfig(balance_loss_weight=-1.0)
    with pytest.raises(TypeError):
        MoELMConfig(256)  # keyword-only


@pytest.fixture(scope="module")
def trained(corpus):
    return train_lm(TINY, corpus, steps=30, batch_size=8, seed=3, eval_every=15)


@pytest.mark.timeout(120)
def test_training_lowers_loss(trained):
    losses = trained.losses
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert np.isfinite(trained.val_loss) and trained.val_loss < losses[0]
    assert [s for s, _ in trained.val_history] == [14, 29]
    assert not trained.model.training


@pytest.mark.timeout(120)
def test_trace_shapes_and_sums(trained):
    trace = trained.trace
    counts = trace.counts
    assert counts.shape == (30, TINY.num_layers, TINY.num_experts)
    assert counts.dtype == np.int64
    tokens = 8 * TINY.seq_len
    assert trace.tokens == [tokens] * 30
    # the naive gate drops nothing: every token makes top_k assignments in every layer
    assert (counts.sum(axis=-1) == tokens * TINY.top_k).all()
    hot = trace.hot_share()
    assert hot.shape == (30, TINY.num_layers)
    assert ((hot >= 1 / TINY.num_experts) & (hot <= 0.5 + 1e-12)).all()
    summary = trace.skew_summary()
    assert summary["steps"] == 30 and summary["uniform_share"] == 0.25
    assert summary["hot_share_mean"] == pytest.approx(hot.mean())
    assert np.allclose(np.sum(summary["expert_share"], axis=1), 1.0)
    assert summary["imbalance_mean"] >= 1.0


@pytest.mark.timeout(120)
def test_trace_json_roundtrip(trained):
    again = RoutingTrace.from_json(trained.trace.to_json())
    assert again == trained.trace
    assert np.array_equal(again.counts, trained.trace.counts)
    with pytest.raises(ValueError, match="RoutingTrace"):
        RoutingTrace.from_json('{"num_layers": 1}')
    with pytest.raises(ValueError, match="rows"):
        RoutingTrace(num_layers=1, num_experts=2, top_k=1, steps=[[[1, 2, 3]]], tokens=[3])


@pytest.mark.timeout(120)
def test_counts_for_splits(trained):
    trace = trained.trace
    for ranks in (1, 3, 4, 7):
        for step, layer in ((0, 0), (29, 1), (-1, -1)):
            rows = trace.counts_for(ranks, step, layer)
            assert len(rows) == ranks and all(len(r) == TINY.num_experts for r in rows)
            assert np.array_equal(np.sum(rows, axis=0), trace.counts[step, layer])
            # as even as possible, remainder to the lowest ranks
            arr = np.array(rows)
            assert (arr.max(axis=0) - arr.min(axis=0) <= 1).all()
            assert (np.diff(arr, axis=0) <= 0).all()
    hand = RoutingTrace(num_layers=1, num_experts=3, top_k=1, steps=[[[7, 0, 2]]], tokens=[9])
    assert hand.counts_for(3, 0, 0) == [[3, 0, 1], [2, 0, 1], [2, 0, 0]]
    with pytest.raises(ValueError, match="num_ranks"):
        trace.counts_for(0, 0, 0)
    with pytest.raises(ValueError, match="step"):
        trace.counts_for(2, 30, 0)
    with pytest.raises(ValueError, match="layer"):
        trace.counts_for(2, 0, 2)


@pytest.mark.timeout(120)
def test_record_errors():
    model = MoETransformerLM(TINY)
    trace = RoutingTrace.for_model(model)
    with pytest.raises(ValueError, match="not run a forward"):
        trace.record(model)
    model(torch.randint(0, 256, (1, 8)))
    trace.record(model)
    assert trace.counts.shape == (1, 2, 4) and trace.tokens == [8]


@pytest.mark.timeout(120)
def test_train_lm_deterministic(corpus):
    cfg = MoELMConfig(d_model=16, num_layers=1, num_heads=2, seq_len=16, num_experts=4,
                      d_hidden=32, dropout=0.1)
    seen = []
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = train_lm(cfg, corpus, steps=8, batch_size=4, seed=5,
                 progress=lambda s, loss: seen.append((s, loss)))
    # the caller's RNG is untouched
    assert torch.equal(state, torch.get_rng_state())
    b = train_lm(cfg, corpus, steps=8, batch_size=4, seed=5)
    c = train_lm(cfg, corpus, steps=8, batch_size=4, seed=6)
    assert a.losses == b.losses and a.val_loss == b.val_loss
    assert a.trace == b.trace
    assert a.losses != c.losses
    assert seen == list(enumerate(a.losses))
    # the shared loop's record: a constant learning rate, every step done
    assert a.lrs == [3e-3] * 8 and a.steps_done == 8 and a.diverged_at is None


def test_train_lm_errors(corpus):
    with pytest.raises(ValueError, match="steps"):
        train_lm(TINY, corpus, steps=0)
    with pytest.raises(ValueError, match="lr"):
        train_lm(TINY, corpus, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="vocab_size"):
        train_lm(MoELMConfig(vocab_size=128, d_model=16, num_heads=2), corpus, steps=1)
    big = MoELMConfig(d_model=16, num_heads=2, seq_len=10**6)
    with pytest.raises(ValueError, match="split"):
        train_lm(big, corpus, steps=1)
