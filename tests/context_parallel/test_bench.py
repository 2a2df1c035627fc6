"""Tests of the side-by-side benchmark (`furnace.context_parallel.bench`, UltraAttn, Yang et
al., SC'25; design note §6.3): one emulated two-rank run whose result carries per-round
times, ratios to ring, logged bytes equal to the plans' counts and correctness flags, and
the config's refusals before any rank starts."""

from __future__ import annotations

import functools
import math
import pickle

import pytest
import torch
from rich.console import Console

from furnace.context_parallel.bench import (
    BenchConfig,
    BenchResult,
    MaskSpec,
    bench_table,
    measure_schemes,
)
from furnace.context_parallel.config import PlanError
from furnace.context_parallel.masks import make_mask

LATENCY_S = 2e-3


@functools.cache
def _result() -> BenchResult:
    config = BenchConfig(mask="strided", seq_len=64, num_blocks=8, num_ranks=2, num_heads=2,
                         num_kv_heads=2, head_dim=8, dtype="float32",
                         schemes=("ring", "tiled", "ulysses"), repeats=2, warmup=1,
                         time_limit_s=0.2, bandwidth_Bps=50e6, latency_s=LATENCY_S,
                         timeout_s=60)
    return measure_schemes(config)


@pytest.mark.timeout(90)
def test_emulated_run_reports_ratios_bytes_and_correctness():
    result = _result()
    assert result.label == "emulated"
    assert [s.name for s in result.schemes] == ["ring", "tiled", "ulysses"]
    assert result.all_correct and result.all_bytes_match
    for s in result.schemes:
        assert len(s.seconds) == 2 and s.error <= 1e-5
        assert s.ratio is not None and math.isfinite(s.ratio) and s.ratio > 0
        # sleep-mode emulation: no all-to-all ends before its modelled time, latency included
        assert min(s.seconds) >= s.collectives * LATENCY_S
        assert s.collectives > 0 and s.max_inbound == max(s.planned_in)
    assert result.scheme("ring").ratio == 1.0
    assert result.scheme("ulysses").collectives == 8


@pytest.mark.timeout(90)
def test_the_table_labels_its_times():
    console = Console(record=True, width=200)
    console.print(bench_table(_result()))
    text = console.export_text()
    assert "emulated" in text and "tiled" in text and "NO" not in text


def test_mask_spec_pickles_as_its_recipe_and_masks_like_the_factory():
    spec = MaskSpec("sliding_window", 40, (("window", 7),))
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.__name__ == "sliding_window(7)"
    q = torch.arange(40).view(1, 1, -1, 1)
    kv = torch.arange(40).view(1, 1, 1, -1)
    b = h = torch.zeros(1, 1, 1, 1, dtype=torch.int64)
    expected = make_mask("sliding_window", 40, window=7)(b, h, q, kv)
    assert torch.equal(again(b, h, q, kv), expected)


@pytest.mark.parametrize(("changes", "field"), [
    ({"repeats": 0}, "repeats"),
    ({"schemes": ("ring", "nonsense")}, "schemes"),
    ({"schemes": ()}, "schemes"),
    ({"dtype": "int8"}, "dtype"),
    ({"bandwidth_Bps": -1.0}, "bandwidth_Bps"),
    ({"mask": "no_such_mask"}, "mask"),
])
def test_bad_configs_name_their_field(changes, field):
    with pytest.raises(PlanError) as info:
        config = BenchConfig(**{"seq_len": 64, "num_blocks": 8, "num_ranks": 2, **changes})
        measure_schemes(config)
    assert info.value.field == field


def test_a_block_count_that_leaves_an_empty_block_is_refused_before_any_rank_starts():
    # 30 tokens in blocks of ceil(30/8) = 4 make 8 blocks; 29 tokens make 8 too, 25 make 7
    with pytest.raises(PlanError) as info:
        measure_schemes(BenchConfig(seq_len=25, num_blocks=8, num_ranks=2))
    assert info.value.field == "num_blocks"


def test_ulysses_needs_ranks_that_divide_the_heads():
    with pytest.raises(PlanError) as info:
        measure_schemes(BenchConfig(seq_len=64, num_blocks=8, num_ranks=2, num_heads=3,
                                    num_kv_heads=1, schemes=("ring", "ulysses")))
    assert info.value.field == "schemes"
