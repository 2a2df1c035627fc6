"""The recsys benchmark harness (`furnace.recsys.bench`, design note `recsys.md` Sec. 7
"Benchmarks"): its config names the field of every bad input, and one tiny run at 2 ranks
returns every scheme with timing samples, losses on the same batches and logged bytes per
phase equal to `accounting.exact_bytes` summed over the steps it trained.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from furnace.recsys.bench import SCHEDULED, SCHEDULED_BASELINE, BenchConfig, run_bench
from furnace.recsys.config import SCHEMES, EngineConfig, PlanError
from furnace.recsys.data import SyntheticClickLog
from furnace.recsys.model import DLRM


@pytest.mark.thread_independent  # config validation: no tensors
@pytest.mark.parametrize(("field", "value"), [
    ("world_size", 0), ("schemes", ()), ("schemes", ("row", "nope")), ("schemes", ("row", "row")),
    ("steps", 0), ("warmup", -1), ("batch_size", 1023), ("row_scale", 0.0),
    ("zipf_exponent", -1.0), ("optimizer", "adam"), ("hot_budget_mib", -1.0),
    ("bandwidth_Bps", 0.0), ("latency_s", -1e-3), ("repeats", 0), ("interaction", "cat"),
    ("ranks_per_node", 3), ("ranks_per_node", 0), ("intra_bandwidth_Bps", 0.0),
    ("intra_latency_s", -1.0),
])
def test_bad_config_names_field(field: str, value: object) -> None:
    with pytest.raises(PlanError) as err:
        BenchConfig(**{field: value})  # type: ignore[arg-type]
    assert err.value.field == field


TINY = BenchConfig(world_size=2, steps=2, warmup=1, repeats=1, batch_size=16,
                   table_rows=(3, 11, 40, 7), embedding_dim=4, bandwidth_Bps=None,
                   torchrec=False, hot_budget_mib=0.01, zipf_exponent=1.2)


@pytest.mark.timeout(150)
def test_tiny_run_structure_and_bytes() -> None:
    result = run_bench(TINY, timeout_s=120)
    names = [s.name for s in result.schemes]
    assert set(names) == set(SCHEMES) | {SCHEDULED, SCHEDULED_BASELINE}
    steps = TINY.total_steps
    for s in result.schemes:
        assert len(s.samples_s) == TINY.steps * TINY.repeats and min(s.samples_s) > 0
        assert len(s.losses) == steps and s.final_loss == s.losses[-1]
    # every scheme trains the same model on the same batches: same first loss
    first = {round(s.losses[0], 5) for s in result.schemes}
    assert len(first) == 1
    dumped = result.to_dict()
    assert dumped["speedup_vs_row_dedup"]["row_dedup"] == pytest.approx(1.0)
    try:
        from furnace.recsys.accounting import exact_bytes
        from furnace.recsys.engine import needs_touched_counts
    except ImportError:
        pytest.skip("accounting not available: bytes not checked")
    data, model = TINY.data(), TINY.model()
    dense = sum(p.numel() for p in DLRM(model, data.num_dense, data.num_tables).parameters())
    batches = list(SyntheticClickLog(data).batches(TINY.batch_size, steps))
    for s in result.schemes:
        engine = {SCHEDULED: EngineConfig.scheduled("hybrid"),
                  SCHEDULED_BASELINE: EngineConfig.scheduled("row_dedup")}.get(
            s.name) or EngineConfig(scheme=s.name)
        assert s.plan is not None
        expected: dict[str, int] = defaultdict(int)
        for batch in batches:
            counted = exact_bytes(batch, s.plan, engine, embedding_dim=TINY.embedding_dim,
                                  dense_param_count=dense, element_bytes=4,
                                  touched_counts=needs_touched_counts(TINY.optim()))
            for (phase, rank), b in counted.items():
                expected[f"{phase}/{rank}"] += b
        assert s.bytes_per_rank == dict(expected), s.name
        assert s.busiest_bytes_per_step > 0
        # every rank is its own node here: every byte crosses nodes
        assert s.busiest_inter_node_bytes_per_step == pytest.approx(
            max(sum(b for key, b in expected.items() if key.endswith(f"/{r}"))
                for r in range(TINY.world_size)) / steps)
