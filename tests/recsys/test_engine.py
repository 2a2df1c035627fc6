"""The sharded engine against the single-process reference (design note `recsys.md` Sec. 2.6):
after several steps every parameter equals `naive.ReferenceTrainer`'s in float64, for every
scheme, both sparse optimizers, hot sets empty, partial and all, with and without the
scheduling (prefetch, overlap, pairwise rounds, fused all-reduce), on 2 and 4 gloo ranks; and
the CommLog's bytes per (phase, rank) equal `accounting.exact_bytes` counted from the batches.
All cases of one world size run in one spawn, since starting ranks costs seconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch

from furnace.recsys.accounting import exact_bytes
from furnace.recsys.batch import Batch
from furnace.recsys.config import (
    DataConfig,
    EngineConfig,
    ModelConfig,
    OptimizerConfig,
    ShardingPlan,
)
from furnace.recsys.data import SyntheticClickLog
from furnace.recsys.engine import ShardedTrainer, needs_touched_counts
from furnace.recsys.naive import ReferenceTrainer
from furnace.recsys.plan import make_plan
from furnace.runtime.launch import run_distributed
from furnace.runtime.presets import emulated_link
from furnace.runtime.twolevel import LevelCounter

TABLES = (3, 7, 20, 40, 5)
STEPS = 3
D = 4
TOLERANCE = 1e-10  # relative to the largest parameter magnitude (nonzero: init is random)

MODEL = ModelConfig(embedding_dim=D, bottom_mlp=(8, D), top_mlp=(8, 1))


def _cases(world_size: int) -> list[dict[str, Any]]:
    cases = []
    total = sum(TABLES)
    log = SyntheticClickLog(DataConfig(table_rows=TABLES, zipf_exponent=1.2, seed=3))
    ranked = sorted(range(total), key=lambda g: -log.probabilities()[g])
    hot_sets = {"empty": (), "partial": tuple(sorted(ranked[:6])), "all": tuple(range(total))}
    for scheme in ("table_pooled", "row", "row_dedup", "hybrid"):
        for sparse in ("sgd", "rowwise_adagrad"):
            for hot in (("empty", "partial", "all") if scheme == "hybrid" else ("empty",)):
                for scheduled in (False, True):
                    cases.append(dict(scheme=scheme, sparse=sparse, hot=hot_sets[hot],
                                      hot_name=hot, scheduled=scheduled, bag_size=1,
                                      weight_decay=0.0))
    # multi-hot bags and weight decay (which needs the touched counts) on the full design
    for scheduled in (False, True):
        cases.append(dict(scheme="hybrid", sparse="rowwise_adagrad", hot=hot_sets["partial"],
                          hot_name="partial", scheduled=scheduled, bag_size=2,
                          weight_decay=0.01))
    cases.append(dict(scheme="table_pooled", sparse="sgd", hot=(), hot_name="empty",
                      scheduled=True, bag_size=2, weight_decay=0.01))
    if world_size == 4:
        # two nodes of two ranks: hierarchical all-reduces (dense, hot, fused)
        for scheme, hot, scheduled, decay in (("hybrid", "partial", False, 0.01),
                                              ("hybrid", "partial", True, 0.0),
                                              ("hybrid", "all", True, 0.0),
                                              ("row_dedup", "empty", False, 0.0),
                                              ("table_pooled", "empty", True, 0.0)):
            cases.append(dict(scheme=scheme, sparse="rowwise_adagrad", hot=hot_sets[hot],
                              hot_name=hot, scheduled=scheduled, bag_size=1,
                              weight_decay=decay, ranks_per_node=2))
    return cases


def _configs(case: dict[str, Any]) -> tuple[DataConfig, OptimizerConfig, EngineConfig]:
    data = DataConfig(table_rows=TABLES, num_dense=3, zipf_exponent=1.2,
                      bag_size=case["bag_size"], seed=3)
    optim = OptimizerConfig(sparse=case["sparse"], lr=0.3, dense_lr=0.2,
                            weight_decay=case["weight_decay"])
    engine = (EngineConfig.scheduled(case["scheme"]) if case["scheduled"]
              else EngineConfig(scheme=case["scheme"]))
    return data, optim, engine


def _worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    out = []
    for case in _cases(world_size):
        data, optim, engine = _configs(case)
        plan = make_plan(case["scheme"], table_rows=TABLES, world_size=world_size,
                         hot_rows=case["hot"])
        per_node = case.get("ranks_per_node", 1)
        counter = LevelCounter(emulated_link(bandwidth_Bps=1e9, ranks_per_node=per_node),
                               by="group")
        trainer = ShardedTrainer(data, MODEL, optim, plan, engine, seed=5,
                                 ranks_per_node=per_node, on_traffic=counter)
        batches = list(SyntheticClickLog(data).batches(8 * world_size, STEPS))
        losses = [trainer.step(b, batches[i + 1] if i + 1 < STEPS else None)
                  for i, b in enumerate(batches)]
        logged: dict[tuple[str, int], int] = defaultdict(int)
        for record in trainer.comm_log.records:
            logged[record.group, rank] += record.bytes_sent
        inter = {(phase, rank): levels.get("inter_node", 0)
                 for phase, levels in counter.bytes.items()}
        out.append({"losses": losses, "params": trainer.full_parameters(),
                    "bytes": dict(logged), "inter": inter})
    return out


# every worker pins one torch thread (`_worker`), so the caller's thread count changes nothing
@pytest.mark.thread_independent
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_scheme_equals_the_reference_and_logs_the_counted_bytes(world_size):
    results = run_distributed(_worker, world_size, timeout_s=200)
    dense_params = sum(p.numel() for p in ReferenceTrainer(
        DataConfig(table_rows=TABLES, num_dense=3), MODEL, OptimizerConfig()).model.parameters())
    a2a_by_schedule: dict[tuple[Any, ...], dict[bool, dict[tuple[str, int], int]]] = {}
    for i, case in enumerate(_cases(world_size)):
        per_node = case.get("ranks_per_node", 1)
        name = (f"{case['scheme']}/{case['sparse']}/hot={case['hot_name']}/"
                f"scheduled={case['scheduled']}/bag={case['bag_size']}/per_node={per_node}")
        data, optim, engine = _configs(case)
        ref = ReferenceTrainer(data, MODEL, optim, seed=5)
        batches = list(SyntheticClickLog(data).batches(8 * world_size, STEPS))
        ref_losses = [ref.step(b) for b in batches]
        expected = ref.full_parameters()
        plan = make_plan(case["scheme"], table_rows=TABLES, world_size=world_size,
                         hot_rows=case["hot"])
        counted: dict[tuple[str, int], int] = defaultdict(int)
        counted_inter: dict[tuple[str, int], int] = defaultdict(int)
        for b in batches:
            for inter_only, into in ((False, counted), (True, counted_inter)):
                for key, v in exact_bytes(b, plan, engine, embedding_dim=D,
                                          dense_param_count=dense_params, element_bytes=8,
                                          touched_counts=needs_touched_counts(optim),
                                          ranks_per_node=per_node,
                                          inter_node_only=inter_only).items():
                    into[key] += v
        logged_all: dict[tuple[str, int], int] = {}
        inter_all: dict[tuple[str, int], int] = {}
        for rank, result in enumerate(results):
            r = result[i]
            assert r["losses"] == pytest.approx(ref_losses, rel=1e-12, abs=1e-12), name
            for key, want in expected.items():
                scale = max(float(want.abs().max()), 1e-3)
                err = float((r["params"][key] - want).abs().max())
                assert err <= TOLERANCE * scale, f"{name} rank {rank} {key}: {err:.2e}"
            logged_all.update({k: v for k, v in r["bytes"].items()
                               if k[0] not in ("metrics", "gather") and v})
            inter_all.update({(phase, rank): v for (phase, _), v in r["inter"].items() if v})
        assert logged_all == dict(counted), name
        # bytes that cross nodes, as the emulator attributes them, equal the closed form
        assert inter_all == dict(counted_inter), name
        logged = logged_all
        a2a = sum(v for (ph, _), v in logged.items() if ph in ("ids", "vectors", "grads"))
        if case["hot_name"] == "all":
            assert a2a == 0, name
        else:
            assert a2a > 0, name
        if not case["hot"]:
            assert not any(ph == "hot_allreduce" for ph, _ in logged), name
        key = (case["scheme"], case["sparse"], case["hot_name"], case["bag_size"],
               case["weight_decay"], per_node)
        a2a_by_schedule.setdefault(key, {})[case["scheduled"]] = {
            k: v for k, v in logged.items() if k[0] in ("splits", "ids", "vectors", "grads")}
    # pairwise rounds and prefetch move the same bytes as the plain all-to-alls
    pairs = [v for v in a2a_by_schedule.values() if len(v) == 2]
    assert pairs
    for v in pairs:
        assert v[True] == v[False]


# --- accounting on handmade batches (hand-computed counts) ---

D_HAND = 4
ROW = D_HAND * 8  # bytes of one fp64 row vector
DENSE = 10  # dense parameters: 80 bytes, a ring all-reduce on 2 ranks sends 2(p-1)/p*N = 80


def _one_hot(*tables: list[int]) -> Batch:
    b = len(tables[0])
    return Batch(dense=torch.zeros(b, 1), ids=tuple(torch.tensor(t) for t in tables),
                 offsets=tuple(torch.arange(b + 1) for _ in tables), labels=torch.zeros(b))


def _count(batch: Batch, plan: ShardingPlan, engine: EngineConfig,
           touched: bool = False) -> dict[tuple[str, int], int]:
    return exact_bytes(batch, plan, engine, embedding_dim=D_HAND, dense_param_count=DENSE,
                       element_bytes=8, touched_counts=touched)


# one table of 4 rows on 2 ranks (row g on rank g % 2); rank 0 reads rows [1, 1], rank 1 [0, 3]
HAND = _one_hot([1, 1, 0, 3])


@pytest.mark.thread_independent  # pure counting, no process group
def test_row_counts_every_occurrence_and_dedup_each_row_once():
    plan = make_plan("row", table_rows=(4,), world_size=2)
    assert _count(HAND, plan, EngineConfig(scheme="row")) == {
        ("splits", 0): 8, ("splits", 1): 8,
        ("ids", 0): 16, ("grads", 0): 2 * ROW, ("vectors", 1): 2 * ROW,  # row 1 twice
        ("ids", 1): 8, ("grads", 1): ROW, ("vectors", 0): ROW,  # row 0; row 3 is rank 1's
        ("dense_allreduce", 0): 80, ("dense_allreduce", 1): 80}
    dedup = _count(HAND, plan, EngineConfig(scheme="row_dedup"))
    assert dedup[("ids", 0)] == 8 and dedup[("grads", 0)] == ROW and dedup[("vectors", 1)] == ROW


@pytest.mark.thread_independent  # pure counting, no process group
def test_hot_rows_leave_the_all_to_all_for_the_hot_all_reduce():
    plan = make_plan("hybrid", table_rows=(4,), world_size=2, hot_rows=(1,))
    assert _count(HAND, plan, EngineConfig(scheme="hybrid")) == {
        ("splits", 0): 8, ("splits", 1): 8,
        ("ids", 1): 8, ("grads", 1): ROW, ("vectors", 0): ROW,
        ("dense_allreduce", 0): 80, ("dense_allreduce", 1): 80,
        ("hot_allreduce", 0): ROW, ("hot_allreduce", 1): ROW}
    every = make_plan("hybrid", table_rows=(4,), world_size=2, hot_rows=range(4))
    # 4 rows + 4 touched counts, 8 bytes each; one fused buffer with the dense gradients
    assert _count(HAND, every, EngineConfig(scheme="hybrid"), touched=True) == {
        ("dense_allreduce", 0): 80, ("dense_allreduce", 1): 80,
        ("hot_allreduce", 0): 160, ("hot_allreduce", 1): 160}
    assert _count(HAND, every, EngineConfig.scheduled("hybrid"), touched=True) == {
        ("allreduce", 0): 240, ("allreduce", 1): 240}


@pytest.mark.thread_independent  # pure counting, no process group
def test_table_pooled_sends_one_vector_per_sample_and_remote_table():
    plan = ShardingPlan(world_size=2, table_rows=(4, 3), sharding="table", table_owner=(0, 1))
    # 2 samples per rank, each needs the other rank's table: 2 pooled vectors each way
    assert _count(_one_hot([0, 1, 2, 3], [0, 0, 1, 2]), plan,
                  EngineConfig(scheme="table_pooled")) == {
        ("vectors", 0): 2 * ROW, ("vectors", 1): 2 * ROW,
        ("grads", 0): 2 * ROW, ("grads", 1): 2 * ROW,
        ("dense_allreduce", 0): 80, ("dense_allreduce", 1): 80}
