"""`furnace cp plan | bench | simulate` through the `furnace` entry point: the plan's table
and JSON agree with the library, a custom mask_mod from a file plans like the built-in one,
the bench checks its outputs, and the simulator labels what it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from furnace.cli import main
from furnace.context_parallel.compare import compare_schemes
from furnace.context_parallel.context_tiling import TilingConfig
from furnace.context_parallel.masks import build_block_grid, make_mask
from furnace.context_parallel.plan import AttentionShape

MASKS = str(Path(__file__).with_name("bad_masks.py"))
SMALL = ["--seq-len", "256", "--num-blocks", "8", "--ranks", "2", "--heads", "2",
         "--kv-heads", "2", "--head-dim", "16", "--dtype", "float32", "--time-limit", "0.3"]

pytestmark = pytest.mark.thread_independent


def _plan_json(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "plan.json"
    assert main(["cp", "plan", *SMALL, "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())


def test_plan_prints_every_scheme_and_writes_what_the_library_computes(tmp_path, capsys):
    record = _plan_json(tmp_path, "--mask", "strided", "--show-tiling")
    text = capsys.readouterr().out
    for scheme in ("ring", "zigzag_ring", "striped_ring", "allgather_kv", "needed_kv",
                   "tiled", "ulysses"):
        assert scheme in text
    assert "kept:" in text and "block (q row, kv column)" in text
    grid = build_block_grid(make_mask("strided", 256), 256, 32)
    shape = AttentionShape(num_heads=2, num_kv_heads=2, head_dim=16)
    comp = compare_schemes(grid, 2, shape, config=TilingConfig(time_limit_s=0.3))
    ring = comp.row("ring")
    ring_json = next(r for r in record["rows"] if r["scheme"] == "ring")
    assert ring_json["max_inbound"] == ring.max_inbound
    assert ring_json["max_messages"] == ring.max_messages
    assert record["num_ranks"] == 2 and record["num_blocks"] == 8


def test_a_mask_mod_from_a_file_plans_like_the_built_in_one(tmp_path):
    custom = _plan_json(tmp_path, "--mask", MASKS + ":good_causal")
    builtin = _plan_json(tmp_path, "--mask", "causal")
    pick = {(r["scheme"], r["layout"]): r["max_inbound"] for r in builtin["rows"]
            if not r["scheme"].startswith("tiled")}
    assert pick == {(r["scheme"], r["layout"]): r["max_inbound"] for r in custom["rows"]
                    if not r["scheme"].startswith("tiled")}


@pytest.mark.timeout(120)
def test_bench_runs_side_by_side_and_checks_outputs(capsys):
    assert main(["cp", "bench", "--mask", "global_local", "--seq-len", "64", "--num-blocks",
                 "4", "--ranks", "2", "--heads", "2", "--kv-heads", "2", "--head-dim", "8",
                 "--schemes", "ring,tiled", "--repeats", "3", "--time-limit", "0.2",
                 "--latency-ms", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "emulated" in text and "ring" in text and "tiled" in text


def test_simulate_labels_its_figures_and_writes_a_trace(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert main(["cp", "simulate", "--mask", "global_local", "--ranks", "16",
                 "--seq-len", "16384", "--num-blocks", "32", "--heads", "8", "--kv-heads", "8",
                 "--time-limit", "0.2", "--trace", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "simulated" in text and "ring" in text and "assumption" in text
    events = json.loads(trace.read_text())
    assert events["traceEvents"]
