"""The `furnace` command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from furnace.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("info", "reproduce", "selfcheck", "topology"):
        assert command in out
    with pytest.raises(SystemExit) as info:
        main(["reproduce", "--help"])
    assert info.value.code == 0
    assert "--quick" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_info_runs_as_a_command():
    out = subprocess.run([sys.executable, "-m", "furnace.cli", "info"], capture_output=True,
                         text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "torch.distributed" in out.stdout and "gloo" in out.stdout


def test_reproduce_list_and_unknown_system(capsys):
    assert main(["reproduce", "--list", "runtime"]) == 0
    assert "runtime/emulator" in capsys.readouterr().out
    assert main(["reproduce", "nonsense"]) == 2
    assert "unknown system" in capsys.readouterr().err


def test_topology_command(capsys):
    assert main(["topology", "sunway-oceanlight"]) == 0
    assert "256 nodes/supernode" in capsys.readouterr().out
    assert main(["topology", "abacus"]) == 2


@pytest.mark.timeout(90)
def test_selfcheck_command(capsys):
    assert main(["selfcheck", "--world-size", "3"]) == 0
    assert "selfcheck: ok (3 gloo ranks" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["selfcheck", "--world-size", "0"])
    assert info.value.code == 2
