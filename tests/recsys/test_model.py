"""Tests of DLRM's dense part, pooling and the update rules (`furnace.recsys.model`,
`furnace.recsys.optim`, `furnace.recsys.naive`; pattern-aware sparse communication, He, Chen,
Zhai, PPoPP '24 poster, design note Sec. 2.6 and Sec. 7): the interactions and pooling equal
explicit loops, the sparse optimizers equal hand-computed updates on touched rows only, and
the reference trainer's step equals an independent autograd + ``torch.optim`` step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from furnace.recsys.batch import Batch
from furnace.recsys.config import DataConfig, ModelConfig, OptimizerConfig
from furnace.recsys.model import (
    DLRM,
    bce_loss,
    dense_flops,
    init_embeddings,
    init_parameters,
    pool,
    pool_batch,
)
from furnace.recsys.naive import ReferenceTrainer, roc_auc
from furnace.recsys.optim import SparseOptimizerState, dense_step, new_state, sparse_step
from furnace.runtime.testing import assert_close

# single process on CPU; every comparison is in float64 to tolerances (1e-12 relative) far
# above any change of reduction order a thread count can cause
pytestmark = pytest.mark.thread_independent

TABLES = (5, 7, 3)
NUM_DENSE = 4


def _model_config(interaction: str) -> ModelConfig:
    return ModelConfig(embedding_dim=4, bottom_mlp=(6, 4), top_mlp=(5, 3, 1),
                       interaction=interaction, cross_layers=2)


def _model(interaction: str, seed: int = 0) -> DLRM:
    model = DLRM(_model_config(interaction), NUM_DENSE, len(TABLES)).to(torch.float64)
    init_parameters(model, seed=seed)
    return model


def _batch(seed: int, batch_size: int = 6, *, multi_hot: bool = False) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    ids, offsets = [], []
    for rows in TABLES:
        if multi_hot:
            lengths = torch.randint(0, 4, (batch_size,), generator=gen)
        else:
            lengths = torch.ones(batch_size, dtype=torch.int64)
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))
        ids.append(torch.randint(0, rows, (int(lengths.sum()),), generator=gen))
    dense = torch.rand(batch_size, NUM_DENSE, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (batch_size,), generator=gen).to(torch.float64)
    return Batch(dense, tuple(ids), tuple(offsets), labels)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_forward_shapes(interaction: str) -> None:
    model = _model(interaction)
    t, d = len(TABLES), 4
    dense = torch.rand(6, NUM_DENSE, dtype=torch.float64)
    pooled = torch.rand(6, t, d, dtype=torch.float64)
    assert model(dense, pooled).shape == (6,)
    top_in = d + (t + 1) * t // 2 if interaction == "dot" else (t + 1) * d
    assert model.top[0].in_features == top_in
    assert model.interact(model.bottom(dense), pooled).shape == (6, top_in)
    # a ReLU after every bottom layer (TorchRec DenseArch), none after the logit
    assert isinstance(model.bottom[-1], torch.nn.ReLU)
    assert isinstance(model.top[-1], torch.nn.Linear)
    assert len(model.cross) == (2 if interaction == "dcn" else 0)
    with pytest.raises(ValueError, match="pooled"):
        model(dense, pooled[:, :2])


def test_dot_interaction_equals_loop_of_pairwise_dots() -> None:
    model = _model("dot")
    gen = torch.Generator().manual_seed(1)
    dense_out = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    pooled = torch.randn(3, len(TABLES), 4, generator=gen, dtype=torch.float64)
    out = model.interact(dense_out, pooled)
    for b in range(3):
        features = [dense_out[b]] + [pooled[b, t] for t in range(len(TABLES))]
        expected = list(dense_out[b])
        for i in range(len(features)):
            for j in range(i + 1, len(features)):
                expected.append(torch.dot(features[i], features[j]))
        assert_close(f"dot interaction sample {b}", torch.stack(expected), out[b], 1e-14)


def test_dcn_interaction_equals_loop_of_cross_layers() -> None:
    model = _model("dcn")
    gen = torch.Generator().manual_seed(2)
    dense_out = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    pooled = torch.randn(3, len(TABLES), 4, generator=gen, dtype=torch.float64)
    out = model.interact(dense_out, pooled)
    for b in range(3):
        x0 = torch.cat([dense_out[b]] + [pooled[b, t] for t in range(len(TABLES))])
        x = x0.clone()
        for layer in model.cross:
            w, bias = layer.weight, layer.bias
            x = torch.stack([x0[i] * (sum(w[i, k] * x[k] for k in range(len(x))) + bias[i])
                             + x[i] for i in range(len(x))])
        assert_close(f"dcn interaction sample {b}", x, out[b], 1e-13)


def test_pool_equals_loop_with_empty_and_repeated_ids() -> None:
    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    gids = torch.tensor([2, 2, 5, 0, 8, 8, 8, 1])
    offsets = torch.tensor([0, 3, 3, 4, 7, 8])          # bag 1 is empty
    out = pool(weights, gids, offsets)
    assert out.shape == (5, 4)
    for b in range(5):
        expected = torch.zeros(4, dtype=torch.float64)
        for k in range(int(offsets[b]), int(offsets[b + 1])):
            expected = expected + weights[gids[k]]
        assert_close(f"bag {b}", expected, out[b], 1e-15, scale=1.0)
    assert torch.count_nonzero(out[1]) == 0
    # gradient: each row gets the output gradient of every bag it appears in
    leaf = weights.clone().requires_grad_(True)
    pool(leaf, gids, offsets).sum().backward()
    assert leaf.grad is not None
    counts = torch.bincount(gids, minlength=9).to(torch.float64)
    assert torch.equal(leaf.grad, counts[:, None].expand(9, 4))


def test_pool_batch_uses_table_offsets() -> None:
    batch = _batch(4, multi_hot=True)
    weights = init_embeddings(TABLES, 4, seed=0, dtype=torch.float64)
    offsets = (0, 5, 12)
    out = pool_batch(weights, batch, offsets)
    assert out.shape == (6, 3, 4)
    for t in range(3):
        table = weights[offsets[t]:offsets[t] + TABLES[t]]
        assert_close(f"table {t}", pool(table, batch.ids[t], batch.offsets[t]), out[:, t],
                     1e-15, scale=1.0)


def test_init_is_a_pure_function_of_seed() -> None:
    a, b, c = _model("dot", seed=5), _model("dot", seed=5), _model("dot", seed=6)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
    f32 = DLRM(_model_config("dot"), NUM_DENSE, len(TABLES))
    init_parameters(f32, seed=5)
    for p32, p64 in zip(f32.parameters(), a.parameters()):
        assert torch.equal(p32, p64.to(torch.float32))
    w = init_embeddings(TABLES, 4, seed=1, dtype=torch.float64)
    assert torch.equal(w, init_embeddings(TABLES, 4, seed=1, dtype=torch.float64))
    assert not torch.equal(w, init_embeddings(TABLES, 4, seed=2, dtype=torch.float64))
    assert torch.equal(init_embeddings(TABLES, 4, seed=1), w.to(torch.float32))
    # each table has its own stream: a table's rows do not depend on the tables after it
    assert torch.equal(init_embeddings((5, 2), 4, seed=1, dtype=torch.float64)[:5], w[:5])
    start = 0
    for rows in TABLES:
        assert w[start:start + rows].abs().max() <= 1 / math.sqrt(rows)
        start += rows


def test_bce_loss_total_makes_local_losses_shares_of_the_global_mean() -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(8, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (8,), generator=gen).to(torch.float64)
    full = F.binary_cross_entropy_with_logits(logits, labels)
    assert_close("mean", full, bce_loss(logits, labels), 1e-15)
    shares = bce_loss(logits[:3], labels[:3], total=8) + bce_loss(logits[3:], labels[3:], total=8)
    assert_close("shares", full, shares, 1e-15)


def test_dense_flops_by_hand() -> None:
    # bottom 4->6->4, T=3: dot Gram 4*4*4, top (4+6)->5->3->1
    dot = 2 * (4 * 6 + 6 * 4) + 2 * 4 * 4 * 4 + 2 * (10 * 5 + 5 * 3 + 3 * 1)
    assert dense_flops(_model_config("dot"), 4, 3, 10) == 10 * dot
    width = 16
    dcn = (2 * (4 * 6 + 6 * 4) + 2 * (2 * width * width + 2 * width)
           + 2 * (width * 5 + 5 * 3 + 3 * 1))
    assert dense_flops(_model_config("dcn"), 4, 3, 1) == dcn


def _sparse_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(8)
    weights = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    rows = torch.tensor([4, 1, 2])
    grads = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    return weights, rows, grads


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_sparse_sgd_equals_hand_update(weight_decay: float) -> None:
    weights, rows, grads = _sparse_case()
    before = weights.clone()
    config = OptimizerConfig(sparse="sgd", lr=0.3, weight_decay=weight_decay)
    assert new_state(6, config) is None
    sparse_step(weights, None, rows, grads, config)
    for k, r in enumerate(rows.tolist()):
        for j in range(3):
            g = grads[k, j].item() + weight_decay * before[r, j].item()
            assert weights[r, j].item() == pytest.approx(before[r, j].item() - 0.3 * g,
                                                         rel=1e-14, abs=1e-15)
    untouched = [0, 3, 5]
    assert torch.equal(weights[untouched], before[untouched])


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_sparse_rowwise_adagrad_equals_hand_update(weight_decay: float) -> None:
    weights, rows, grads = _sparse_case()
    before = weights.clone()
    config = OptimizerConfig(sparse="rowwise_adagrad", lr=0.3, weight_decay=weight_decay,
                             eps=1e-6, initial_accumulator=0.25)
    state = new_state(6, config, torch.float64)
    assert state is not None and torch.equal(state, torch.full((6,), 0.25, dtype=torch.float64))
    for _ in range(2):   # the second step reads the first step's accumulator
        start_w, start_s = weights.clone(), state.clone()
        SparseOptimizerState(config, state).step(weights, rows, grads)
        for k, r in enumerate(rows.tolist()):
            g = [grads[k, j].item() + weight_decay * start_w[r, j].item() for j in range(3)]
            acc = start_s[r].item() + sum(x * x for x in g) / 3
            assert state[r].item() == pytest.approx(acc, rel=1e-14)
            for j in range(3):
                expected = start_w[r, j].item() - 0.3 * g[j] / (math.sqrt(acc) + 1e-6)
                assert weights[r, j].item() == pytest.approx(expected, rel=1e-13, abs=1e-15)
        untouched = [0, 3, 5]
        assert torch.equal(weights[untouched], before[untouched])
        assert torch.equal(state[untouched], torch.full((3,), 0.25, dtype=torch.float64))


def test_sparse_step_refuses_mismatched_grads_and_missing_state() -> None:
    weights, rows, grads = _sparse_case()
    with pytest.raises(ValueError, match="grads"):
        sparse_step(weights, None, rows, grads[:2], OptimizerConfig())
    with pytest.raises(ValueError, match="state"):
        sparse_step(weights, None, rows, grads, OptimizerConfig(sparse="rowwise_adagrad"))
    empty = torch.zeros(0, dtype=torch.int64)
    sparse_step(weights, None, empty, torch.zeros(0, 3, dtype=torch.float64), OptimizerConfig())


def test_dense_step_is_plain_sgd_and_drops_grads() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    q = torch.nn.Parameter(torch.tensor([3.0], dtype=torch.float64))
    p.grad = torch.tensor([0.5, 1.0], dtype=torch.float64)
    dense_step([p, q], OptimizerConfig(dense_lr=0.2))
    assert torch.equal(p.detach(), torch.tensor([0.9, -2.2], dtype=torch.float64))
    assert p.grad is None and torch.equal(q.detach(), torch.tensor([3.0], dtype=torch.float64))


def _independent_sgd(data: DataConfig, model_config: ModelConfig, optim: OptimizerConfig,
                     batches: list[Batch], seed: int) -> tuple[torch.Tensor, DLRM]:
    """The same training by a different route: ``F.embedding_bag`` for pooling, the mean BCE
    of torch, ``torch.optim.SGD`` for every update (weight decay on the table only)."""
    model = DLRM(model_config, data.num_dense, data.num_tables).to(torch.float64)
    init_parameters(model, seed=seed)
    table = torch.nn.Parameter(init_embeddings(data.table_rows, model_config.embedding_dim,
                                               seed=seed, dtype=torch.float64))
    opt = torch.optim.SGD([{"params": [table], "lr": optim.lr,
                            "weight_decay": optim.weight_decay},
                           {"params": list(model.parameters()), "lr": optim.dense_lr}])
    starts = np.concatenate([[0], np.cumsum(data.table_rows)[:-1]])
    for batch in batches:
        pooled = torch.stack([F.embedding_bag(ids + int(start), table, off[:-1], mode="sum")
                              for ids, off, start in zip(batch.ids, batch.offsets, starts)],
                             dim=1)
        loss = F.binary_cross_entropy_with_logits(model(batch.dense, pooled), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return table.detach(), model


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_reference_step_equals_autograd_and_torch_sgd(interaction: str) -> None:
    data = DataConfig(table_rows=TABLES, num_dense=NUM_DENSE)
    model_config = _model_config(interaction)
    optim = OptimizerConfig(sparse="sgd", lr=0.4, dense_lr=0.2)
    batches = [_batch(10 + i, multi_hot=True) for i in range(3)]
    trainer = ReferenceTrainer(data, model_config, optim, seed=3)
    for batch in batches:
        trainer.step(batch)
    table, model = _independent_sgd(data, model_config, optim, batches, seed=3)
    assert_close("weights", table, trainer.weights, 1e-12)
    for (name, ref), actual in zip(model.named_parameters(), trainer.model.parameters()):
        assert_close(name, ref, actual, 1e-12)


def test_reference_weight_decay_touches_only_batch_rows() -> None:
    data = DataConfig(table_rows=TABLES, num_dense=NUM_DENSE)
    optim = OptimizerConfig(sparse="sgd", lr=0.4, dense_lr=0.2, weight_decay=0.1)
    batch = _batch(20)
    trainer = ReferenceTrainer(data, _model_config("dot"), optim, seed=1)
    before = trainer.weights.clone()
    trainer.step(batch)
    # torch's SGD decays every row; the lazy rule only the touched ones
    table, model = _independent_sgd(data, _model_config("dot"), optim, [batch], seed=1)
    touched = torch.unique(torch.cat(batch.global_ids((0, 5, 12))))
    untouched = torch.ones(sum(TABLES), dtype=torch.bool)
    untouched[touched] = False
    assert_close("touched rows", table[touched], trainer.weights[touched], 1e-12)
    assert torch.equal(trainer.weights[untouched], before[untouched])
    for (name, ref), actual in zip(model.named_parameters(), trainer.model.parameters()):
        assert_close(name, ref, actual, 1e-12)


def test_reference_evaluate_and_adagrad_state() -> None:
    data = DataConfig(table_rows=TABLES, num_dense=NUM_DENSE)
    optim = OptimizerConfig(sparse="rowwise_adagrad", initial_accumulator=0.1)
    trainer = ReferenceTrainer(data, _model_config("dcn"), optim, seed=0)
    batch = _batch(30)
    loss, logits = trainer.evaluate(batch)
    assert logits.shape == (6,) and logits.dtype == torch.float64
    assert trainer.step(batch) == pytest.approx(loss, rel=1e-14)
    touched = torch.unique(torch.cat(batch.global_ids(trainer.table_offsets)))
    assert trainer.state is not None
    untouched = torch.ones(sum(TABLES), dtype=torch.bool)
    untouched[touched] = False
    # a touched row whose gradient happens to be zero (a dead ReLU) keeps its accumulator
    assert bool((trainer.state[touched] >= 0.1).all()) and bool((trainer.state > 0.1).any())
    assert torch.equal(trainer.state[untouched], torch.full((int(untouched.sum()),), 0.1,
                                                            dtype=torch.float64))
    params = trainer.full_parameters()
    assert set(params) == {"weights", "state", *trainer.model.state_dict()}


def test_roc_auc_equals_pair_count_with_ties() -> None:
    labels = np.array([1, 0, 1, 0, 0, 1, 1, 0])
    scores = np.array([0.9, 0.1, 0.4, 0.4, 0.8, 0.4, 0.2, 0.05])
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert roc_auc(labels, scores) == pytest.approx(pairs, rel=1e-15)
    assert math.isnan(roc_auc(np.ones(3), np.arange(3.0)))
