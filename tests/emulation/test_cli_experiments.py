"""`furnace emulate` and the `furnace reproduce emulation` entries."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.cli import main
from furnace.runtime.reproduce import discover


def test_registered():
    assert [e.name for e in discover("emulation")] == ["ladder", "ozaki1_slices", "speedup",
                                                        "cpu_time", "selector", "mlp_curve"]


def test_gemm_command_reports_error_counts_and_times(capsys):
    assert main(["emulate", "gemm", "--type", "FP32-B", "--size", "64", "--dist", "wide"]) == 0
    out = capsys.readouterr().out
    assert "normwise error" in out and "mm_bf16: 6 calls" in out and "CPU time" in out


def test_gemm_command_refuses_out_of_range_and_unknown_types(capsys):
    assert main(["emulate", "gemm", "--type", "FP32-F", "--size", "64", "--dist", "wide"]) == 2
    err = capsys.readouterr().err
    assert "--dist" in err and "spread" in err and "FP32-B" in err  # what would take it
    with pytest.raises(SystemExit) as exc:  # argparse's type check exits itself
        main(["emulate", "gemm", "--type", "NOPE"])
    assert exc.value.code == 2 and "emulate types" in capsys.readouterr().err


def test_impossible_type_profile_combinations_name_what_the_profile_runs(capsys):
    assert main(["emulate", "gemm", "--type", "FP32-B", "--profile", "ascend910"]) == 2
    err = capsys.readouterr().err
    assert "bf16" in err and "FP32-F" in err and "FP32-B," not in err


def test_ozaki_and_double_float_run_on_a_profile_without_vector_figures(capsys):
    # Ascend 910 has int8 but no published vector / bandwidth figures: the GEMM runs and
    # the part of the model that needs those figures says so
    assert main(["emulate", "gemm", "--type", "OZ2-N12", "--size", "32", "--profile",
                 "ascend910"]) == 0
    out = capsys.readouterr().out
    assert "mm_int8: 12 calls" in out and "cannot be timed" in out
    assert main(["emulate", "gemm", "--type", "DF32", "--size", "8", "--profile",
                 "ascend910"]) == 0
    assert "cannot be timed" in capsys.readouterr().out


@pytest.mark.parametrize("dist", ["uniform", "normal", "wide", "cancel"])
def test_int16_gemm_runs_on_integer_operands_and_is_exact(capsys, dist):
    assert main(["emulate", "gemm", "--type", "INT16", "--size", "24", "--dist", dist]) == 0
    out = capsys.readouterr().out
    assert "exact integer product: yes" in out and "mm_int8: 4 calls" in out


def test_fp64_gemm_reports_the_elementwise_error_against_exact_entries(capsys):
    assert main(["emulate", "gemm", "--type", "OZ1-S12", "--size", "48", "--dist",
                 "normal"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "max elementwise" in line)
    assert float(line.split("error")[1].split()[0]) <= 1e-15


def test_app_names_are_the_applications():
    from furnace.emulation.apps import APPS
    from furnace.emulation.cli import APP_NAMES

    assert sorted(APP_NAMES) == sorted(APPS)


def test_select_and_app_commands(capsys):
    assert main(["emulate", "select", "gemm-wide", "--size", "tiny"]) == 0
    assert "chosen: FP32-B" in capsys.readouterr().out
    assert main(["emulate", "select", "gemm-narrow", "--size", "tiny",
                 "--requirement", "1e-30"]) == 1
    assert "no type meets" in capsys.readouterr().out
    assert main(["emulate", "app", "kmeans", "--type", "BF16", "--size", "tiny"]) == 0
    assert "MISSES" in capsys.readouterr().out


@pytest.mark.parametrize("dist", ["uniform", "normal", "wide", "cancel"])
def test_operand_distributions(dist):
    from furnace.emulation import make_operands

    A, B = make_operands(dist, 16, np.float32, np.random.default_rng(0))
    assert A.shape == B.shape == (16, 16) and A.dtype == np.float32
    if dist == "wide":
        assert np.abs(A).max() > 65504 or np.abs(B).max() > 65504


def test_operands_live_in_the_library_and_the_old_import_path_still_works():
    import furnace.emulation as emulation
    from furnace.emulation import cli, operands

    assert emulation.DISTRIBUTIONS == ("uniform", "normal", "wide", "cancel")
    assert cli.make_operands is operands.make_operands is emulation.make_operands
    with pytest.raises(ValueError, match="unknown distribution"):
        operands.make_operands("cauchy", 4, np.float64, np.random.default_rng(0))


def test_the_emulate_options_are_the_configs_fields(capsys):
    from dataclasses import fields

    from furnace.cli import build_parser
    from furnace.emulation.config import AppConfig, GemmConfig, SelectConfig, TypesConfig

    emulate = build_parser()._subparsers._group_actions[0].choices["emulate"]
    commands = emulate._subparsers._group_actions[0].choices
    for name, config in (("gemm", GemmConfig), ("app", AppConfig), ("select", SelectConfig),
                         ("types", TypesConfig)):
        dests = [a.dest for a in commands[name]._actions if a.dest not in ("help", "_prog")]
        assert dests == [f.name for f in fields(config)], name
        for action in commands[name]._actions:
            if action.dest in {f.name for f in fields(config)}:
                f = next(f for f in fields(config) if f.name == action.dest)
                assert action.help == f.metadata["help"], (name, f.name)
                if action.option_strings:
                    assert action.option_strings[0] == "--" + f.name.replace("_", "-")
    with pytest.raises(ValueError, match="size"):
        GemmConfig(type="FP32-B", size=0)
    with pytest.raises(ValueError, match="dist"):
        GemmConfig(type="FP32-B", dist="cauchy")
    with pytest.raises(ValueError, match="requirement"):
        SelectConfig(name="cg", requirement=float("nan"))


def test_app_refused_halfway_exits_1_with_one_line_and_no_result(capsys, monkeypatch):
    import furnace.emulation.apps as apps

    class TwoProducts(apps.Application):
        def make_inputs(self, rng):
            return {"a": rng.uniform(-1, 1, (8, 8)).astype(np.float32)}

        def run(self, inputs, matmul):
            first = matmul(inputs["a"], inputs["a"])
            spread = inputs["a"].copy()
            spread[0, 0] = 1e12  # an iterate whose row spreads beyond fp16's reach
            return matmul(spread, np.asarray(first, dtype=np.float32))

        def metric(self, inputs, result):
            return 0.0

    app = TwoProducts("two", "two products", "none", 1.0)
    monkeypatch.setattr(apps, "get_app", lambda name, size: app)
    assert main(["emulate", "app", "cg", "--type", "FP32-F", "--size", "tiny"]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "refused GEMM 2" in lines[0] and "Traceback" not in captured.err
    assert "meets" not in captured.out and "MISSES" not in captured.out
