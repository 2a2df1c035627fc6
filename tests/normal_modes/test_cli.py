"""`furnace modes`'s command-line contract: every case of cli_bad_inputs.py exits 2 with one
line naming its flag, before any meshing; --help shows every default; outputs are whole
files or nothing (`furnace.normal_modes.cli`)."""

from __future__ import annotations

import json
import time

import pytest

from furnace.cli import build_parser, main
from furnace.normal_modes import mesh as mesh_module
from furnace.normal_modes import solve

from .cli_bad_inputs import BAD_INPUTS


@pytest.fixture
def no_work(monkeypatch):
    """Meshing or solving during a rejected command is a failure of the contract."""

    def forbidden(*args, **kwargs):
        raise AssertionError("meshing or solving started for a bad command line")

    monkeypatch.setattr(solve, "compute_modes", forbidden)
    monkeypatch.setattr(mesh_module, "ball_mesh", forbidden)


@pytest.mark.parametrize("argv", [argv for _, argv in BAD_INPUTS],
                         ids=[case for case, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_before_any_work(argv, capsys, no_work):
    build_parser()  # the first build imports every system's CLI module: not this case's cost
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert info.value.code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    flags = [a for a in argv[1:] if a.startswith("--")]
    assert any(flag in lines[0] for flag in flags), lines[0]
    assert seconds < 1.0


def test_bad_inputs_cover_every_flag():
    parser = build_parser()
    modes = parser._subparsers._group_actions[0].choices["modes"]
    flags = {opt for action in modes._actions for opt in action.option_strings} - {"-h",
                                                                                 "--help"}
    named = {a for _, argv in BAD_INPUTS for a in argv if a.startswith("--")}
    # --p2 is a switch (it has no value to get wrong); it appears in the fluid combination
    assert flags <= named, flags - named


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit) as info:
        main(["modes", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: ball)", "(default: 0.15)", "(default: slices)",
                    "(default: none)"):
        assert default in text, default


@pytest.mark.timeout(120)
def test_json_is_written_whole_and_nothing_else_is_left(tmp_path, capsys):
    out = tmp_path / "modes.json"
    out.write_text("previous")
    assert main(["modes", "--planet", "ball", "--fmin", "0.3", "--fmax", "0.37",
                 "--mesh-size", "0.3", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["planet"] == "ball" and len(data["frequencies_mhz"]) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["modes.json"]  # no temporary left


def test_plot_folder_is_created_before_the_work(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake(*args, **kwargs):
        seen["folder exists"] = (tmp_path / "maps" / "deep").is_dir()
        raise ValueError("stop here")

    monkeypatch.setattr(solve, "compute_modes", fake)
    code = main(["modes", "--fmin", "0.3", "--fmax", "0.4", "--plot",
                 str(tmp_path / "maps" / "deep")])
    assert code == 2 and seen == {"folder exists": True}
    assert capsys.readouterr().err.strip() == "furnace modes: error: stop here"


def test_incomplete_solve_exits_1_with_one_line(monkeypatch, capsys):
    from furnace.eigen import solver as eigen_solver

    incomplete = getattr(eigen_solver, "IncompleteError", None)
    if incomplete is None:
        pytest.skip("furnace.eigen has no IncompleteError")

    def fake(*args, **kwargs):
        raise incomplete("slice 1: found 3 of about 5\neigenvalues", None)

    monkeypatch.setattr(solve, "compute_modes", fake)
    assert main(["modes", "--fmin", "0.3", "--fmax", "0.4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "found 3 of about 5 eigenvalues" in err


def test_options_come_from_the_modes_config_fields():
    import dataclasses

    from furnace.normal_modes.config import ModesConfig

    modes = build_parser()._subparsers._group_actions[0].choices["modes"]
    by_dest = {a.dest: a for a in modes._actions}
    for f in dataclasses.fields(ModesConfig):
        if f.name not in by_dest:  # order and lumped: set by --p2
            continue
        action = by_dest[f.name]
        assert action.option_strings[0] == "--" + f.name.replace("_", "-"), f.name
        if f.name != "slices":  # None: 1, or the number of MPI ranks
            assert action.help == f.metadata["help"], f.name
            assert action.default == (None if f.default is dataclasses.MISSING else f.default)
    assert set(by_dest) >= {"planet", "fmin_mhz", "fmax_mhz", "mesh_size", "slices", "fluid"}
    # the short spellings of the band parse into the same fields
    args = build_parser().parse_args(["modes", "--fmin", "0.3", "--fmax-mhz", "0.6"])
    assert (args.fmin_mhz, args.fmax_mhz) == (0.3, 0.6)
