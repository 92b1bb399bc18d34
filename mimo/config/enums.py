"""The one check of every enumeration in the config: a field typed `Literal[...]` (alone, as a list's items or
a table's values) holds one of its values, else a `ConfigError` names the dotted key and the values allowed.

`mimo.config.validate` runs it on every config, loaded from TOML or built in Python.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from mimo.config.schema import ConfigError


def check_enumerations(node: Any, key: str = "") -> None:
    """Walk the dataclass tree `node` (its dotted name `key`) and check each value against its field's type."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        check_value(getattr(node, f.name), hints[f.name], f"{key}.{f.name}" if key else f.name)


def check_value(value: Any, tp: Any, key: str) -> None:
    """`value` of the field `key` typed `tp`: a Literal's value among its values, recursively through
    dataclasses, lists and tables."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}; choose one of {', '.join(map(repr, allowed))}")
    elif dataclasses.is_dataclass(value):
        check_enumerations(value, key)
    elif origin is list:
        for i, item in enumerate(value):
            check_value(item, typing.get_args(tp)[0], f"{key}[{i}]")
    elif origin is dict:
        for name, item in value.items():
            check_value(item, typing.get_args(tp)[1], f"{key}.{name}")
