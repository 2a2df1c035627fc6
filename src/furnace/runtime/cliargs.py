"""The command-line contract every `furnace` subcommand keeps.

A user's mistake (a bad number, an impossible combination, an unreadable input, an
unwritable output) is caught before any rank is spawned or any solve starts, and ends
with exit status 2 and one line on stderr naming the argument and what is allowed:

    furnace moe bench: error: argument --top-k: must be an integer in [1, 4], got 0

- `Parser` is the `argparse.ArgumentParser` of the whole command tree: its sub-parsers
  inherit it, it prints errors as one line, and its ``--help`` shows every default.
- The ``type=`` factories (`int_in`, `float_in`, `input_file`, `output_file`,
  `output_dir`) check one value while argparse parses it.
- `UsageError` is raised by a subcommand for a check that spans several arguments;
  `furnace.cli.main` prints it in the same one-line form and returns 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from .atomic import OutputError, check_writable_dir, check_writable_file

__all__ = [
    "DefaultsFormatter",
    "Parser",
    "UsageError",
    "float_in",
    "input_file",
    "int_in",
    "nonnegative_int",
    "output_dir",
    "output_file",
    "positive_float",
    "positive_int",
    "require",
]


class UsageError(Exception):
    """A user's mistake found after parsing (a combination of arguments, a file's content).

    ``argument`` names the flag (``"--top-k"``) and ``allowed`` says what is allowed,
    ideally with the value given: ``UsageError("--top-k", "must be <= 4 experts, got 9")``.
    """

    def __init__(self, argument: str, allowed: str) -> None:
        self.argument = argument
        self.allowed = allowed
        super().__init__(f"argument {argument}: {allowed}" if argument else allowed)


def require(condition: bool, argument: str, allowed: str) -> None:
    """Raise `UsageError(argument, allowed)` unless ``condition``."""
    if not condition:
        raise UsageError(argument, allowed)


# stands in for a missing help text: argparse prints no help column for an empty or blank one,
# and with it no default
_NO_HELP = "@furnace-no-help@"


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every option's help that does not already state it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text == _NO_HELP:
            text = ""
        if "(default" in text or "%(default)" in text:
            return text
        if action.default is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL,
                                                              argparse.ZERO_OR_MORE):
            return text  # a required positional has no default to show
        default = action.default
        if isinstance(default, (list, tuple)):
            default = " ".join(str(x) for x in default) or "none"
        elif default is None:
            default = "none"
        # the help string is %-formatted by argparse afterwards
        default = str(default).replace("%", "%%")
        return f"{text} (default: {default})".strip()


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` with a one-line error and every default in ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        # "--calib" silently meaning "--calibrate" is a surprise, not a convenience
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # the innermost parser's value wins, so `main` knows which subcommand to name
        self.set_defaults(_prog=self.prog)

    def add_subparsers(self, **kwargs):
        # a command group run without its subcommand prints its help (furnace.cli.main and
        # each group's set_defaults); --help says so, as it states every other default
        kwargs.setdefault("help", "the subcommand to run (default: none, which prints this "
                          "help)")
        return super().add_subparsers(**kwargs)

    def add_argument(self, *args, **kwargs):
        # argparse omits an option without help from the help's right column, default included
        if kwargs.get("help") is None and kwargs.get("action") not in ("help", "version"):
            kwargs["help"] = _NO_HELP
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _describe_range(kind: str, lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"{kind} in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{kind} {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f"{kind} {'<' if hi_open else '<='} {hi:g}"
    return kind


def int_in(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers in [lo, hi] (either end may be None)."""
    allowed = _describe_range("an integer", lo, hi, False, False)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
             hi_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite floats in the given range (ends open or closed)."""
    allowed = _describe_range("a finite number", lo, hi, lo_open, hi_open)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        bad = not math.isfinite(value)
        if lo is not None:
            bad |= value <= lo if lo_open else value < lo
        if hi is not None:
            bad |= value >= hi if hi_open else value > hi
        if bad:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


positive_int = int_in(1)
nonnegative_int = int_in(0)
positive_float = float_in(0.0, lo_open=True)


def input_file(text: str) -> Path:
    """An argparse ``type``: a regular file that this process can read."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"file {text} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None
    return path


def output_file(text: str) -> Path:
    """An argparse ``type``: a file path whose folder exists and is writable (checked now)."""
    try:
        return check_writable_file(text)
    except OutputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_dir(text: str) -> Path:
    """An argparse ``type``: a folder that exists and is writable, or can be created.

    Nothing is left behind while parsing (``--help`` and ``--list`` must not create
    folders): the nearest existing ancestor gets a probe folder, created and removed, which
    also catches read-only and pseudo file systems that ``os.access`` does not.
    """
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
        try:
            check_writable_dir(path, create=False)
        except OutputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return path
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create folder {text}: {probe} is a file")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".furnace-probe-", dir=probe))
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot create folder {text}: {exc.strerror or exc}") from None
    return path
