"""Moved to ``testbed.demo`` (the wheel carries no testbed); kept only until the
last import of ``dsched.demo`` is gone. Names are looked up there on first use."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("testbed.demo"), name)
