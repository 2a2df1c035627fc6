"""`furnace moe` commands (FasterMoE's benchmark and simulator, He et al., PPoPP'22): their
outputs, the one-line errors of the CLI contract, and clean torchrun runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from furnace.cli import main

TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_moe_help(capsys):
    assert main(["moe"]) == 0
    assert "bench" in capsys.readouterr().out


def test_simulate_writes_table_and_trace(tmp_path, capsys):
    trace = tmp_path / "step.json"
    assert main(["moe", "simulate", "--gpus", "16", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "gshard-capacity" in out and "baseline" in out
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.timeout(300)
def test_bench_virtual_small(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["moe", "bench", "--mode", "virtual", "--world-size", "2", "--tokens-per-rank",
                 "256",
                 "--d-model", "32", "--d-hidden", "64", "--steps", "1",
                 "--policies", "baseline", "shadow", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["label"] == "virtual-clock" and set(data["results"]) == {"baseline", "shadow"}
    assert data["config"]["tokens_per_rank"] == 256 and data["config"]["world_size"] == 2
    capsys.readouterr()
    for argv, flag in ((["--mode", "real"], "--mode"), (["--hot-share", "1.5"], "--hot-share")):
        with pytest.raises(SystemExit) as info:
            main(["moe", "bench", *argv])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert flag in err and "\n" not in err


def test_cross_argument_errors_name_the_flag(capsys):
    # checks that span several flags run before any rank is spawned
    assert main(["moe", "bench", "--world-size", "2", "--top-k", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--top-k" in err and "[1, 2]" in err
    assert main(["moe", "bench", "--world-size", "4", "--group-size", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--group-size" in err and "1, 2, 4" in err


def test_bench_config_names_the_field():
    from furnace.moe.config import BenchConfig, BenchConfigError

    for field, kwargs in (("top_k", {"top_k": 5}), ("group_size", {"group_size": 3}),
                          ("d_model", {"d_model": 0}), ("tokens_per_rank", {"tokens_per_rank": 0}),
                          ("experts_per_rank", {"experts_per_rank": 0}),
                          ("zipf_exponent", {"zipf_exponent": float("nan")}),
                          ("policies", {"policies": ("shadow", "shadow")}),
                          ("policies", {"policies": ()})):
        with pytest.raises(BenchConfigError) as info:
            BenchConfig(**kwargs)
        assert info.value.field == field


def test_bench_options_are_the_config_fields():
    # flags, defaults and choices of `moe bench` come from BenchConfig's fields
    import dataclasses

    from furnace.cli import build_parser
    from furnace.moe.cli import BENCH_FIELDS, bench_config
    from furnace.moe.config import BenchConfig

    moe = build_parser()._subparsers._group_actions[0].choices["moe"]
    bench = moe._subparsers._group_actions[0].choices["bench"]
    by_dest = {a.dest: a for a in bench._actions}
    fields = {f.name: f for f in dataclasses.fields(BenchConfig)}
    for name in BENCH_FIELDS:
        action = by_dest[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        if name != "world_size":  # None: 4 local ranks, or torchrun's
            assert action.default == fields[name].default, name
    assert by_dest["mode"].choices == fields["mode"].metadata["choices"]
    assert by_dest["tokens_per_rank"].option_strings == ["--tokens-per-rank", "--tokens"]
    args = build_parser().parse_args(["moe", "bench", "--tokens", "64", "--policies", "smart"])
    assert bench_config(args) == BenchConfig(tokens_per_rank=64, policies=("smart",))


def test_simulate_trace_is_written_whole(tmp_path, capsys):
    # an existing trace is replaced by a complete new one; no temporary file stays behind
    trace = tmp_path / "step.json"
    trace.write_text("old")
    assert main(["moe", "simulate", "--gpus", "4", "--routing", "hot", "--hot-share", "0.6",
                 "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert [p.name for p in tmp_path.iterdir()] == ["step.json"]
    assert "simulated" in capsys.readouterr().out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# process-group hygiene at exit (return codes, stderr), not numerics: threads change nothing
@pytest.mark.thread_independent
@pytest.mark.timeout(240)
def test_torchrun_bench_exits_cleanly_five_times(tmp_path):
    # a rank that exits while its process group is alive can abort with "terminate called
    # without an active exception" (about one run in five before run_bench left the group)
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    for run in range(5):
        proc = subprocess.run(
            [str(TORCHRUN), "--nproc-per-node", "2", "--master-port", str(_free_port()),
             "-m", "furnace.cli", "moe", "bench", "--mode", "measured", "--tokens", "32",
             "--d-model", "8", "--d-hidden", "16", "--steps", "1",
             "--policies", "baseline", "shadow"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
        assert proc.returncode == 0, f"run {run}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "terminate called" not in proc.stderr
        # only rank 0 prints the table
        assert proc.stdout.count("MoE layer step") == 1, proc.stdout
