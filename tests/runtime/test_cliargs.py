"""`furnace.runtime.cliargs.add_config_arguments` and `config_from_args`: options declared
from a config dataclass's fields, and the config built back from the parsed arguments."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from furnace.runtime.cliargs import (
    Parser,
    add_config_arguments,
    config_from_args,
    positive_int,
)

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


@dataclass(frozen=True, kw_only=True)
class Example:
    """A config with one field of every kind the helper derives an option for."""

    tokens_per_rank: int = field(default=2048, metadata={"help": "tokens each rank routes"})
    lr: float = field(default=3e-3, metadata={"help": "peak rate, 100% at the peak"})
    task: str = field(default="swap", metadata={"help": "task", "choices": ("swap", "lm")})
    mode: Literal["fast", "exact"] = field(default="exact", metadata={"help": "how"})
    group_size: int | None = field(default=None, metadata={"help": "ranks per group"})
    policies: tuple[str, ...] = field(default=("a", "b"), metadata={"help": "which"})
    interval: tuple[float, float] = field(default=(0.0, 1.0), metadata={"help": "[a, b]"})
    rotary: bool = field(default=True, metadata={"help": "rotary positions"})
    out: Path | None = field(default=None, metadata={"help": "output"})
    fmin: float = field(metadata={"help": "lowest frequency"})


def _parser(**kwargs) -> tuple[Parser, dict[str, str]]:
    parser = Parser(prog="furnace example")
    return parser, add_config_arguments(parser, Example, **kwargs)


def test_flags_are_the_field_names_with_dashes():
    _, flags = _parser()
    assert flags["tokens_per_rank"] == "--tokens-per-rank"
    assert list(flags) == ["tokens_per_rank", "lr", "task", "mode", "group_size", "policies",
                           "interval", "rotary", "out", "fmin"]


def test_defaults_round_trip_to_the_config():
    parser, _ = _parser()
    args = parser.parse_args(["--fmin", "0.3"])
    assert config_from_args(Example, args) == Example(fmin=0.3)


def test_values_are_typed_from_the_annotations():
    parser, _ = _parser()
    args = parser.parse_args(["--fmin", "0.5", "--tokens-per-rank", "7", "--lr", "0.1",
                              "--task", "lm", "--mode", "fast", "--group-size", "2",
                              "--policies", "b", "--interval", "-1", "2", "--no-rotary",
                              "--out", "x.json"])
    config = config_from_args(Example, args)
    assert config == Example(fmin=0.5, tokens_per_rank=7, lr=0.1, task="lm", mode="fast",
                             group_size=2, policies=("b",), interval=(-1.0, 2.0),
                             rotary=False, out=Path("x.json"))
    # argparse collects a list; the config holds the tuple its annotation says
    assert isinstance(config.policies, tuple) and isinstance(config.interval, tuple)


@pytest.mark.parametrize(("argv", "flag", "says"), [
    (["--tokens-per-rank", "many"], "--tokens-per-rank", "must be an integer"),
    (["--lr", "nan"], "--lr", "finite number"),
    (["--task", "sort"], "--task", "invalid choice"),
    (["--mode", "slow"], "--mode", "invalid choice"),
    ([], "--fmin", "required"),
])
def test_a_bad_value_is_one_line_naming_the_flag(argv, flag, says, capsys):
    parser, _ = _parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args(argv + (["--fmin", "1"] if flag != "--fmin" else []))
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and flag in err and says in err, err


def test_help_shows_every_fields_help_and_default(capsys):
    parser, _ = _parser()
    text = " ".join(parser.format_help().split())
    for shown in ("tokens each rank routes (default: 2048)", "peak rate, 100% at the peak "
                  "(default: 0.003)", "(default: swap)", "(default: exact)",
                  "ranks per group (default: none)", "which (default: a b)",
                  "[a, b] (default: 0.0 1.0)", "rotary positions (default: True)"):
        assert shown in text, shown
    assert "{swap,lm}" in text and "{fast,exact}" in text


def test_a_subset_in_order_and_exclusions():
    parser, flags = _parser(fields=["lr", "tokens_per_rank", "fmin"], exclude=["fmin"])
    assert list(flags) == ["lr", "tokens_per_rank"]
    args = parser.parse_args(["--lr", "0.5"])
    assert not hasattr(args, "task")
    # fields the parser does not declare keep their defaults; values set computed ones
    assert config_from_args(Example, args, fmin=2.0, task="lm") == Example(
        lr=0.5, fmin=2.0, task="lm")


def test_overrides_replace_type_metavar_default_and_flags(capsys):
    parser, flags = _parser(overrides={
        "tokens_per_rank": {"type": positive_int, "metavar": "T"},
        "fmin": {"flags": ("--fmin-mhz", "--fmin"), "default": 0.1},
        "group_size": {"help": "ranks per group (default: the model chooses)"},
    })
    assert flags["fmin"] == "--fmin-mhz"
    # the old spelling still parses, into the field's name
    assert parser.parse_args(["--fmin", "0.7"]).fmin == 0.7
    assert parser.parse_args([]).fmin == 0.1  # an override's default makes it optional
    with pytest.raises(SystemExit):
        parser.parse_args(["--tokens-per-rank", "0"])
    assert "must be an integer >= 1, got 0" in capsys.readouterr().err
    text = " ".join(parser.format_help().split())
    assert "--tokens-per-rank T" in text
    assert "(default: the model chooses)" in text and "(default: none)" not in text.split(
        "--group-size")[1].split("--")[0]


def test_a_positional_field():
    parser, flags = _parser(fields=["task"], overrides={"task": {"flags": ("task",)}})
    assert flags == {"task": "task"}
    assert parser.parse_args(["lm"]).task == "lm"


def test_mistakes_in_the_commands_code_are_type_errors():
    @dataclass
    class NoHelp:
        steps: int = 3

    @dataclass
    class Odd:
        weights: dict[str, int] = field(default_factory=dict, metadata={"help": "weights"})

    with pytest.raises(TypeError, match="no help"):
        add_config_arguments(Parser(), NoHelp)
    with pytest.raises(TypeError, match="no option type"):
        add_config_arguments(Parser(), Odd)
    with pytest.raises(TypeError, match="no field"):
        add_config_arguments(Parser(), Example, fields=["nope"])
    with pytest.raises(TypeError, match="unknown keyword"):
        add_config_arguments(Parser(), Example, overrides={"lr": {"dest": "x"}})
    with pytest.raises(TypeError, match="not a dataclass"):
        add_config_arguments(Parser(), argparse.Namespace)
    # a help override is enough for a field without metadata
    parser = Parser()
    add_config_arguments(parser, NoHelp, overrides={"steps": {"help": "steps"}})
    assert parser.parse_args(["--steps", "4"]).steps == 4


def test_checkpoint_usage_error_names_the_flag_and_the_path(tmp_path):
    from furnace.runtime.atomic import OutputError
    from furnace.runtime.cliargs import checkpoint_usage_error
    from furnace.runtime.training import CheckpointExistsError, CorruptCheckpointError

    exists = checkpoint_usage_error(CheckpointExistsError(tmp_path / "ck", "exists"))
    assert exists.argument == "--checkpoint" and str(tmp_path / "ck") in exists.allowed
    assert "--resume" in exists.allowed and "--overwrite" in exists.allowed
    corrupt = checkpoint_usage_error(CorruptCheckpointError(tmp_path / "ck", "is garbage"),
                                     flag="--resume")
    assert str(corrupt) == f"argument --resume: {tmp_path / 'ck'} is garbage"
    assert checkpoint_usage_error(OutputError("no room")).allowed == "no room"
