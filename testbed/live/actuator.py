"""The live testbed's move endpoint: the controller's ``TestbedMoveActuator`` talks to it.

A small JSON-over-HTTP server on loopback (``http.server``), because the
controller is a separate process:

- ``POST /moves`` with a plan (``controller.placement.migration.plan_to_dict``):
  every move is handed to the :class:`DistributedTopology` of its application
  (the first component of the instance id); the reply is their merged
  ``MoveResult`` (``controller.placement.migration``), sent with its
  ``to_dict()`` and read back by the controller with ``MoveResult.from_dict``.
  The plan is read with the controller's ``plan_from_dict`` too: the testbed
  has no JSON keys of its own, so the two ends cannot drift apart. Moves of
  unknown applications are refused with the reason. A malformed plan gets
  HTTP 400 naming the field; nothing moves.
- ``POST /rescale`` with ``{"changes": [{"app", "operator", "count"}]}`` (the
  controller's ``TestbedParallelism``, ``controller.edges.parallelism``): each
  change is handed to ``DistributedTopology.rescale``; the reply is
  ``{"results": [...]}``, one ``RescaleResult.to_dict()`` per change, in order.
  A change that cannot be made (count 0, above the limit, unknown application
  or operator) is a result with ``done`` false and the reason, never an HTTP
  error. A malformed request gets HTTP 400 naming the field; nothing changes.
- ``GET /placement``: instance id -> [worker, node] for every application.
- ``GET /parallelism``: application -> operator -> instance count.

Moves and rescales are executed one request at a time.

The endpoint binds its port when it is built, so it can be started before
anything else: the controller's config needs its URL (``move_url``), the
agents need the controller, and a topology needs the agents' sockets. The
topologies are attached (:meth:`MoveEndpoint.attach`) once they run; until
then their moves are refused with the reason::

    endpoint = MoveEndpoint().start()
    cluster = LocalCluster(..., controller_config={"move_actuator": "testbed",
                                                   "move_url": endpoint.url}).start()
    topo = DistributedTopology(..., nodes={n: str(a.socket) for n, a in cluster.agents.items()})
    topo.start()
    endpoint.attach(topo)
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.edges.parallelism import RescaleResult, parse_rescale_request
from controller.placement.migration import MoveResult, plan_from_dict
from controller.placement.model import Plan
from testbed.live.distributed import DistributedTopology, migration_result

log = logging.getLogger(__name__)

#: Largest plan accepted, in bytes (a plan for thousands of instances is far smaller).
MAX_BODY_BYTES = 8 * 1024 * 1024


def execute_plan(topologies: Mapping[str, DistributedTopology], plan: Plan) -> MoveResult:
    """Run ``plan`` on the topologies it names; their results merged into one."""
    merged = migration_result()
    by_app: dict[str, list] = {}
    for move in plan.moves:
        app = move.instance.split("/", 1)[0]
        if app not in topologies:
            merged.refused[move.instance] = f"application {app!r} is not running in this testbed"
        else:
            by_app.setdefault(app, []).append(move)
    for app, moves in by_app.items():
        merge_result(merged, topologies[app].migrate(replace(plan, moves=tuple(moves))))
    return merged


def execute_rescale(
    topologies: Mapping[str, DistributedTopology], changes: list[tuple[str, str, int]]
) -> list[RescaleResult]:
    """Carry out each (app, operator, count) change; one result per change, in order."""
    results = []
    for app, operator, count in changes:
        topo = topologies.get(app)
        if topo is None:
            why = f"application {app!r} is not running in this testbed"
            results.append(RescaleResult(app, operator, 0, 0, done=False, reason=why))
            continue
        try:
            results.append(topo.rescale(operator, count))
        except Exception as exc:  # noqa: BLE001 - one failed change must not hide the others
            log.exception("rescaling %s/%s to %s failed", app, operator, count)
            n = topo.instance_counts().get(operator, 0)
            why = f"rescale failed: {type(exc).__name__}: {exc}"
            results.append(RescaleResult(app, operator, n, n, done=False, reason=why))
    return results


def merge_result(into: MoveResult, part: MoveResult) -> None:
    """Add one application's ``part`` to ``into``: every list and every reason map of
    ``MoveResult`` adds up (whatever fields it has), the pause is the longest."""
    for f in fields(MoveResult):
        mine, theirs = getattr(into, f.name), getattr(part, f.name)
        if isinstance(mine, list):
            mine.extend(theirs)
        elif isinstance(mine, dict):
            mine.update(theirs)
    into.pause_seconds = max(into.pause_seconds, part.pause_seconds)


class MoveEndpoint:
    """Serves the move endpoint for ``topologies`` (app -> topology) on ``host:port``."""

    def __init__(
        self,
        topologies: Mapping[str, DistributedTopology] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.topologies: dict[str, DistributedTopology] = dict(topologies or {})
        self._serialize = threading.Lock()
        # Requests received per path (a controller that retries in a loop shows here).
        self.requests: dict[str, int] = {}
        self._serialize_counts = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("move endpoint: " + fmt, *args)

            def _reply(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/parallelism":
                    counts = {
                        app: topo.instance_counts()
                        for app, topo in tuple(endpoint.topologies.items())
                    }
                    self._reply(200, counts)
                    return
                if self.path != "/placement":
                    self._reply(404, {"error": f"no such path {self.path!r}"})
                    return
                placement = {}
                for topo in tuple(endpoint.topologies.values()):
                    placement.update({k: list(v) for k, v in topo.placement().items()})
                self._reply(200, placement)

            def _body(self) -> Any:
                """The JSON body; None after replying 400."""
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                except ValueError:
                    self._reply(400, {"error": "Content-Length must be an integer"})
                    return None
                if not 0 < length <= MAX_BODY_BYTES:
                    self._reply(400, {"error": f"body must be 1..{MAX_BODY_BYTES} bytes"})
                    return None
                try:
                    return json.loads(self.rfile.read(length))
                except ValueError as exc:
                    self._reply(400, {"error": f"body is not JSON: {exc}"})
                    return None

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                with endpoint._serialize_counts:
                    endpoint.requests[self.path] = endpoint.requests.get(self.path, 0) + 1
                if self.path == "/rescale":
                    self._rescale()
                    return
                if self.path != "/moves":
                    self._reply(404, {"error": f"no such path {self.path!r}"})
                    return
                data = self._body()
                if data is None:
                    return
                try:
                    plan = plan_from_dict(data)
                except (ValueError, TypeError) as exc:
                    self._reply(400, {"error": f"bad plan: {exc}"})
                    return
                with endpoint._serialize:
                    try:
                        result = execute_plan(endpoint.topologies, plan).to_dict()
                    except Exception as exc:  # noqa: BLE001 - reported to the caller, logged here
                        log.exception("executing a plan failed")
                        self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
                        return
                self._reply(200, result)

            def _rescale(self) -> None:
                data = self._body()
                if data is None:
                    return
                try:
                    changes = parse_rescale_request(data)
                except ValueError as exc:
                    self._reply(400, {"error": f"bad rescale request: {exc}"})
                    return
                with endpoint._serialize:
                    results = execute_rescale(endpoint.topologies, changes)
                self._reply(200, {"results": [r.to_dict() for r in results]})

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="move-endpoint", daemon=True
        )

    def attach(self, topology: DistributedTopology) -> None:
        """Serve the moves of ``topology``'s application from now on."""
        # Not while a plan runs: a plan is carried out against one set of topologies.
        with self._serialize:
            self.topologies[topology.spec.app] = topology

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> MoveEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MoveEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
