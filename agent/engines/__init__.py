"""The node side of the engines dsched steers without their help.

An engine that is not instrumented (Apache Flink) does not register its
threads over the agent's socket; the agent finds them itself. Each kind is a
:class:`NodeEngine`: one :meth:`~NodeEngine.map_threads` call looks at this
node's worker processes and says which OS threads run which instance
(:class:`dsched.engines.ThreadMapping`). :class:`agent.engines.discovery.EngineDiscovery`
applies each mapping to the agent (register, update threads, unregister, move
to a new process) on its own thread.

Kinds are chosen by the ``kind`` key of an ``[[engine]]`` table through
:data:`NODE_ENGINES`, a :class:`dsched.registry.Registry`; an unknown kind is a
config error listing the known ones. Counters of engine instances do not come
from here: an adapter beside the controller reads them from the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each kind's module registers itself when imported (tests/test_agent_engine.py checks
# that every kind in dsched.engines.ENGINE_KINDS has one).
from agent.engines import flink as _flink  # noqa: F401
from agent.engines.base import NODE_ENGINES, NodeEngine
from dsched.engines import ThreadMapping

if TYPE_CHECKING:
    from agent.config import EngineConfig


def make_engines(configs: list[EngineConfig], proc_root: str = "/proc") -> list[NodeEngine]:
    """The engines of the ``[[engine]]`` tables, named by their ``name``, else by kind
    (``flink``, then ``flink-2``, ... for further tables of one kind)."""
    engines: list[NodeEngine] = []
    seen: dict[str, int] = {}
    for config in configs:
        engine = NODE_ENGINES.create(config.kind, config, proc_root)
        seen[config.kind] = seen.get(config.kind, 0) + 1
        if config.name:
            engine.name = config.name
        elif seen[config.kind] > 1:
            engine.name = f"{config.kind}-{seen[config.kind]}"
        engines.append(engine)
    return engines


__all__ = ["NODE_ENGINES", "NodeEngine", "ThreadMapping", "make_engines"]
