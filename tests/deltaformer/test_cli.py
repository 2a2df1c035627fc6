"""Tests for `furnace deltaformer` (DeltaFormer, Xu et al., NeurIPS 2025) and its
`furnace reproduce` registration."""

from __future__ import annotations

import pytest

from furnace.cli import main
from furnace.runtime.reproduce import discover


def test_train_on_a_tiny_config_prints_accuracies(capsys):
    rc = main(["deltaformer", "train", "--task", "swap", "--mixer", "attention", "--d-model",
               "16", "--heads", "2", "--steps", "5", "--batch-size", "8",
               "--eval-sequences", "16", "--eval-lengths", "24", "--no-rotary"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "token accuracy" in out and "last-position accuracy" in out
    assert "last-position accuracy at T=24" in out


def test_a_diverged_run_exits_1_and_says_so(capsys):
    rc = main(["deltaformer", "train", "--task", "parity", "--length", "128", "--d-model", "32",
               "--heads", "1", "--steps", "3", "--batch-size", "8", "--eval-sequences", "8"])
    assert rc == 1
    assert "diverged" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--task", "nope"], ["--kappa1", "bogus"],
                                  ["--heads", "3"], ["--resume"]])
def test_bad_arguments_exit_2_with_a_message(argv, capsys):
    try:
        rc = main(["deltaformer", "train", *argv])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    assert "furnace deltaformer train" in capsys.readouterr().err


def test_reproduce_discovers_the_experiments():
    experiments = discover("deltaformer")
    assert [e.name for e in experiments] == ["swap", "kernels", "parity_modarith", "lm",
                                             "kappa1"]
    assert [e.name for e in experiments if e.quick] == ["swap", "kernels"]
