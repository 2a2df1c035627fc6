"""`furnace reproduce` end to end on tiny experiments: report, JSON, figures, failures."""

from __future__ import annotations

import json

import pytest

from furnace.runtime import reproduce
from furnace.runtime.reproduce import Claim, Experiment, Result, RunContext, Table

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


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
        Table(title="t", columns=["a"], rows=[[1, 2]], kind="measured")
    # no default: a table with a forgotten label must not read as measured
    with pytest.raises(TypeError, match="kind"):
        Table(title="t", columns=["a"], rows=[[1]])  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="kind must be one of"):
        Claim(what="w", paper="p", ours="o", kind="estimated")


def test_discovery_skips_systems_not_built():
    runtime = reproduce.discover("runtime")
    assert runtime and all(e.system == "runtime" for e in runtime)
    assert [e.name for e in runtime] == ["emulator"]
    # a subpackage that does not exist yet is reported, not an error (whichever is unbuilt
    # now; once every system is built there is none left to try)
    unbuilt = [s for s in reproduce.SYSTEM_NAMES if reproduce.discover(s) is None]
    if unbuilt:
        experiments, missing = reproduce.select(["runtime", unbuilt[0]], quick=True)
        assert [e.name for e in experiments] == ["emulator"]
        assert missing == [unbuilt[0]]
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


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs: a real "No space left on device" for the fault tests (needs root,
    as CI and the development machines have)."""
    import os
    import subprocess

    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill_disk(folder) -> None:
    import os

    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.timeout(120)
def test_a_full_disk_mid_run_keeps_the_previous_report(small_disk, monkeypatch, capsys):
    from furnace.cli import main

    first = Experiment("runtime", "tiny", "tiny", _tiny)
    monkeypatch.setattr(reproduce, "select", lambda systems, quick: ([first], []))
    assert main(["reproduce", "--out", str(small_disk), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in small_disk.iterdir()}
    assert {"report.md", "results.json", "tiny_squares.png"} <= set(before)
    capsys.readouterr()

    def fills_the_disk(ctx: RunContext) -> Result:
        _fill_disk(ctx.out_dir)
        return Result(notes=["n" * 200_000], data={"big": list(range(50_000))})

    second = Experiment("runtime", "tiny", "tiny", fills_the_disk)
    monkeypatch.setattr(reproduce, "select", lambda systems, quick: ([second], []))
    code = main(["reproduce", "--out", str(small_disk), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], err
    assert "Traceback" not in out + err
    # the new run's outcome is still shown to the user
    assert "ok runtime/tiny" in out
    after = {p.name: p.read_bytes() for p in small_disk.iterdir() if p.name != "filler"}
    assert after == before, "previous outputs changed, or a temporary file was left"
    json.loads(after["results.json"])


def test_an_unwritable_output_folder_is_refused_before_any_experiment(tmp_path):
    ran = []

    def records(ctx: RunContext) -> Result:
        ran.append(True)
        return Result()

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError, match="not a folder"):
        reproduce.run(experiments=[Experiment("runtime", "r", "r", records)],
                      out_dir=blocker, show_progress=False)
    assert not ran
