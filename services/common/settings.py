"""A service's configuration as one frozen dataclass whose fields say where each value comes
from: its command-line flag, else its LAYERSERVE_* environment variable, else its default.

    @dataclass(frozen=True, slots=True)
    class TokenizerConfig:
        port: int = setting("--port", env="TOKENIZER_PORT", default=50059)
        threads: int = setting("--threads", env="TOKENIZER_THREADS", default=2, check=positive,
                               help="threads that tokenize prompts off the event loop")
        admin_key: str = setting(env="ADMIN_KEY", default="", repr=False)  # env only: a flag
                                                                            # would show in `ps`
        def __post_init__(self) -> None:
            check_settings(self)  # ValueError("--threads must be positive, got 0")

        @classmethod
        def from_args(cls, argv: list[str] | None = None) -> TokenizerConfig:
            return cls(**read_settings(cls, argv, prog="python -m services.tokenizer"))

Parsing follows the field's annotation: `str`, `int`, `float`, `bool` (a switch, --x and --no-x
or --x alone with negatable=False; its variable an integer, 0 = false), `X | None` (an empty
variable is None; for a number, 0 too: "unset, the default for the device"), and
`tuple[X, ...]` (a repeatable flag, or a comma-separated variable). A bad flag value is one
line on stderr and exit status 2 (argparse's status, without its usage text); a bad variable,
or a variable's value its check refuses, is a SettingError naming the variable, the value and
what is allowed; a flag's value its check refuses is a ValueError naming the flag.
`config_from_args` turns any of them into one line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

PREFIX = "LAYERSERVE_"

# A check returns what is wrong with a value ("must be positive, got 0"), prefixed with the
# flag's name in the error, or None when it is fine; it may also raise ValueError itself.
Check = Callable[[Any], "str | None"]

_KEY = "layerserve.setting"


class SettingError(ValueError):
    """An operator's bad setting: its message names the variable or flag, the value and what
    is allowed, and is all the operator sees (exit_for_setting)."""


def exit_for_setting(prog: str, error: Exception | str) -> NoReturn:
    """One line on stderr and exit status 2 (argparse's for a usage error), no traceback."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def config_from_args(
    cls: type, argv: list[str] | None, prog: str, prepare: Callable[[dict], dict] | None = None
) -> Any:
    """cls(**read_settings(...)), `prepare` adjusting the values first. Raises SettingError
    for a bad variable or value (a check across several too), which run_service turns into
    one line and exit status 2; a bad flag exits so at once."""
    try:
        values = read_settings(cls, argv, prog=prog)
        return cls(**(prepare(values) if prepare else values))
    except SettingError:
        raise
    except ValueError as err:
        raise SettingError(str(err)) from None


class _Parser(argparse.ArgumentParser):
    """argparse without its usage text on a bad flag: one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        exit_for_setting(self.prog, message)


_MISSING = object()


@dataclass(frozen=True, slots=True)
class Setting:
    """Where one field comes from (the metadata `setting` puts on the dataclass field)."""

    flag: str | None  # "--port"; None: from the environment only
    env: str | None  # "TOKENIZER_PORT", read as LAYERSERVE_TOKENIZER_PORT; None: flag only
    help: str | None = None
    choices: tuple[str, ...] | None = None  # offered by the flag; the check refuses others
    check: Check | None = None
    # One string (a flag's, the variable's, or one item of a list) to the value; by the
    # annotation when None. A bool's flag is a switch: for it, parse reads the variable only.
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    negatable: bool = True  # a bool: --x and --no-x; False: --x alone

    @property
    def name(self) -> str:
        """How an error names the field: its flag, else its variable."""
        return self.flag or PREFIX + (self.env or "")


def setting(
    flag: str | None = None,
    *,
    env: str | None = None,
    default: Any = None,
    help: str | None = None,
    choices: tuple[str, ...] | None = None,
    check: Check | None = None,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    negatable: bool = True,
    repr: bool = True,
) -> Any:
    """A dataclass field read from `flag`, else from LAYERSERVE_`env`, else `default`.
    repr=False keeps a secret out of the config's repr (and so out of logs)."""
    if flag is None and env is None:
        raise TypeError("a setting needs a flag, an environment variable or both")
    if check is None and choices is not None:
        check = one_of(choices)
    meta = Setting(flag, env, help, choices, check, parse, metavar, negatable)
    return dataclasses.field(default=default, repr=repr, metadata={_KEY: meta})


def read_settings(
    cls: type, argv: list[str] | None = None, *, prog: str | None = None
) -> dict[str, Any]:
    """Every setting of dataclass `cls`, by field name, from `argv` (default: sys.argv[1:]) and
    the environment; `cls(**values)` builds the config (and runs its checks). Raises ValueError
    for a variable that does not parse (even one a flag overrides); exits with argparse's usage
    error for a bad flag."""
    fields = _settings_of(cls)
    from_env = {field.name: _from_env(meta, kind) for field, meta, kind in fields}
    parser = _Parser(prog=prog)
    for field, meta, kind in fields:
        if meta.flag is not None:
            _add_flag(parser, field, meta, kind, from_env[field.name])
    given = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    for field, meta, kind in fields:
        value = given.get(field.name)
        if value is None or value == []:
            value = from_env[field.name]
            if value is not _MISSING:
                _check_variable(meta, value)
            values[field.name] = field.default if value is _MISSING else value
        elif kind.items:
            values[field.name] = tuple(map(meta.parse or str, value))
        elif meta.parse is not None and kind.base is not bool:
            values[field.name] = meta.parse(value)
        else:
            values[field.name] = value
    return values


