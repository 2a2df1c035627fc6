"""`furnace recsys train | plan | bench` through the `furnace` entry point: training learns
and scores a held-out split, also under torchrun (where it equals local ranks and leaves no
process group), a Criteo TSV file trains, the plan agrees with the library, and the bench
labels its emulated times."""

from __future__ import annotations

import json

import pytest

from furnace.cli import main
from furnace.recsys.compare import plan_report
from furnace.recsys.data import write_criteo_tsv
from furnace.recsys.train import RecsysTrainConfig, train_recsys
from furnace.runtime.testing import TORCHRUN_ENTRY, run_torchrun, torchrun_outcomes

# the CLI's flow and outputs, not numerics: the 2-thread pass covers them once
pytestmark = pytest.mark.thread_independent

TINY = ["--steps", "4", "--batch-size", "64", "--profile-batches", "2", "--eval-batches",
        "2", "--embedding-dim", "8"]


@pytest.mark.timeout(120)
def test_train_learns_and_reports_held_out_metrics(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["recsys", "train", "--ranks", "2", *TINY, "--steps", "12", "--lr", "0.2",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held out (2 batches): log loss" in text and "AUC" in text
    record = json.loads(out.read_text())
    assert record["losses"][-1] < record["losses"][0]
    assert 0.0 <= record["eval_auc"] <= 1.0 and record["eval_logloss"] > 0
    assert record["bytes_per_step"]


@pytest.mark.timeout(120)
def test_train_reads_a_criteo_tsv_file(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    lines = []
    for _ in range(6 * 32):
        dense = [int(v) if v >= 0 else None for v in rng.integers(-2, 50, 13)]
        cats = [f"{int(v):08x}" if v % 7 else None for v in rng.integers(0, 2**31, 26)]
        lines.append((int(rng.random() < 0.3), dense, cats))
    path = tmp_path / "day.tsv"
    write_criteo_tsv(path, lines)
    assert main(["recsys", "train", "--ranks", "2", "--data", str(path), "--steps", "4",
                 "--batch-size", "32", "--profile-batches", "2", "--eval-batches", "2",
                 "--rows-per-table", "50", "--embedding-dim", "8"]) == 0
    assert "held out" in capsys.readouterr().out


def test_plan_prints_every_scheme_and_writes_what_the_library_computes(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["recsys", "plan", "--ranks", "16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for scheme in ("table_pooled", "row_dedup", "hybrid", "modelled"):
        assert scheme in text
    record = json.loads(out.read_text())
    report = plan_report(world_size=16, ranks_per_node=8, preset="h100-ib", row_scale=1e-3,
                         zipf_exponent=1.05, bag_size=1, batch_size_per_rank=2048,
                         embedding_dim=16, optimizer="rowwise_adagrad",
                         memory_budget_bytes=8 * 2**20, profile_batches=0)
    assert record["hot_rows"] == report.choice.size
    assert [s["seconds"] for s in record["schemes"]] == [s.seconds for s in report.schemes]


@pytest.mark.timeout(180)
def test_bench_labels_emulated_times(capsys):
    assert main(["recsys", "bench", "--ranks", "2", "--steps", "3", "--warmup", "1",
                 "--batch-size", "64", "--schemes", "row_dedup,hybrid",
                 "--embedding-dim", "8", "--latency-ms", "0.05"]) == 0
    text = capsys.readouterr().out
    assert "emulated 100 MB/s" in text and "hybrid_sche" in text and "hot set:" in text


@pytest.mark.timeout(150)
def test_torchrun_matches_local_ranks_and_leaves_no_group(tmp_path):
    script = tmp_path / "entry.py"
    script.write_text(TORCHRUN_ENTRY)
    out_json = tmp_path / "run.json"
    try:
        code, out, err = run_torchrun(script, "cli", "recsys", "train", *TINY, "--json",
                                      str(out_json), cwd=tmp_path, timeout_s=140)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    log = out + err
    assert code == 0, log
    assert torchrun_outcomes(log) == {0: ("returned 0", "False"),
                                      1: ("returned 0", "False")}, log
    assert out.count("held out") == 1, log
    launched = json.loads(out_json.read_text())["losses"]
    local = train_recsys(RecsysTrainConfig(steps=4, batch_size=64, profile_batches=2,
                                           eval_batches=2, embedding_dim=8),
                         progress=False, timeout_s=100).losses
    assert launched == pytest.approx(local, rel=1e-6)


def test_a_config_error_names_the_flag(capsys):
    assert main(["recsys", "train", "--ranks", "4", "--batch-size", "30"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and "Traceback" not in err
