"""`furnace reproduce context_parallel`'s entries (issue 14, item 7): registered once each
with quick variants; the traffic table on a tiny problem has the figures of
`compare_schemes` and claims that follow from them."""

from __future__ import annotations

import pytest

from furnace.context_parallel import experiments as ex
from furnace.context_parallel.compare import compare_schemes
from furnace.context_parallel.masks import build_block_grid, make_mask
from furnace.runtime.reproduce import RunContext, discover

pytestmark = pytest.mark.thread_independent

TINY = ex.TrafficConfig(seq_len=256, blocks_per_rank=4, rank_counts=(2,),
                        masks=("causal", "strided", "global_local", "document"), num_heads=2,
                        head_dim=16, dtype="float32", time_limit_s=0.3, greedy_time_s=0.1)


def test_entries_are_registered_once_each_with_quick_variants():
    found = discover("context_parallel")
    assert found is not None
    names = [e.name for e in found]
    assert len(names) == len(set(names))
    assert {"traffic", "heuristic_gap", "measured", "simulator_validation", "scaling"} <= set(
        names)
    assert all(e.quick for e in found)


def test_traffic_table_quotes_compare_schemes_and_its_claims_follow(tmp_path):
    ctx = RunContext(out_dir=tmp_path, quick=True)
    result = ex.traffic_result(ctx, TINY)
    ratios = {(row[0], row[1]): row for row in result.tables[0].rows}
    grid = build_block_grid(make_mask("causal", 256), 256, 32)
    comp = compare_schemes(grid, 2, TINY.shape, config=TINY.tiling)
    tiled = comp.row("tiled")
    assert ratios[("causal", 2)][5] == round(comp.ratio_to_ring(tiled.scheme), 3)
    # the 4-rank claims need 4 ranks: on 2 ranks only the balance and best-of claims exist
    whats = [c.what for c in result.claims]
    assert any("balance" in w for w in whats) and any("best baseline" in w for w in whats)
    balance = next(c for c in result.claims if "balance" in c.what)
    worst = max(row[6] for row in result.tables[0].rows)
    assert balance.holds == (worst <= ex.BALANCE_TARGET)
    assert result.figures and (tmp_path / result.figures[0]).exists()
