"""TOML configuration into dataclasses, with errors that name the offending key.

Every daemon describes its configuration as a (possibly nested) dataclass.
``load_config`` reads a TOML file with :mod:`tomllib`, refuses unknown keys and
values of the wrong type, and runs each dataclass's ``validate()`` so impossible
values (negative periods, weight 0, ...) fail at startup, not mid-epoch.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem; the message names the key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config key '{key}': {message}")
        self.key = key


def _coerce(key: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(key, args[0], value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key + ".")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {type(value).__name__}")
        _, vt = typing.get_args(tp)
        return {k: _coerce(f"{key}.{k}", vt, v) for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {type(value).__name__}")
        (et, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(f"{key}[{i}]", et, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a path string, got {value!r}")
        return Path(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build ``cls`` from ``data``; unknown keys and wrong types raise ConfigError."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for raw_key, value in data.items():
        name = raw_key.replace("-", "_")
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(prefix + raw_key, f"unknown key (known: {known})")
        kwargs[name] = _coerce(prefix + raw_key, hints[name], value)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as exc:
            if prefix and not exc.key.startswith(prefix):
                raise ConfigError(prefix + exc.key, str(exc).split(": ", 1)[1]) from None
            raise
    return obj


def load_config(cls: type[T], path: str | Path | None) -> T:
    """Load ``cls`` from a TOML file, or its defaults when ``path`` is None."""
    if path is None:
        return from_dict(cls, {})
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("--config", f"file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{p} is not valid TOML: {exc}") from None
    return from_dict(cls, data)


def override(obj: T, **changes: Any) -> T:
    """Apply command-line overrides (None means 'not given') and re-validate."""
    given = {k: v for k, v in changes.items() if v is not None}
    if not given:
        return obj
    new = dataclasses.replace(obj, **given)  # type: ignore[type-var]
    validate = getattr(new, "validate", None)
    if validate is not None:
        validate()
    return new


def require(cond: bool, key: str, message: str) -> None:
    """Raise ConfigError(key, message) unless ``cond``."""
    if not cond:
        raise ConfigError(key, message)


def parse_hostport(key: str, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(key, f"expected HOST:PORT, got {value!r}")
    p = int(port)
    require(0 <= p <= 65535, key, f"port {p} out of range")
    return host.strip("[]"), p


def is_loopback(host: str) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1, ::ffff:127.x) or ``localhost``.

    Any other name is not loopback: it may resolve anywhere, so a listen or
    connect address given by name must take the remote rules.
    """
    host = host.strip("[]")
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