def check_settings(config: Any) -> None:
    """Runs each field's check (not on None: unset); call from __post_init__, so that a config
    built directly is checked as one read from flags is. Raises ValueError naming the flag."""
    for field in dataclasses.fields(config):
        meta = field.metadata.get(_KEY)
        value = getattr(config, field.name)
        if meta is None or meta.check is None or value is None:
            continue
        problem = meta.check(value)
        if problem:
            raise ValueError(f"{meta.name} {problem}")


def _check_variable(meta: Setting, value: Any) -> None:
    """A value from the environment its check refuses: named by its variable (the flag's check
    in __post_init__ would name the flag the operator did not set)."""
    problem = meta.check(value) if meta.check is not None and value is not None else None
    if problem:
        also = f" (the variable of {meta.flag})" if meta.flag else ""
        raise SettingError(f"{PREFIX}{meta.env}={_shown(value)}: {problem}{also}")


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def positive(value: float) -> str | None:
    return None if value > 0 else f"must be positive, got {value!r}"


def at_least(low: float) -> Check:
    return lambda value: None if value >= low else f"must be >= {low}, got {value!r}"


def in_range(low: int, high: int) -> Check:
    return lambda value: (
        None if low <= value <= high else f"must be in {low}..{high}, got {value!r}"
    )


def one_of(choices: tuple[str, ...]) -> Check:
    return lambda value: None if value in choices else f"must be one of {choices}, got {value!r}"


@dataclass(frozen=True, slots=True)
class _Kind:
    base: type  # str, int, float or bool (the item's type for a tuple)
    optional: bool  # X | None
    items: bool  # tuple[X, ...]


def _settings_of(cls: type) -> list[tuple[dataclasses.Field, Setting, _Kind]]:
    hints = typing.get_type_hints(cls)
    return [
        (f, f.metadata[_KEY], _kind_of(hints[f.name]))
        for f in dataclasses.fields(cls)
        if _KEY in f.metadata
    ]


def _kind_of(hint: Any) -> _Kind:
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        (hint,) = [a for a in args if a is not type(None)]
        args = typing.get_args(hint)
    items = typing.get_origin(hint) is tuple
    base = args[0] if items else hint
    return _Kind(base if base in (int, float, bool) else str, optional, items)


def _add_flag(
    parser: argparse.ArgumentParser,
    field: dataclasses.Field,
    meta: Setting,
    kind: _Kind,
    from_env: Any,
) -> None:
    """A flag whose value is None when not given, except a switch's: its default is the
    variable's value or the field's default (argparse's help shows it)."""
    assert meta.flag is not None
    options: dict[str, Any] = {"dest": field.name, "help": meta.help}
    if kind.base is bool and not kind.items:
        options["action"] = argparse.BooleanOptionalAction if meta.negatable else "store_true"
        options["default"] = field.default if from_env is _MISSING else from_env
    else:
        options["action"] = "append" if kind.items else "store"
        options["choices"] = meta.choices
        if meta.parse is None and kind.base in (int, float):
            options["type"] = _number(kind.base)  # a bad value: one line, exit status 2
        # argparse's own metavar is the dest's, which need not match the flag.
        if meta.metavar or not meta.choices:
            options["metavar"] = meta.metavar or meta.flag.lstrip("-").upper().replace("-", "_")
    parser.add_argument(meta.flag, **options)


def _number(base: type) -> Callable[[str], Any]:
    what = "a number" if base is float else "an integer"

    def parse(raw: str) -> Any:
        try:
            return base(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {raw!r}") from None

    return parse


def _from_env(meta: Setting, kind: _Kind) -> Any:
    """The variable's value, _MISSING when it is unset (or empty, for a number or a list)."""
    if meta.env is None:
        return _MISSING
    raw = os.environ.get(PREFIX + meta.env)
    if raw is None:
        return _MISSING
    if kind.items:
        items = [item.strip() for item in raw.split(",") if item.strip()]
        return tuple(_parse(meta, kind, item) for item in items) if items else _MISSING
    if raw == "" and kind.optional:
        return None
    if raw == "" and kind.base is not str:
        return _MISSING
    value = _parse(meta, kind, raw)
    return None if kind.optional and kind.base in (int, float) and value == 0 else value


def _parse(meta: Setting, kind: _Kind, raw: str) -> Any:
    if meta.parse is not None:
        return meta.parse(raw)
    try:
        if kind.base is bool:
            return int(raw) != 0
        return kind.base(raw)
    except ValueError:
        what = "a number" if kind.base is float else "an integer"
        also = f" (the environment's value for {meta.flag})" if meta.flag else ""
        raise SettingError(f"{PREFIX}{meta.env} must be {what}, got {raw!r}{also}") from None
