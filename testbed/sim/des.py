"""Exact discrete-event path: one FCFS queue with ``servers`` identical servers.

Used to check the simulator's queueing against closed forms (M/M/1, M/M/c)
message by message; the vectorized cluster (testbed/sim/engine.py) trades this
exactness for speed at hundreds of applications.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueueRun:
    arrivals: np.ndarray
    starts: np.ndarray
    departures: np.ndarray

    @property
    def waits(self) -> np.ndarray:
        return self.starts - self.arrivals

    @property
    def sojourns(self) -> np.ndarray:
        return self.departures - self.arrivals


def fcfs_queue(arrivals: np.ndarray, services: np.ndarray, servers: int) -> QueueRun:
    """Serve ``arrivals`` (sorted times) with ``services`` (seconds each) on ``servers``
    servers in arrival order; a customer takes the server that frees first."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    arrivals = np.asarray(arrivals, dtype=float)
    services = np.asarray(services, dtype=float)
    if arrivals.shape != services.shape or arrivals.ndim != 1:
        raise ValueError("arrivals and services must be 1-D arrays of one length")
    if np.any(np.diff(arrivals) < 0):
        raise ValueError("arrivals must be sorted")
    if np.any(services < 0):
        raise ValueError("services must be >= 0")
    free = [0.0] * servers
    starts = np.empty_like(arrivals)
    for i, (a, s) in enumerate(zip(arrivals.tolist(), services.tolist(), strict=True)):
        f = heapq.heappop(free)
        start = a if a > f else f
        starts[i] = start
        heapq.heappush(free, start + s)
    return QueueRun(arrivals, starts, starts + services)


def mmc(
    arrival_rate: float, service_rate: float, servers: int, customers: int, seed: int = 0
) -> QueueRun:
    """An M/M/c run of ``customers`` customers."""
    if arrival_rate <= 0:
        raise ValueError(f"arrival_rate must be > 0, got {arrival_rate}")
    if service_rate <= 0:
        raise ValueError(f"service_rate must be > 0, got {service_rate}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / arrival_rate, customers))
    services = rng.exponential(1.0 / service_rate, customers)
    return fcfs_queue(arrivals, services, servers)
