"""`aijobs settings`: every setting of this process's environment with its value, its default and
where the value came from, as a table or (`--json`) one JSON object.

The list is the Settings model's own fields (engine/settings.py), so a field added there is
listed here without a change. A field typed `SecretStr` is a secret: its value shows as `***`
when set, never itself; a password inside a URL (`scheme://user:password@host`, or a
`password=` parameter) shows as `***` in any other setting. Only the process environment is
read, as every `aijobs` command reads it (no `.env` file). It connects to nothing and runs no
startup check, so it works in any AIJOBS_ENV, production without its secrets included.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import types
import typing
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from engine.settings import ConfigurationError, Settings

MASK = "***"
# The table's cells stop here (the JSON output is never cut).
_CELL_CHARS = 60
# `scheme://user:` then the password, up to the last `@` of the value (a password may hold `@`,
# `/` or `,` unencoded: masking too much is safe, too little is not); and a libpq-style
# `password=` parameter, up to the next `&`.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s,]*:).*@")
_PASSWORD_PARAM = re.compile(r"(?i)(?P<head>\bpassword=)[^&]*")


@dataclass(frozen=True)
class SettingItem:
    name: str
    value: Any
    default: Any
    source: str  # "env" (set in the environment) or "default"
    secret: bool


def is_secret(field: FieldInfo) -> bool:
    """Whether a field holds a secret: typed SecretStr (alone or optional), or marked
    `json_schema_extra={"secret": True}`."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and extra.get("secret") is True:
        return True
    return _mentions_secret(field.annotation)


def _mentions_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_mentions_secret(arg) for arg in typing.get_args(annotation))
    return False


def mask_passwords(text: str) -> str:
    """`text` with every URL's password and `password=` parameter replaced by ***."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _PASSWORD_PARAM.sub(lambda m: f"{m['head']}{MASK}", text)


def _shown(value: Any, secret: bool) -> Any:
    """A value as the output shows it: JSON-typed, a secret as *** (or null when unset)."""
    if value is None:
        return None
    if secret or isinstance(value, SecretStr):
        return MASK
    if isinstance(value, str):
        return mask_passwords(value)
    if isinstance(value, dict):
        return {str(k): _shown(v, False) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_shown(v, False) for v in value]
    return value


def _only_given(
    cls: type[BaseSettings], /, settings_cls: type[BaseSettings], init_settings: Any, **others: Any
) -> tuple[Any, ...]:
    return (init_settings,)


@functools.cache
def _unset(cls: type[Settings]) -> type[Settings]:
    """`cls` reading nothing but what it is given: no environment."""
    sources = classmethod(_only_given)
    return type(f"{cls.__name__}Unset", (cls,), {"settings_customise_sources": sources})


def items(settings: Settings) -> list[SettingItem]:
    """One item per setting, in the model's order. The default is what the setting is when
    unset in this process's AIJOBS_ENV (a metrics port is 9464 in production, 0 elsewhere)."""
    unset_cls = _unset(type(settings))
    in_this_env = unset_cls.model_validate({"AIJOBS_ENV": settings.environment})
    unset = unset_cls()  # AIJOBS_ENV's own default
    out = []
    for name, field in type(settings).model_fields.items():
        secret = is_secret(field)
        defaults = unset if name == "environment" else in_this_env
        out.append(
            SettingItem(
                name=field.alias or name.upper(),
                value=_shown(getattr(settings, name), secret),
                default=_shown(getattr(defaults, name), secret),
                source="env" if name in settings.model_fields_set else "default",
                secret=secret,
            )
        )
    return out


def _cell(value: Any) -> str:
    text = "-" if value is None else value if isinstance(value, str) else json.dumps(value)
    text = text or '""'
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 1] + "…"


def table(rows: list[SettingItem]) -> str:
    """A readable table: name, value, default, source, and whether it is a secret."""
    lines = [("NAME", "VALUE", "DEFAULT", "SOURCE", "SECRET")]
    lines += [
        (r.name, _cell(r.value), _cell(r.default), r.source, "yes" if r.secret else "")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line[:4], widths, strict=True))
        + f"  {line[4]}".rstrip()
        for line in lines
    )


def validation_line(exc: ValidationError) -> str:
    """The first error of an invalid configuration, in one line naming its setting."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "settings"
    msg = str(first["msg"]).removeprefix("Value error, ")
    return msg if msg.startswith(f"{where}:") else f"{where}: {msg}"


def cmd_settings(args: argparse.Namespace) -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"aijobs settings: invalid configuration: {validation_line(exc)}", file=sys.stderr)
        return 2
    except ConfigurationError as exc:
        print(f"aijobs settings: {exc}", file=sys.stderr)
        return 2
    rows = items(settings)
    if args.json:
        print(json.dumps({"settings": [asdict(r) for r in rows]}, ensure_ascii=False))
    else:
        print(table(rows))
    return 0


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter],
) -> None:
    """Registers `settings` on `aijobs`'s subparsers."""
    p = sub.add_parser(
        "settings",
        help="every setting with its value, default and source (secrets as ***)",
        description=__doc__,
        formatter_class=formatter,
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=cmd_settings)
