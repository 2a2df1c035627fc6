"""Tests for `furnace deltaformer` (DeltaFormer, Xu et al., NeurIPS 2025) and its
`furnace reproduce` registration."""

from __future__ import annotations

import json

import pytest
import torch

from furnace.cli import build_parser, main
from furnace.runtime.reproduce import discover


def test_train_on_a_tiny_config_prints_accuracies(capsys):
    rc = main(["deltaformer", "train", "--task", "swap", "--mixer", "attention", "--d-model",
               "16", "--num-heads", "2", "--steps", "5", "--batch-size", "8",
               "--eval-sequences", "16", "--eval-lengths", "24", "--no-rotary"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "token accuracy" in out and "last-position accuracy" in out
    assert "last-position accuracy at T=24" in out


def test_a_diverged_run_exits_1_and_says_so(capsys):
    rc = main(["deltaformer", "train", "--task", "parity", "--length", "128", "--d-model", "32",
               "--num-heads", "1", "--steps", "3", "--batch-size", "8", "--eval-sequences", "8"])
    assert rc == 1
    assert "diverged" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--task", "nope"], ["--kappa1", "bogus"],
                                  ["--num-heads", "3"], ["--resume"]])
def test_bad_arguments_exit_2_with_a_message(argv, capsys):
    # the full table is cli_bad_inputs.py (run by test_checkpoints.py and the central test)
    try:
        rc = main(["deltaformer", "train", *argv])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("furnace deltaformer train: error: argument ") and argv[0] in err


@pytest.mark.parametrize("command,defaults", [
    ("train", ["(default: 1500)", "(default: 0.003)", "(default: linear)", "(default: 64)",
               "(default: none)", "(default: False)"]),
    ("bench", ["(default: 128 256 512 1024)", "(default: softmax)", "(default: 3)"]),
])
def test_help_shows_every_default(command, defaults, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["deltaformer", command, "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in defaults:
        assert default in text
    # one "(default: ...)" per option but --help (argparse drops a blank help, default too)
    sub = build_parser()._subparsers._group_actions[0].choices["deltaformer"]
    parser = sub._subparsers._group_actions[0].choices[command]
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert text.count("(default: ") == len(options)


def test_train_writes_json_and_leaves_the_thread_count_alone(tmp_path, capsys):
    out = tmp_path / "result.json"
    threads = torch.get_num_threads()
    rc = main(["deltaformer", "train", "--task", "parity", "--d-model", "8", "--num-heads", "2",
               "--steps", "3", "--batch-size", "4", "--eval-sequences", "8", "--threads",
               "1", "--json", str(out)])
    assert rc == 0 and torch.get_num_threads() == threads
    result = json.loads(out.read_text())
    assert result["steps_done"] == 3 and len(result["losses"]) == 3
    assert result["config"]["task"] == "parity" and 0 <= result["last_acc"] <= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_bench_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["deltaformer", "bench", "--lengths", "8", "--heads", "1", "--dim", "4",
                 "--chunk-size", "4", "--repeats", "1", "--no-memory", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [row["T"] for row in payload["rows"]] == [8]
    assert payload["settings"]["dim"] == 4 and payload["rows"][0]["fwdbwd_ms_chunk"] > 0


def test_reproduce_discovers_the_experiments():
    experiments = discover("deltaformer")
    assert [e.name for e in experiments] == ["swap", "kernels", "parity_modarith", "lm",
                                             "kappa1"]
    assert [e.name for e in experiments if e.quick] == ["swap", "kernels"]


def test_train_options_are_the_train_config_fields():
    # flag, default, choices and help of each option come from its TrainConfig field
    import dataclasses

    from furnace.deltaformer.cli import FIELD_FLAGS
    from furnace.deltaformer.config import TrainConfig
    from furnace.runtime.cliargs import config_from_args

    sub = build_parser()._subparsers._group_actions[0].choices["deltaformer"]
    train = sub._subparsers._group_actions[0].choices["train"]
    by_dest = {a.dest: a for a in train._actions}
    for f in dataclasses.fields(TrainConfig):
        if f.name not in FIELD_FLAGS:
            continue
        action = by_dest[f.name]
        assert action.option_strings[0] == FIELD_FLAGS[f.name] == "--" + f.name.replace("_", "-")
        assert action.default == f.default and action.help == f.metadata["help"], f.name
        if "choices" in f.metadata:
            assert tuple(action.choices) == tuple(f.metadata["choices"]), f.name
    args = build_parser().parse_args(["deltaformer", "train", "--num-layers", "2",
                                      "--beta-activation", "2sigmoid", "--eval-lengths", "32"])
    assert config_from_args(TrainConfig, args) == TrainConfig(
        num_layers=2, beta_activation="2sigmoid", eval_lengths=(32,))
