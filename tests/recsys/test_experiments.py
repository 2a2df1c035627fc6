"""`furnace reproduce recsys`'s entries (issue 15, item 7): registered once each with quick
variants; the brute-force entry's claim follows from its table."""

from __future__ import annotations

import pytest

from furnace.recsys import experiments as ex
from furnace.runtime.reproduce import RunContext, discover

# planner and counting entries only: closed-form, no torch threads involved
pytestmark = pytest.mark.thread_independent


def test_entries_are_registered_once_each_with_quick_variants():
    found = discover("recsys")
    assert found is not None
    names = [e.name for e in found]
    assert len(names) == len(set(names))
    assert {"traffic", "hot_set_optimum", "measured", "scaling"} <= set(names)
    assert all(e.quick for e in found)


def test_hot_set_optimum_claim_follows_from_its_table(tmp_path):
    result = ex.hot_set_optimum(RunContext(out_dir=tmp_path, quick=True))
    gaps = [float(row[-1].rstrip("%")) / 100 for row in result.tables[0].rows]
    assert result.claims[0].holds == (max(gaps) <= 0.0101)
    for row in result.tables[0].rows:
        assert float(row[4]) >= float(row[5]) * (1 - 1e-12)  # never below the optimum
