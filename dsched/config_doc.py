"""The configuration reference (docs/config.md), generated from the schema.

Each daemon's configuration is a dataclass whose fields carry a comment just
above them; that comment is the key's documentation. This module walks the
dataclasses (nested tables included) and writes one Markdown table per TOML
table, so the reference cannot drift from the code: a test regenerates it and
compares.

    python -m dsched.config_doc --write docs/config.md   # regenerate
    python -m dsched.config_doc --check docs/config.md   # exit 1 when stale
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

_FIELD = re.compile(r"^\s{4}(\w+)\s*:")


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment lines right above it in the class body (and its bases')."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__[:-1]):
        if dataclasses.is_dataclass(base):
            out.update({k: v for k, v in _own_comments(base).items() if v})
    return out


def _own_comments(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and not line.strip().startswith(("def ", "@")):
            out[m.group(1)] = " ".join(pending)
        pending = []
    return out


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return f"{_type_name(args[0])} (optional)"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}"
    return {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if value is None:
        return "unset"
    if isinstance(value, Path):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | int | float):
        return f"`{json.dumps(value)}`"
    if isinstance(value, list):
        return "`" + json.dumps(value) + "`"
    if isinstance(value, dict) and not value:
        return "empty"
    return "see below" if dataclasses.is_dataclass(value) else f"`{value!r}`"


def _tables(cls: type, prefix: str) -> list[tuple[str, type]]:
    """``(toml table name, dataclass)`` for ``cls`` and every nested table."""
    out = [(prefix, cls)]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        name = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(tp):
            sub = f"{prefix}.{f.name.replace('_', '-')}" if prefix.endswith("_options") else name
            out += _tables(tp, sub)
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            out += _tables(typing.get_args(tp)[1], f"{name}.<name>")
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            out += _tables(typing.get_args(tp)[0], f"[{name}]")
    return out


def _is_table(tp: Any) -> bool:
    """A nested table (rendered as its own section), not a value."""
    args = typing.get_args(tp)
    return bool(
        dataclasses.is_dataclass(tp)
        or (typing.get_origin(tp) is dict and dataclasses.is_dataclass(args[1]))
        or (typing.get_origin(tp) is list and dataclasses.is_dataclass(args[0]))
    )


def render_schema(cls: type, title: str, path: str) -> str:
    lines = [f"## {title}", "", f"File: `{path}`.", ""]
    for table, tcls in _tables(cls, ""):
        comments = field_comments(tcls)
        hints = typing.get_type_hints(tcls)
        rows = []
        for f in dataclasses.fields(tcls):
            tp = hints[f.name]
            if _is_table(tp):
                continue
            doc = comments.get(f.name, "").replace("|", "\\|")
            rows.append(f"| `{f.name}` | {_type_name(tp)} | {_default(f)} | {doc} |")
        if not rows:
            continue
        lines.append(f"### `[{table}]`" if table else "### top level")
        summary = (inspect.getdoc(tcls) or "").split("\n\n")[0].replace("\n", " ")
        if summary and not summary.startswith(tcls.__name__ + "("):
            lines += ["", summary]
        lines += ["", "| key | type | default | meaning |", "| --- | --- | --- | --- |", *rows, ""]
    return "\n".join(lines)


def schemas() -> list[tuple[type, str, str]]:
    from agent.config import AgentConfig
    from controller.config import ControllerConfig
    from controller.ctl import CtlConfig
    from spark_stream.config import HistoryConfig

    return [
        (ControllerConfig, "dsched-controller", "/etc/dsched/controller.toml"),
        (AgentConfig, "dsched-agent", "/etc/dsched/agent.toml"),
        (
            HistoryConfig,
            "dsched-history",
            "/etc/dsched/history.toml (or [history] in controller.toml)",
        ),
        (
            CtlConfig,
            "dschedctl",
            "--config, $DSCHEDCTL_CONFIG, ~/.config/dsched/dschedctl.toml or "
            "/etc/dsched/dschedctl.toml (first found); flags override it",
        ),
    ]


def undocumented() -> list[str]:
    """Keys of every schema that have no comment (the reference would be blank)."""
    missing = []
    for cls, title, _ in schemas():
        for table, tcls in _tables(cls, ""):
            comments = field_comments(tcls)
            hints = typing.get_type_hints(tcls)
            for f in dataclasses.fields(tcls):
                if _is_table(hints[f.name]):
                    continue
                if not comments.get(f.name):
                    missing.append(f"{title}: {table + '.' if table else ''}{f.name}")
    return missing


def render() -> str:
    head = [
        "# Configuration reference",
        "",
        "Generated from the configuration dataclasses by "
        "`python -m dsched.config_doc --write docs/config.md`; a test fails when it is stale. "
        "Every daemon refuses unknown keys and impossible values at startup with the key's "
        "name. Strategy names (allocator, predictors, placement, actuators) are checked "
        "against the registries of the code that implements them.",
        "",
    ]
    return "\n".join(head + [render_schema(*s) for s in schemas()]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dsched.config_doc", description=__doc__)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH", help="write the reference to PATH")
    group.add_argument("--check", metavar="PATH", help="exit 1 if PATH is not current")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text)
    elif args.check:
        current = Path(args.check).read_text() if Path(args.check).exists() else ""
        if current != text:
            print(f"{args.check} is stale: run python -m dsched.config_doc --write {args.check}")
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
