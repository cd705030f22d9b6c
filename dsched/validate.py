"""Argument checks shared by predict/ and the simulator: every failure is a ValueError that
names the offending parameter, so a caller never receives a silent NaN."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def series(values: Iterable[float] | np.ndarray, name: str, *, min_length: int = 1) -> np.ndarray:
    """A finite 1-D float array with at least ``min_length`` points."""
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of numbers: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size < min_length:
        raise ValueError(f"{name} needs at least {min_length} point(s), got {arr.size}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"{name} contains a non-finite value at index {bad}: {arr[bad]}")
    return arr


def finite(value: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def positive(value: float, name: str) -> float:
    v = finite(value, name)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


def non_negative(value: float, name: str) -> float:
    v = finite(value, name)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    return v


def positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)
