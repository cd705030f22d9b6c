"""The Flink job's input: CSV batches written into its monitored directory on a rate trace.

:class:`TraceFeeder` is a thread. Every ``batch_period`` seconds it writes one file
of ``id,word,ts`` lines: ids consecutive from ``first_id``, words cycling through a
fixed vocabulary (every key gets the same share of the load), ``ts`` the epoch
milliseconds at write time (the job's latency is measured against it). The number
of records per batch follows ``rate(t)`` in records per second, ``t`` the seconds
since the feeder started, with the fractional remainder carried to the next batch,
so the total over any stretch is the trace's integral rounded down.

Each batch is written under a name starting with ``.`` (Flink's filesystem source
ignores those) and renamed into place, so the job never reads half a file. The
feeder deletes nothing: the source remembers which paths it has read, and a
deleted-and-recreated name would be skipped.

:func:`scenario_rates` builds the rate traces of the live benchmark's scenarios
from :mod:`testbed.traces`, scaled to a peak rate.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from testbed import traces

WORDS: tuple[str, ...] = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
    "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
    "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "amber",
    "basalt", "cobalt", "dune", "ember", "fjord", "glacier", "harbor", "island", "jungle",
    "karst", "lagoon", "meadow", "nebula", "orchid", "prairie", "quartz", "reef", "savanna",
    "tundra", "upland", "valley", "willow", "zephyr",
)  # fmt: skip
SCENARIOS = ("regular", "random")

Rate = Callable[[float], float] | Sequence[float] | np.ndarray


def scenario_rates(name: str, peak: float, slots: int, seed: int = 0) -> np.ndarray:
    """Records per second, one value per slot, for scenario ``regular`` or ``random``.

    The same shapes as the live benchmark's ``wordcount-regular`` and
    ``wordcount-random`` (bench/live.py), as fractions of ``peak``: ``regular`` rises
    linearly from 10 % to 100 % and falls back, twice over ``slots``; ``random`` is a
    fresh level 1..25 (of 25) every slot, like the paper's number of producers.
    """
    if peak < 0:
        raise ValueError(f"peak must be >= 0, got {peak}")
    if name == "regular":
        levels = traces.triangle(slots, 0.1, 1.0, period=max(2, slots // 2))
    elif name == "random":
        levels = traces.random_steps(slots, 1, 25, seed=seed) / 25.0
    else:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return peak * levels


class TraceFeeder:
    """Writes batches into ``input_dir`` at ``rate(t)`` records/s until stopped.

    ``rate`` is a callable of the seconds since start, a constant, or an array with
    one rate per ``slot_seconds`` (the feeder stops at the array's end). ``total``
    stops it after exactly that many records. ``records_written`` counts records
    in files already renamed into place, i.e. visible to the job.
    """

    def __init__(
        self,
        input_dir: Path,
        rate: Rate | float,
        *,
        slot_seconds: float = 1.0,
        batch_period: float = 0.25,
        total: int | None = None,
        first_id: int = 0,
        words: Sequence[str] = WORDS,
        prefix: str = "batch",
    ) -> None:
        if batch_period <= 0 or slot_seconds <= 0:
            raise ValueError("batch_period and slot_seconds must be > 0")
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        if not words or any("," in w or "\n" in w for w in words):
            raise ValueError("words must be non-empty and contain no ',' or newline")
        self.input_dir = Path(input_dir)
        self.batch_period = float(batch_period)
        self.slot_seconds = float(slot_seconds)
        self.total = total
        self.words = tuple(words)
        self.prefix = prefix
        self._rate, self._end = self._rate_function(rate)
        self._next_id = first_id
        self._records = 0
        self._batches = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.started_at: float | None = None  # time.monotonic() at start

    # -- public ---------------------------------------------------------------------

    @property
    def records_written(self) -> int:
        with self._lock:
            return self._records

    @property
    def batches_written(self) -> int:
        with self._lock:
            return self._batches

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> TraceFeeder:
        if self._thread is not None:
            raise RuntimeError("TraceFeeder already started")
        self.input_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="flink-trace-feeder", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> int:
        """Stop after the batch in progress (it is completed, not torn); records written."""
        self._stop.set()
        self.join(timeout)
        return self.records_written

    def join(self, timeout: float | None = None) -> None:
        """Wait for the trace (or ``total``) to end; re-raises a writer error."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"TraceFeeder still running after {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"TraceFeeder failed: {self._error}") from self._error

    def __enter__(self) -> TraceFeeder:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------

    def _rate_function(self, rate: Rate | float) -> tuple[Callable[[float], float], float | None]:
        if callable(rate):
            return rate, None
        if np.ndim(rate) == 0:  # a constant: int, float or numpy scalar
            value = float(rate)
            if value < 0:
                raise ValueError(f"rate must be >= 0, got {value}")
            return (lambda _t: value), None
        values = np.asarray(rate, dtype=float)
        if values.ndim != 1 or values.size == 0 or np.any(values < 0):
            raise ValueError("a rate array must be 1-D, non-empty and >= 0")
        if not np.all(np.isfinite(values)):
            raise ValueError("a rate array must be finite")
        slot = self.slot_seconds
        return (lambda t: float(values[min(int(t // slot), values.size - 1)])), values.size * slot

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced by join()/stop()
            self._error = exc

    def _loop(self) -> None:
        start = time.monotonic()
        self.started_at = start
        carry = 0.0
        k = 0
        # Batches are due on a fixed grid (start + k * period), so a slow write
        # delays one batch without shifting every later one.
        while not self._stop.is_set():
            k += 1
            due = start + k * self.batch_period
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            t_mid = (k - 0.5) * self.batch_period
            if self._end is not None and t_mid >= self._end:
                break
            want = max(0.0, float(self._rate(t_mid))) * self.batch_period + carry
            n = int(want)
            carry = want - n
            if self.total is not None:
                n = min(n, self.total - self.records_written)
            if n > 0:
                self._write_batch(n)
            if self.total is not None and self.records_written >= self.total:
                break

    def _write_batch(self, n: int) -> None:
        ts = time.time_ns() // 1_000_000
        first = self._next_id
        words, nw = self.words, len(self.words)
        body = "".join(f"{i},{words[i % nw]},{ts}\n" for i in range(first, first + n))
        name = f"{self.prefix}-{self._batches:09d}.csv"
        hidden = self.input_dir / f".{name}"
        hidden.write_text(body)
        os.replace(hidden, self.input_dir / name)
        with self._lock:
            self._next_id += n
            self._records += n
            self._batches += 1
