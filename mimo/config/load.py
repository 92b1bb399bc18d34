"""TOML in, dotted command-line overrides, type coercion, and the resolved config back out as TOML.

Loading walks the dataclass fields, so an unknown key or a value of the wrong type is caught at load time
with the key's full dotted name and the list of valid keys, instead of surfacing later as an attribute
error deep inside training.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import tomllib

from mimo.config.migrate import refuse_old_keys, upgrade_saved_keys
from mimo.config.schema import Config, ConfigError
from mimo.config.validate import validate


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and where lossless, convert) one value against its annotated type."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:  # its values are checked with the whole tree (mimo.config.enums)
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a table of {_type_name(tp)} fields, got {value!r}")
        return _build(tp, value, key)
    if origin is dict:
        _, vtp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a table, got {value!r}")
        return {k: _coerce(v, vtp, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        (etp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {value!r}")
        return [_coerce(v, etp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                continue
        raise ConfigError(f"'{key}' must be one of {[_type_name(a) for a in args]}, got {value!r}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"'{key}' must be an integer, got {value!r}")
    if tp in (float, str) and not isinstance(value, tp):
        raise ConfigError(f"'{key}' must be a {_type_name(tp)}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in names:
            where = f"'{prefix}'" if prefix else "the top level"
            raise ConfigError(f"unknown config key '{key}'; valid keys in {where}: {', '.join(names)}")
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def _parse_value(text: str) -> Any:
    """Read an override value with TOML syntax; bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot override '{dotted}': '{p}' is a value, not a table")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ['--train.steps=50', '--model.llm.layers', '4'] into a nested dict."""
    tree: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"expected an override like --section.key=value, got '{a}'")
        body = a[2:]
        if "=" in body:
            key, text = body.split("=", 1)
        elif i + 1 < len(args):
            key, text = body, args[i + 1]
            i += 1
        else:
            raise ConfigError(f"override '{a}' has no value; write --{body}=VALUE")
        _set_dotted(tree, key, _parse_value(text))
        i += 1
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(data: dict[str, Any]) -> Config:
    return _build(Config, data)


SAVED_RUN_DEFAULTS: dict[str, Any] = {"data": {"prompt_format": "plain"}}
"""Keys a run folder's saved config.toml may lack because it was written before they existed, with the value
that keeps such a run's meaning where new configs default to another."""


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                saved_run: bool = False) -> Config:
    """Load a TOML file (or the defaults), apply dotted overrides, and validate the whole tree; refuses a key
    that moved or was retired (mimo.config.migrate) and records the keys left at their defaults
    (`Config.left_unset`). `saved_run`: the file is a run folder's config.toml, written by this or an older mimo:
    its moved keys take their new names, its retired keys are dropped, and its missing keys read as
    `SAVED_RUN_DEFAULTS` first."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{p}' does not exist; pass the path of a TOML file, e.g. "
                              "configs/demo_vlm.toml")
        with p.open("rb") as f:
            data = tomllib.load(f)
        if saved_run:
            data = _merge(SAVED_RUN_DEFAULTS, upgrade_saved_keys(data))
        refuse_old_keys(data, f"'{p}'")
    if overrides:
        extra = parse_overrides(overrides)
        refuse_old_keys(extra, "the command line's overrides")
        data = _merge(data, extra)
    cfg = from_dict(data)
    cfg.left_unset = unset_keys(cfg, data)
    validate(cfg)  # after left_unset: a float8 module may leave precision.dtype to the GPU defaults
    return cfg


def unset_keys(cfg: Config, data: dict[str, Any]) -> frozenset[str]:
    """The dotted keys of the sections' own fields (e.g. "perf.compile") that `data` does not name."""
    return frozenset(f"{section.name}.{f.name}" for section in dataclasses.fields(cfg)
                     for f in dataclasses.fields(getattr(cfg, section.name))
                     if f.name not in data.get(section.name, {}))


def dump_toml(cfg: Config) -> str:
    """Write the resolved config back as TOML (saved in each run folder)."""
    lines: list[str] = []

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return repr(v)

    def emit(table: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        subs = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix and (scalars or not subs):
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {fmt(v)}")
        if scalars:
            lines.append("")
        for k, v in subs.items():
            emit(v, f"{prefix}.{k}" if prefix else k)

    emit(to_dict(cfg), "")
    return "\n".join(lines) + "\n"
