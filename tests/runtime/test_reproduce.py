"""`furnace reproduce` end to end on tiny experiments: report, JSON, figures, failures."""

from __future__ import annotations

import json

import pytest

from furnace.runtime import reproduce
from furnace.runtime.reproduce import Claim, Experiment, Result, RunContext, Table


def _tiny(ctx: RunContext) -> Result:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9])
    ctx.progress("plotting")
    return Result(
        tables=[Table(title="squares", columns=["n", "n^2"], rows=[[2, 4], [3, 9.0]],
                      kind="simulated")],
        figures=[ctx.save_figure(fig, "tiny_squares")],
        claims=[Claim(what="speedup", paper="2x", ours="2.5x", kind="virtual-clock",
                      source="a paper", holds=True)],
        notes=["quick" if ctx.quick else "full"],
        data={"n": [2, 3]},
    )


def _broken(ctx: RunContext) -> Result:
    raise RuntimeError("experiment broke on purpose")


@pytest.mark.timeout(60)
def test_run_writes_report_json_and_png(tmp_path):
    exps = [Experiment("moe", "tiny", "A tiny experiment", _tiny),
            Experiment("moe", "broken", "A broken experiment", _broken)]
    outcomes = reproduce.run(quick=True, out_dir=tmp_path, show_progress=False,
                             experiments=exps)
    assert [o.error is None for o in outcomes] == [True, False]
    report = (tmp_path / "report.md").read_text()
    assert "**squares** (simulated)" in report
    assert "| 3 | 9 |" in report
    assert "![tiny_squares](tiny_squares.png)" in report
    assert "| speedup | 2x | 2.5x | virtual-clock | yes | a paper |" in report
    assert "RuntimeError: experiment broke on purpose" in report
    assert "| moe | broken | FAILED |" in report
    png = tmp_path / "tiny_squares.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["quick"] is True
    tiny = data["experiments"][0]
    assert tiny["result"]["data"] == {"n": [2, 3]}
    assert tiny["result"]["claims"][0]["kind"] == "virtual-clock"
    assert data["experiments"][1]["error"].strip().endswith("experiment broke on purpose")


def test_labels_are_checked():
    with pytest.raises(ValueError, match="kind must be one of"):
        Table(title="t", columns=["a"], rows=[[1]], kind="guessed")
    with pytest.raises(ValueError, match="has 2 cells, expected 1"):
        Table(title="t", columns=["a"], rows=[[1, 2]])
    with pytest.raises(ValueError, match="kind must be one of"):
        Claim(what="w", paper="p", ours="o", kind="estimated")


def test_discovery_skips_systems_not_built():
    runtime = reproduce.discover("runtime")
    assert runtime and all(e.system == "runtime" for e in runtime)
    assert [e.name for e in runtime] == ["emulator"]
    experiments, missing = reproduce.select(["runtime", "context_parallel"], quick=True)
    assert [e.name for e in experiments] == ["emulator"]
    # a subpackage that does not exist yet is reported, not an error
    if reproduce.discover("context_parallel") is None:
        assert missing == ["context_parallel"]
    with pytest.raises(ValueError, match="unknown system"):
        reproduce.discover("nonsense")


@pytest.mark.timeout(60)
def test_report_lists_systems_not_built(tmp_path, monkeypatch):
    # pretend nothing registers experiments: moe exists as a package, hybrid does not
    monkeypatch.setattr(reproduce, "discover", lambda system: None)
    monkeypatch.setattr(reproduce.importlib.util, "find_spec",
                        lambda name: None if name == "furnace.hybrid" else object())
    outcomes = reproduce.run(["moe", "hybrid"], quick=True, out_dir=tmp_path,
                             show_progress=False)
    assert outcomes == []
    report = (tmp_path / "report.md").read_text()
    assert "| hybrid | - | not built yet | - |" in report
    assert "| moe | - | no experiments registered yet | - |" in report
    assert "## Skipped" in report and "`hybrid` (not built yet)" in report
