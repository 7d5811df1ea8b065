"""Command-line options built from a config dataclass, so that each setting is declared once.

Every field of a command's settings dataclass says how it is set: `option(default, help, ...)`
puts its option, help text and choices beside its type and default, `not_an_option(default)` says
it deliberately has none. `add_config_options` builds the options from that and `config_from_args`
builds the dataclass back from the parsed options. Every command with settings uses it
(docs/guides/configuration.md lists them); `UsageError` is the one error a command prints as a
line and exit 2. Standard library only: it lives in the neutral `pipelines.io`, which both
`pipelines` and `labse_model` import.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

CLI = "cli"  # the metadata key
REQUIRED = dataclasses.MISSING  # option(REQUIRED, help): a field without default, a required option


class UsageError(ValueError):
    """What the user can fix (an option, an input, an output): every command prints it as one line
    and exits 2. Any other exception is a bug and keeps its traceback. A ValueError, so that library
    callers catching ValueError from a config's check still do."""


@dataclass(frozen=True)
class CliOption:
    """How one dataclass field is set on the command line (read by `add_config_options`).

    help: the help text (a parser with `HelpFormatter` adds the default; `%(default)s` works too).
    flag: the option, when it is not `--field-name` (e.g. `--lr` for `learning_rate`).
    metavar, choices: as argparse's.
    resumable: the setting may change on `--resume`. The option defaults to None ("not given"), so
        that a resumed run can tell an option given from its default; a new run gets the field's default.
    derived: the command derives the default from other options; the option defaults to None and
        `--help` shows this text as the default (`{default}` is the field's default).
    group: the argument group (a name the command maps to a group); None: the config's own group.

    A bool field is a `--flag` (default False) or a `--flag/--no-flag` pair (default True); a `tuple[T, ...]` field takes comma-separated values;
    an optional field (`T | None`) takes a T and defaults to its field's default.
    """

    help: str
    flag: str | None = None
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    resumable: bool = False
    derived: str | None = None
    group: str | None = None


def option(default: Any, help: str, **settings: Any) -> Any:
    """A dataclass field with `default` that is a command-line option (`CliOption(help, **settings)`)."""
    return field(default=default, metadata={CLI: CliOption(help, **settings)})


def not_an_option(default: Any) -> Any:
    """A dataclass field with `default` that deliberately has no command-line option."""
    return field(default=default, metadata={CLI: None})


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the empty ones (None, False) that say nothing; a tuple as the option
    takes it (`2,4,9`)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        if isinstance(action.default, tuple) and action.help and "%(default)" not in action.help:
            return f"{action.help} (default: {_comma_joined(action.default)})"
        return super()._get_help_string(action)


def config_options(cls: type) -> list[tuple[dataclasses.Field, CliOption | None]]:
    """Every field of the dataclass `cls` with its `CliOption`, None where it is marked not an option.

    TypeError for a field that says neither: every setting is an option or deliberately not one."""
    found = []
    for f in dataclasses.fields(cls):
        if CLI not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no command-line metadata: declare it with "
                            "pipelines.io.config_options.option(...) or not_an_option(...)")
        found.append((f, f.metadata[CLI]))
    return found


def option_flag(f: dataclasses.Field, spec: CliOption) -> str:
    return spec.flag or "--" + f.name.replace("_", "-")


def resumable_fields(cls: type) -> tuple[str, ...]:
    """The fields of `cls` whose options are marked resumable (they may change on --resume)."""
    return tuple(f.name for f, spec in config_options(cls) if spec is not None and spec.resumable)


def _comma_joined(values: tuple) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _comma_separated(element: type) -> Callable[[str], tuple]:
    kind = "integers" if element is int else "numbers"

    def parse(text: str) -> tuple:
        try:
            return tuple(element(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind}, got {text!r}") from None

    parse.__name__ = f"comma-separated {kind}"
    return parse


def _without_none(annotation: Any) -> Any:
    """T for `T | None` (`Optional[T]`); any other annotation as it is."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(kept) == 1:
            return kept[0]
    return annotation


def _argparse_settings(cls: type, f: dataclasses.Field, annotation: Any, spec: CliOption) -> dict[str, Any]:
    """add_argument's keywords for one field: its action or type, default, help and metavar."""
    flag = option_flag(f, spec)
    annotation = _without_none(annotation)
    settings: dict[str, Any] = {"dest": f.name, "help": spec.help}
    if spec.choices is not None:
        settings["choices"] = spec.choices
    if annotation is bool and f.default:
        # --flag / --no-flag, e.g. --gather-negatives / --no-gather-negatives, --bf16 / --no-bf16.
        return {**settings, "action": argparse.BooleanOptionalAction, "default": True}
    if annotation is bool:  # off unless given: --include-text, --same-site
        return {**settings, "action": "store_true", "default": False}
    if typing.get_origin(annotation) is tuple:
        settings["type"] = _comma_separated(typing.get_args(annotation)[0])
    elif annotation in (int, float, str):
        settings["type"] = annotation
    else:
        raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for a {annotation!r} field")
    if spec.metavar is not None or spec.choices is None:  # with choices argparse shows {a,b,c}
        settings["metavar"] = spec.metavar or flag.lstrip("-").replace("-", "_").upper()
    if f.default is dataclasses.MISSING:
        return {**settings, "required": True}
    if spec.derived is not None:
        # None = not given: the command derives the value (`config_from_args(..., derived=)`).
        settings["default"] = None
        settings["help"] = f"{spec.help} (default {spec.derived.format(default=f.default)})"
    elif spec.resumable:
        # None = not given: a new run takes the field's default, a resumed run keeps the run's value.
        settings["default"] = None
        settings["help"] = f"{spec.help} (default {f.default})"
    else:
        settings["default"] = f.default
    return settings


def add_config_options(group: argparse._ActionsContainer, cls: type,
                       groups: Mapping[str, argparse._ActionsContainer] | None = None) -> None:
    """Add an option for every field of the dataclass `cls` that has one, to `group`, or to
    `groups[name]` for a field whose `CliOption.group` is `name`."""
    annotations = typing.get_type_hints(cls)
    for f, spec in config_options(cls):
        if spec is None:
            continue
        target = group if spec.group is None else (groups or {})[spec.group]
        target.add_argument(option_flag(f, spec), **_argparse_settings(cls, f, annotations[f.name], spec))


def config_from_args(cls: type, args: argparse.Namespace,
                     derived: Mapping[str, Callable[[], Any]] | None = None) -> Any:
    """The dataclass `cls` from the options `add_config_options` added (its `__post_init__`, if
    any, checks every value). An option not given (None) takes the field's default, or for a
    `derived` field `derived[name]()` (called only then: deriving a default may itself fail, e.g. a
    depth without L/4 stages); a field that is not an option keeps its default."""
    values = {}
    for f, spec in config_options(cls):
        if spec is None:
            continue
        value = getattr(args, f.name)
        if value is None and spec.derived is not None:
            if derived is None or f.name not in derived:
                raise TypeError(f"{cls.__name__}.{f.name} is derived by the command: pass it in derived=")
            value = derived[f.name]()
        elif value is None and spec.resumable:
            value = f.default
        values[f.name] = value
    try:
        return cls(**values)
    except UsageError:
        raise
    except ValueError as error:  # the config's own check: the options given are at fault
        raise UsageError(str(error)) from error
