"""The configuration reference, generated from the schema: every key with its type, default, allowed values
and one-line doc (`mimo.config.fields.doc`).

`reference_markdown()` is docs/configuration.md (`mimo config --reference` writes it; a unit test fails when
the file is stale); `explain(key)` is `mimo config KEY`.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mimo.config.fields import DOC
from mimo.config.migrate import MOVED_KEYS, old_key_error
from mimo.config.schema import Config, ConfigError

NAME = "<name>"
"""The placeholder of a table's own key in the reference, e.g. model.modalities.<name>.kind."""


@dataclass(frozen=True)
class KeyDoc:
    """One config key as the reference shows it."""

    key: str
    section: str
    type: str
    default: str
    allowed: tuple[str, ...]
    doc: str


def _toml(value: Any) -> str:
    """`value` written as in a TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _type_name(tp: Any) -> str:
    """A short name of a field's type: int, list of int, table of float, one of the Literal's values."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "str"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}"
    if args:
        return " or ".join(_type_name(a) for a in args)
    return "table" if dataclasses.is_dataclass(tp) else getattr(tp, "__name__", str(tp))


def _allowed(tp: Any) -> tuple[str, ...]:
    """The values a Literal type (alone, or as list items or table values) allows; () for any value."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return tuple(_toml(a) for a in args)
    return _allowed(args[-1]) if origin in (list, dict) else ()


def config_keys(cls: type = Config, section: str = "") -> Iterator[KeyDoc]:
    """Every key of `cls` (a config dataclass) and of its sub-tables, in the schema's order; a table of named
    tables (model.modalities, parallel.modules) is listed once with NAME for the name."""
    hints = typing.get_type_hints(cls)
    nested = []
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{section}.{f.name}" if section else f.name
        if dataclasses.is_dataclass(tp):
            nested.append((tp, key))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        yield KeyDoc(key, section, _type_name(tp), _toml(default), _allowed(tp), f.metadata.get(DOC, ""))
        value = typing.get_args(tp)[-1] if typing.get_origin(tp) is dict else None
        if dataclasses.is_dataclass(value):
            nested.append((value, f"{key}.{NAME}"))
    for tp, key in nested:
        yield from config_keys(tp, key)


def _section_doc(cls: type = Config, section: str = "") -> Iterator[tuple[str, str]]:
    """(section, the first line of its class docstring) of every table, in config_keys' order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{section}.{f.name}" if section else f.name
        value = typing.get_args(tp)[-1] if typing.get_origin(tp) is dict else None
        if dataclasses.is_dataclass(tp):
            yield key, (tp.__doc__ or "").strip().splitlines()[0]
            yield from _section_doc(tp, key)
        elif dataclasses.is_dataclass(value):
            yield f"{key}.{NAME}", (value.__doc__ or "").strip().splitlines()[0]
            yield from _section_doc(value, f"{key}.{NAME}")


def reference_markdown() -> str:
    """docs/configuration.md: one table per config section, every key with its type, default, allowed values
    and doc."""
    keys = list(config_keys())
    lines = ["# Configuration reference", "",
             "Generated from the schema (mimo/config/) by `python -m mimo config --reference > "
             "docs/configuration.md`; do not edit by hand. `mimo config KEY` prints one key.", "",
             "A TOML file sets a key as `[section]` then `key = value`; the command line as `--section.key=value`. "
             f"`{NAME}` is a name you choose: a modality's (e.g. `images`), or `language` for the language model.",
             ""]
    for section, about in _section_doc():
        rows = [k for k in keys if k.section == section]
        if not rows:
            continue
        lines += [f"## `[{section}]`", "", _escape(about), "", "| Key | Type | Default | Description |",
                  "|---|---|---|---|"]
        for k in rows:
            kind = f"one of {', '.join(k.allowed)}" if k.allowed else k.type
            if k.allowed and k.type != "str":
                kind = f"{k.type}: {', '.join(k.allowed)}"
            cells = [f"`{k.key.rsplit('.', 1)[-1]}`", kind, f"`{k.default}`", _escape(k.doc)]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _escape(text: str) -> str:
    """`text` with the angle brackets of its placeholders (<name>) kept visible in Markdown."""
    return text.replace("<", "\\<")


def _pattern(key: str) -> str:
    """`key` with the names of model.modalities and parallel.modules tables replaced by NAME."""
    parts = key.split(".")
    for i in range(len(parts) - 1):
        if ".".join(parts[:i]) in ("model.modalities", "parallel.modules"):
            parts[i] = NAME
    return ".".join(parts)


def explain(key: str) -> str:
    """`mimo config KEY`: the key's doc, type, default and allowed values; a ConfigError for a key that moved
    (naming the new one), was retired (naming why) or does not exist (naming the closest)."""
    if key in MOVED_KEYS:
        raise ConfigError(f"{old_key_error(key)}; `mimo config {MOVED_KEYS[key]}` explains it")
    if old_key_error(key):
        raise ConfigError(old_key_error(key))
    found = {k.key: k for k in config_keys()}
    k = found.get(_pattern(key))
    if k is None:
        close = difflib.get_close_matches(_pattern(key), found, n=3)
        raise ConfigError(f"'{key}' is no config key" + (f"; did you mean {', '.join(close)}?" if close else
                                                         "; `mimo config --reference` lists them all"))
    lines = [f"{key}  ({k.type}, default {k.default})", f"  {k.doc}"]
    return "\n".join(lines + ([f"  allowed: {', '.join(k.allowed)}"] if k.allowed else [])) + "\n"
