"""TorchRec's table-wise baseline (`furnace.recsys.torchrec_baseline`, design note `recsys.md`
Sec. 4 "TorchRec specifics") against the single-process reference: from the same seed its
losses follow `naive.ReferenceTrainer`'s in float32, with fbgemm's fused EXACT_SGD and
EXACT_ROWWISE_ADAGRAD, on 2 gloo ranks; and the intercepted byte counts are the KJT and pooled
all-to-alls plus the dense all-reduce. Skipped, with the install command, without TorchRec.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from furnace.recsys.config import DataConfig, ModelConfig, OptimizerConfig
from furnace.recsys.data import SyntheticClickLog
from furnace.recsys.naive import ReferenceTrainer
from furnace.recsys.torchrec_baseline import (
    CollectiveCounts,
    available,
    intercept_collectives,
)
from furnace.runtime.launch import run_distributed

AVAILABLE, MESSAGE = available()
needs_torchrec = pytest.mark.skipif(not AVAILABLE, reason=MESSAGE)

WORLD = 2
STEPS = 3
DATA = DataConfig(table_rows=(5, 17, 3, 30), num_dense=3, zipf_exponent=1.0, bag_size=2, seed=1)
MODEL = ModelConfig(embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1))
OPTIMIZERS = ("sgd", "rowwise_adagrad")


def _optim(sparse: str) -> OptimizerConfig:
    return OptimizerConfig(sparse=sparse, lr=0.2, dense_lr=0.1)


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    from furnace.recsys.torchrec_baseline import TorchRecTrainer
    out: dict[str, Any] = {}
    for sparse in OPTIMIZERS:
        trainer = TorchRecTrainer(DATA, MODEL, _optim(sparse), seed=0, world_size=world_size)
        batches = SyntheticClickLog(DATA).batches(8 * world_size, STEPS)
        out[sparse] = {"losses": [trainer.step(b) for b in batches],
                       "counts": trainer.counts.to_dict(), "owners": trainer.table_owner}
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_distributed(_worker, WORLD, timeout_s=150)


@needs_torchrec
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sparse", OPTIMIZERS)
def test_losses_follow_reference(results: list[dict[str, Any]], sparse: str) -> None:
    reference = ReferenceTrainer(DATA, MODEL, _optim(sparse), seed=0, dtype=torch.float32)
    expected = [reference.step(b) for b in SyntheticClickLog(DATA).batches(8 * WORLD, STEPS)]
    for rank in range(WORLD):
        got = results[rank][sparse]["losses"]
        # the first loss checks the copied init; the later ones the update rules
        assert got == pytest.approx(expected, rel=1e-4), (rank, got, expected)
    assert len(set(expected)) == STEPS  # the parameters did move


@needs_torchrec
@pytest.mark.timeout(180)
def test_intercepted_bytes(results: list[dict[str, Any]]) -> None:
    counts = results[0]["sgd"]["counts"]
    assert counts["calls"]["all_to_all_single"] > 0
    assert counts["bytes_sent"]["all_to_all_single"] > 0
    # one dense all-reduce per step (the loss average is not counted): ring, 2 (p-1)/p N
    dense_params = sum(p.numel() for p in ReferenceTrainer(DATA, MODEL, _optim("sgd")).model
                       .parameters())
    assert counts["calls"]["all_reduce"] == STEPS
    assert counts["bytes_sent"]["all_reduce"] == STEPS * dense_params * 4
    assert set(results[0]["sgd"]["owners"]) <= set(range(WORLD))


def test_counts_add_up_and_interception_restores_dist() -> None:
    # the tally, and torch.distributed is left as it was after the block
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    counts = CollectiveCounts()
    counts.add("all_to_all_single", 12)
    counts.add("all_to_all_single", 4)
    assert counts.total == 16 and counts.calls["all_to_all_single"] == 2
    originals = (torch.distributed.all_to_all_single, torch.distributed.all_reduce)
    with intercept_collectives() as c:
        assert isinstance(c, CollectiveCounts)
        assert torch.distributed.all_to_all_single is not originals[0]
    assert (torch.distributed.all_to_all_single, torch.distributed.all_reduce) == originals


def test_available_message() -> None:
    ok, message = available()
    assert isinstance(ok, bool) and message
    if not ok:
        assert "requirements/recsys-baselines.txt" in message
