"""The peers' published sizing rules as pure functions over numpy arrays.

One copy of each rule: the live controller's sizing policies
(:mod:`controller.peers.policies`) and the simulator's baselines
(``testbed/sim/policies.py``) both call these, so a peer behaves the same on
simulated and on real caps. No I/O and no state here: whatever a rule
remembers between epochs (a histogram, the epoch of the last change) comes in
as an argument and goes out as a return value.

* DS2 (Kalavri et al., "Three steps is all you need: fast, accurate, automatic
  scaling decisions for distributed streaming dataflows"): an operator's *true
  processing rate* is what it does per unit of useful (busy) time; the
  resources it needs are the target rate over that rate.
* Utilisation target with a stabilisation window (the Flink Kubernetes
  operator's autoscaler): size so that busy time over capacity is the target
  (0.7); after a change nothing moves for the window, and a scale-down must
  have been wanted for a whole window first.
* Decaying histogram (the Kubernetes Vertical Pod Autoscaler's recommender):
  every sample of usage adds weight 1 to its bucket, old weight halves every
  half-life; the recommendation is a percentile (0.9) plus a margin (15 %).
* ERR (enhanced round robin, "QoS-aware CPU cap adjustment for timely
  data-flow"): a fixed number of threads per QoS class, never adapted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

# ERR's threads per operator by QoS class; a class it does not know gets the
# fewest (the lowest class's).
ERR_THREADS: Mapping[str, int] = {"gold": 8, "silver": 4, "bronze": 2}


def err_threads(qos_class: str, table: Mapping[str, int] = ERR_THREADS) -> int:
    """ERR's thread count for ``qos_class``."""
    return int(table.get(qos_class, min(table.values())))


# ------------------------------------------------------------------ DS2


def true_processing_rate(done: np.ndarray, busy_seconds: np.ndarray) -> np.ndarray:
    """Tuples per second of useful time; ``inf`` where there was no useful time
    (nothing is known about the rate, and no finite target can be derived)."""
    done = np.asarray(done, dtype=float)
    busy = np.asarray(busy_seconds, dtype=float)
    return np.where(busy > 0, done / np.maximum(busy, 1e-12), np.inf)


def ds2_ratio(target_rate: np.ndarray, true_rate: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Target rate over true processing rate: the instances (or busy cores, when the
    rate is per core) the target needs; ``fallback`` where the true rate is unknown.

    DS2 decides in one step from the rates alone: no margin, no memory."""
    true_rate = np.asarray(true_rate, dtype=float)
    known = np.isfinite(true_rate)
    ratio = np.asarray(target_rate, dtype=float) / np.maximum(true_rate, 1e-12)
    return np.where(known, ratio, fallback)


# ------------------------------------------------------------------ utilisation target


def util_target_want(busy: np.ndarray, target: float) -> np.ndarray:
    """Capacity at which ``busy`` (seconds of busy time per second, or busy cores)
    is ``target`` of it."""
    if not 0 < target <= 1:
        raise ValueError(f"utilisation target must be in (0, 1], got {target!r}")
    return np.asarray(busy, dtype=float) / target


class Stabilised(NamedTuple):
    """The outcome of :func:`stabilise`, and what the next epoch needs of it."""

    value: np.ndarray  # the size in force after this epoch
    last_change: np.ndarray  # epoch of each one's last change
    below: np.ndarray  # consecutive epochs each one has wanted less than it has


def stabilise(
    want: np.ndarray,
    current: np.ndarray,
    epoch: int,
    last_change: np.ndarray,
    below: np.ndarray,
    window: int,
) -> Stabilised:
    """The Flink autoscaler's stabilisation: no change within ``window`` epochs of the
    last one; a rise as soon as that has passed; a fall only once it has been
    wanted for ``window`` consecutive epochs as well.

    Works on parallelism (integers) and on caps (cores) alike."""
    want = np.asarray(want)
    current = np.asarray(current)
    below = np.where(want < current, np.asarray(below) + 1, 0)
    stable = epoch - np.asarray(last_change) >= window
    up = (want > current) & stable
    down = (want < current) & stable & (below >= window)
    new = np.where(up | down, want, current)
    return Stabilised(new, np.where(new != current, epoch, last_change), below)


# ------------------------------------------------------------------ decaying histogram


def decay_per_epoch(half_life_epochs: float) -> float:
    """The factor old weight is multiplied by each epoch."""
    if not half_life_epochs > 0:
        raise ValueError(f"half-life must be > 0 epochs, got {half_life_epochs!r}")
    return 0.5 ** (1.0 / half_life_epochs)


def vpa_buckets(first: float, ratio: float, top: float) -> np.ndarray:
    """Exponential bucket bounds from ``first`` growing by ``ratio`` until one
    reaches ``top`` (the VPA's CPU histogram: first bucket 0.01 core, ratio 1.05)."""
    if not (first > 0 and ratio > 1 and top >= first):
        raise ValueError(f"need first > 0, ratio > 1, top >= first, got {first}, {ratio}, {top}")
    n = int(np.ceil(np.log(top / first) / np.log(ratio) - 1e-9)) + 1
    return first * ratio ** np.arange(n)


def histogram_add(
    hist: np.ndarray, usage: np.ndarray, buckets: np.ndarray, decay: float
) -> np.ndarray:
    """A new histogram: ``hist`` (one row per instance) decayed by ``decay``, plus
    weight 1 in each row's bucket of its ``usage`` (values above the last bucket
    land in it)."""
    out = np.asarray(hist, dtype=float) * decay
    b = np.clip(np.searchsorted(buckets, usage), 0, len(buckets) - 1)
    out[np.arange(len(out)), b] += 1.0
    return out


def histogram_percentile(hist: np.ndarray, buckets: np.ndarray, q: float) -> np.ndarray:
    """Per row, the first bucket bound at which the cumulative weight reaches ``q``
    of the row's total (the first bucket for an empty row)."""
    cum = np.cumsum(np.asarray(hist, dtype=float), axis=1)
    tot = cum[:, -1:]
    idx = np.argmax(cum >= q * np.maximum(tot, 1e-12), axis=1)
    return buckets[idx]


def vpa_recommendation(
    hist: np.ndarray, buckets: np.ndarray, percentile: float, margin: float, floor: float
) -> np.ndarray:
    """The VPA recommender's target: the percentile times (1 + margin), at least ``floor``."""
    return np.maximum(histogram_percentile(hist, buckets, percentile) * (1.0 + margin), floor)
