"""The CLI contract of every `furnace` subcommand, walked from one table.

A user's mistake exits with status 2 and one line on stderr that names the argument and
what is allowed, before any rank is spawned or any solve starts; never a traceback. Each
system keeps its cases in ``tests/<system>/cli_bad_inputs.py`` as ``BAD_INPUTS``; this
file collects them, runs each through `furnace.cli.main` in this process, and checks that
every subcommand has cases and that every option's ``--help`` shows its default.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from furnace.cli import build_parser, main
from furnace.runtime.cliargs import DefaultsFormatter

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

TESTS = Path(__file__).parent
# a case is a user's mistake: it must be refused before any real work, so well within this
FAIL_FAST_S = 10.0


def _tables() -> list[tuple[str, list[str]]]:
    cases = []
    for path in sorted(TESTS.glob("*/cli_bad_inputs.py")):
        module = importlib.import_module(f"tests.{path.parent.name}.cli_bad_inputs")
        cases += [(f"{path.parent.name}:{cid}", argv) for cid, argv in module.BAD_INPUTS]
    return cases


CASES = _tables()


def _sub_actions(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _leaf_commands(parser=None, prefix=()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every runnable command path (("moe", "bench"), ("info",), ...) and its parser."""
    parser = parser or build_parser()
    leaves = {}
    for action in _sub_actions(parser):
        for name, child in action.choices.items():
            path = (*prefix, name)
            if _sub_actions(child):
                leaves.update(_leaf_commands(child, path))
            else:
                leaves[path] = child
    return leaves


def _command_path(argv: list[str]) -> tuple[str, ...]:
    """The leading tokens of argv that name a (sub)command."""
    parser, path = build_parser(), []
    for token in argv:
        choices = {n: c for a in _sub_actions(parser) for n, c in a.choices.items()}
        if token not in choices:
            break
        path.append(token)
        parser = choices[token]
    return tuple(path)


def _named(line: str, argv: list[str]) -> bool:
    """The message names something the user typed: a flag or a positional value."""
    rest = argv[len(_command_path(argv)):]
    tokens = [t.split("=", 1)[0] for t in rest] + [t.split("=", 1)[-1] for t in rest]
    tokens = [t for t in tokens if t]
    if any(t in line for t in tokens):
        return True
    # a positional is named by its metavar (argparse's own "argument A: ...")
    return "argument " in line


def test_the_table_is_not_empty():
    assert len(CASES) >= 20, "every system's cli_bad_inputs.py must be found"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("case_id", "argv"), CASES, ids=[c for c, _ in CASES])
def test_bad_input_exits_2_with_one_line(case_id, argv, capsys):
    t0 = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in out + err, err
    assert code == 2, f"exit {code}; stderr: {err!r}"
    assert len(lines) == 1, f"stderr must be one line, got {len(lines)}: {err!r}"
    assert lines[0].startswith("furnace"), lines[0]
    assert _named(lines[0], argv), f"the message names no argument of {argv}: {lines[0]}"
    assert elapsed < FAIL_FAST_S, f"took {elapsed:.1f} s: work started before the check"


def test_every_subcommand_has_bad_input_cases():
    covered = {_command_path(argv) for _, argv in CASES}
    missing = [" ".join(path) for path in _leaf_commands() if path not in covered]
    assert not missing, f"subcommands without bad-input cases: {missing}"


def test_every_help_shows_every_default():
    for path, parser in _leaf_commands().items():
        assert issubclass(parser.formatter_class, DefaultsFormatter), path
        formatter = parser._get_formatter()
        text = parser.format_help()
        for action in parser._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS:
                continue
            if action.help is argparse.SUPPRESS:
                continue
            shown = formatter._expand_help(action)
            flag = action.option_strings[-1]
            assert "default" in shown, f"furnace {' '.join(path)} {flag}: no default in --help"
            # what the formatter expands is what --help prints (modulo line wrapping)
            assert " ".join(shown.split()[-2:]) in " ".join(text.split()), (path, flag)


@pytest.mark.timeout(60)
def test_a_bad_input_as_a_process_exits_2_without_traceback():
    out = subprocess.run([sys.executable, "-m", "furnace.cli", "selfcheck", "--world-size", "0"],
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "furnace selfcheck: error: argument --world-size: must be an integer in [1, 64], got 0"]


def test_every_command_group_help_says_what_runs_by_default():
    def groups(parser, prefix=()):
        yield prefix, parser
        for action in _sub_actions(parser):
            for name, child in action.choices.items():
                if _sub_actions(child):
                    yield from groups(child, (*prefix, name))

    for path, parser in groups(build_parser()):
        assert "(default: none, which prints this help)" in " ".join(
            parser.format_help().split()), f"furnace {' '.join(path)} --help"
