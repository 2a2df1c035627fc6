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
- `add_config_arguments` declares one option per field of a config dataclass (flag, default,
  type, choices and help all from the field), and `config_from_args` builds the config back
  from the parsed arguments, so a CLI never restates a config's literals.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from .atomic import OutputError, check_writable_dir, check_writable_file

__all__ = [
    "ConfigFieldError",
    "DefaultsFormatter",
    "add_config_arguments",
    "checkpoint_usage_error",
    "config_from_args",
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
    "require_positive_ints",
]


class ConfigFieldError(ValueError):
    """A config field has a value that cannot be used; ``field`` names it and ``allowed``
    says what is allowed (with the value given), so a CLI can name its own flag."""

    def __init__(self, field_name: str, allowed: str) -> None:
        self.field = field_name
        self.allowed = allowed
        super().__init__(f"{field_name}: {allowed}")


def require_positive_ints(config: object, names: tuple[str, ...],
                          error: type[ConfigFieldError] = ConfigFieldError) -> None:
    """Each named field an integer >= 1 (a bool is not a count); ``error`` otherwise."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise error(name, f"must be an integer >= 1, got {value!r}")


class UsageError(Exception):
    """A user's mistake found after parsing (a combination of arguments, a file's content).

    ``argument`` names the flag (``"--top-k"``) and ``allowed`` says what is allowed,
    ideally with the value given: ``UsageError("--top-k", "must be <= 4 experts, got 9")``.
    """

    def __init__(self, argument: str, allowed: str) -> None:
        self.argument = argument
        self.allowed = allowed
        super().__init__(f"argument {argument}: {allowed}" if argument else allowed)


def checkpoint_usage_error(exc: Exception, flag: str = "--checkpoint") -> UsageError:
    """A trainer's refusal to use its checkpoint (`furnace.runtime.training.CheckpointError`
    other than a config mismatch, which each CLI words with its own flags, or an unwritable
    path, `furnace.runtime.atomic.OutputError`) in a CLI's words, naming ``flag``."""
    from .training import CheckpointError, CheckpointExistsError

    if isinstance(exc, CheckpointExistsError):
        return UsageError(flag, f"{exc.path} exists; pass --resume to continue its run or "
                          "--overwrite to replace it")
    if isinstance(exc, CheckpointError):
        return UsageError(flag, f"{exc.path} {exc.reason}")
    return UsageError(flag, str(exc))


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        # "--calib" silently meaning "--calibrate" is a surprise, not a convenience
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # the innermost parser's value wins, so `main` knows which subcommand to name
        self.set_defaults(_prog=self.prog)

    def add_subparsers(self, **kwargs: Any) -> Any:
        # a command group run without its subcommand prints its help (furnace.cli.main and
        # each group's set_defaults); --help says so, as it states every other default
        kwargs.setdefault("help", "the subcommand to run (default: none, which prints this "
                          "help)")
        return super().add_subparsers(**kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        # argparse omits an option without help from the help's right column, default included
        if kwargs.get("help") is None and kwargs.get("action") not in ("help", "version"):
            kwargs["help"] = _NO_HELP
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _describe_range(kind: str, lo: float | None, hi: float | None, lo_open: bool,
                    hi_open: bool) -> str:
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


# --- options declared from a config dataclass -------------------------------------------

ConfigT = TypeVar("ConfigT")

# the add_argument keywords an override may replace, besides "flags"
_ARGUMENT_KEYWORDS = frozenset({"action", "choices", "default", "help", "metavar", "nargs",
                                "required", "type"})


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` (or ``Optional[X]``) -> (X, True); anything else -> (it, False)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1 and len(members) < len(typing.get_args(annotation)):
            return members[0], True
    return annotation, False


def _scalar_parser(annotation: Any) -> Callable[[str], Any] | None:
    """The argparse ``type`` of one value of a field annotated ``annotation``."""
    if annotation is bool:
        return None  # a bool field is a --flag/--no-flag switch, not a typed value
    if annotation is int:
        return int_in()
    if annotation is float:
        return float_in()
    if annotation is str:
        return str
    if annotation is Path:
        return Path
    return None


def _derived_keywords(config_cls: type, field: dataclasses.Field[Any],
                      annotation: Any) -> dict[str, Any]:
    """What the field itself says: type, choices, nargs, default, help."""
    kwargs: dict[str, Any] = {}
    metadata = field.metadata
    if "help" in metadata:
        # argparse %-formats help strings; the field's text is plain prose
        kwargs["help"] = str(metadata["help"]).replace("%", "%%")
    if field.default is not dataclasses.MISSING:
        kwargs["default"] = field.default
    elif field.default_factory is not dataclasses.MISSING:
        kwargs["default"] = field.default_factory()
    else:
        kwargs["required"] = True
    inner, _ = _unwrap_optional(annotation)
    choices: Sequence[Any] | None = metadata.get("choices")
    if typing.get_origin(inner) is typing.Literal:
        choices = typing.get_args(inner)
        inner = type(choices[0])
    if typing.get_origin(inner) is tuple:
        members = typing.get_args(inner)
        if len(members) == 2 and members[1] is Ellipsis:
            kwargs["nargs"] = "+"
            inner = members[0]
        elif members and all(m == members[0] for m in members):
            kwargs["nargs"] = len(members)
            inner = members[0]
        else:
            raise TypeError(f"{config_cls.__name__}.{field.name}: no option for {annotation!r}; "
                            "give a 'type' override")
        if typing.get_origin(inner) is typing.Literal:
            choices = choices or typing.get_args(inner)
            inner = type(typing.get_args(inner)[0])
    if inner is bool and "nargs" not in kwargs:
        kwargs["action"] = argparse.BooleanOptionalAction
        return kwargs
    if choices is not None:
        kwargs["choices"] = tuple(choices)
    scalar = _scalar_parser(inner)
    if scalar is not None:
        kwargs["type"] = scalar
    return kwargs


def add_config_arguments(
    parser: argparse.ArgumentParser,
    config_cls: type,
    fields: Sequence[str] | None = None,
    *,
    exclude: Sequence[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """Declare one option of ``parser`` per field of the dataclass ``config_cls``.

    The flag is the field's name with dashes (``tokens_per_rank`` -> ``--tokens-per-rank``),
    its default the field's default (a field without one is a required option), its help
    ``field.metadata["help"]``, and its type follows the annotation: ``int`` and ``float``
    take a (finite) number, ``str`` and ``Path`` the text, ``bool`` is a ``--x/--no-x``
    switch, ``Literal[...]`` (or ``metadata["choices"]``) gives the choices, ``X | None``
    defaults to none, and ``tuple[X, ...]`` takes one or more values (``tuple[X, X]``: two).

    Args:
        fields: the fields to declare, in this order; None means every field.
        exclude: fields left out (those the command sets another way).
        overrides: per field, add_argument keywords that replace the derived ones (a
            range-checked ``type`` such as `positive_int`, a ``metavar``, a ``default`` the
            command chooses itself), and ``"flags"``: the option strings to use instead, the
            new spelling first (a single name without dashes makes a positional).

    Returns:
        The flag of each declared field, ``{"tokens_per_rank": "--tokens-per-rank"}``, for
        messages that must name what the user typed.

    Raises:
        TypeError: a field has no help text, or an annotation without a derived type and no
            ``type`` override; a name in ``fields``, ``exclude`` or ``overrides`` is not a
            field. These are mistakes in the command's code, found when its parser is built.
    """
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    by_name = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    overrides = dict(overrides or {})
    unknown = [n for n in (*(fields or ()), *exclude, *overrides) if n not in by_name]
    if unknown:
        raise TypeError(f"{config_cls.__name__} has no field(s) {', '.join(unknown)}")
    for name, given in overrides.items():
        bad = set(given) - _ARGUMENT_KEYWORDS - {"flags"}
        if bad:
            raise TypeError(f"override of {name}: unknown keyword(s) {', '.join(sorted(bad))}")
    hints = typing.get_type_hints(config_cls)
    names = [n for n in (fields if fields is not None else by_name) if n not in exclude]
    declared: dict[str, str] = {}
    for name in names:
        field = by_name[name]
        kwargs = _derived_keywords(config_cls, field, hints[name])
        given = dict(overrides.get(name, {}))
        flags = tuple(given.pop("flags", (f"--{name.replace('_', '-')}",)))
        kwargs.update(given)
        if "default" in given and "required" not in given:
            kwargs.pop("required", None)  # the command supplies the missing default
        if not kwargs.get("help"):
            raise TypeError(f"{config_cls.__name__}.{name} has no help: give the field "
                            "metadata={'help': ...} or a 'help' override")
        if "type" not in kwargs and "action" not in kwargs and "choices" not in kwargs:
            raise TypeError(f"{config_cls.__name__}.{name}: no option type for "
                            f"{hints[name]!r}; give a 'type' override")
        if len(flags) == 1 and not flags[0].startswith("-"):
            kwargs.pop("required", None)  # a positional is required by being one
            parser.add_argument(flags[0], **kwargs)
        else:
            parser.add_argument(*flags, dest=name, **kwargs)
        declared[name] = flags[0]
    return declared


def config_from_args(config_cls: type[ConfigT], args: argparse.Namespace,
                     **values: Any) -> ConfigT:
    """``config_cls`` built from the parsed ``args`` that are its fields, plus ``values``.

    ``values`` set the fields the command computes itself (and win over ``args``); a list
    that argparse collected becomes the tuple the config holds. Fields neither in ``args``
    nor in ``values`` keep their defaults.
    """
    parsed = vars(args)
    kwargs: dict[str, Any] = {}
    # dataclasses.fields raises TypeError for a class that is not a dataclass
    for field in dataclasses.fields(typing.cast(Any, config_cls)):
        if field.init and field.name in parsed:
            value = parsed[field.name]
            kwargs[field.name] = tuple(value) if isinstance(value, list) else value
    kwargs.update(values)
    return config_cls(**kwargs)
