"""Validation of the names that become cgroup path components and metric labels.

Application, operator and worker names arrive from untrusted instances (over the
registration socket) and from engine adapters. They end up as directory names
under the agent's cgroup root, so anything that could escape that root or
confuse a path is refused outright rather than rewritten: a silently renamed
instance would be impossible to match with its directives.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 128
_ALLOWED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$")


class InvalidName(ValueError):
    """A name that must not become a path component."""


def check_name(kind: str, value: object) -> str:
    """Return ``value`` if it is safe as one path component, else raise InvalidName."""
    if not isinstance(value, str):
        raise InvalidName(f"{kind} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidName(f"{kind} is empty")
    if "\x00" in value:
        raise InvalidName(f"{kind} contains a NUL byte")
    if "/" in value or "\\" in value:
        raise InvalidName(f"{kind} {value!r} contains a path separator")
    if value in (".", "..") or ".." in value:
        raise InvalidName(f"{kind} {value!r} contains '..'")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(f"{kind} is longer than {MAX_NAME_LENGTH} characters")
    if not _ALLOWED.match(value):
        raise InvalidName(
            f"{kind} {value!r} has characters outside [A-Za-z0-9._:@+=-] "
            "or does not start with a letter or digit"
        )
    return value
