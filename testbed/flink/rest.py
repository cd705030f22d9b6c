"""The Flink REST client of dsched's engine adapter, plus what only the testbed needs."""

from __future__ import annotations

from typing import Any

from dsched.engines.flink import FlinkRest as EngineRest
from dsched.engines.flink import FlinkRestError

__all__ = ["FlinkRest", "FlinkRestError"]


class FlinkRest(EngineRest):
    """:class:`dsched.engines.flink.FlinkRest` with the calls that change a cluster
    (cancelling a job), which dsched itself never makes."""

    def __init__(self, base_url: str, timeout: float = 10.0):
        super().__init__(base_url, timeout)

    def patch(self, path: str) -> Any:
        return self.request("PATCH", path)
