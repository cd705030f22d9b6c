"""The node-side engine interface and the registry of kinds (agent/engines/__init__.py
says what engines are; each kind's module registers itself into :data:`NODE_ENGINES`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from dsched.engines import ThreadMapping
from dsched.registry import Registry

if TYPE_CHECKING:
    from agent.config import EngineConfig


class NodeEngine(ABC):
    """One engine on this node: which threads run which instance.

    ``name`` labels metrics and log lines (the kind, made unique when a node
    runs two clusters of one kind). ``directory_refreshes`` counts the calls
    made to the engine's cluster for its job directory, so their rate can be
    watched (they must stay rare: every node makes them).
    """

    kind: str = ""

    def __init__(self, scan_seconds: float = 0.0) -> None:
        self.name = self.kind
        # 0: once a slot (the agent's slot_seconds).
        self.scan_seconds = scan_seconds
        self.directory_refreshes = 0
        # Applications the agent holds caps for (instances that left this node):
        # the engine keeps live_apps() current for them even when no thread needs it.
        self.watched_apps: frozenset[str] = frozenset()

    @abstractmethod
    def map_threads(self) -> ThreadMapping:
        """One pass over this node's worker processes. Never raises: a failure is a
        mapping with ``unavailable`` set, and the agent then keeps what it knows."""

    def live_apps(self) -> frozenset[str] | None:
        """Applications the engine still runs anywhere (running or restarting), as of the
        last pass; None when unknown. Caps of an instance that left this node are kept
        while its application lives, for when it comes back (a restart, a failover)."""
        return None

    @classmethod
    def check_config(cls, config: EngineConfig) -> None:
        """Kind-specific checks of an ``[[engine]]`` table; ConfigError names the key."""
        return None


# kind -> the NodeEngine class, built with (config: EngineConfig, proc_root: str).
NODE_ENGINES: Registry[NodeEngine] = Registry("engine", "kind")
