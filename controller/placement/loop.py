"""Placement off the fast loop: one thread, one lock, the plan in progress.

Planning at cluster size and moving instances take longer than a slot, so an
epoch only offers its typed demands to :class:`PlacementLoop`; when the
thread is idle and no earlier move is still settling, it plans (and, in
enforce mode, moves) in the background, and the epoch reports the last plan
that finished. Until instances have moved, the overflow stays cut by weight.

A plan of a large cluster (``process_min_instances`` instances or more, 2,000
by default) is computed in a child process at a lower CPU priority, not on the
placement thread: planning is pure Python, and on a thread it would hold the
interpreter lock for seconds against the epoch, report ingestion and the gRPC
event loop. The offer and the strategy (whose memory, e.g. ``liu``'s scale-in
patience, carries over between plans) go to the child; the plan and the
strategy as the plan left it come back, so :attr:`PlacementLoop.strategy` is
always the one to plan with next. Moves are still carried out here. Small
plans stay on the thread (starting a process would cost more than the plan).
docs/placement.md, "Where plans run", has the figures.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from controller.placement.common import PlacementStrategy
from controller.placement.migration import LogOnlyMoveActuator, MoveActuator, MoveResult
from controller.placement.model import Plan
from controller.placement.stage import PlacementDemand, placement_summary, plan_placement
from dsched.ids import InstanceKey

log = logging.getLogger(__name__)

#: Offers of at least this many instances are planned in a child process.
PROCESS_MIN_INSTANCES = 2_000
#: How much lower the planner process's CPU priority is (os.nice increment).
PLANNER_NICENESS = 10
#: Planner processes that may die in a row before plans stay on the thread.
PLANNER_DEATHS_TOLERATED = 3


@dataclass(frozen=True)
class PlacementOffer:
    """One epoch's snapshot for the planner."""

    epoch: int
    mode: str
    demands: Mapping[InstanceKey, PlacementDemand]
    capacity: Mapping[str, float]
    current: Mapping[str, tuple[str, bool]]  # instance id -> (worker, stateful)
    dags: Mapping[str, list[tuple[str, str]]]
    # Instance id -> why dsched must not move it (its engine places it): recommend only.
    pinned: Mapping[str, str] = field(default_factory=dict)


class PlacementLoop:
    """Owns the placement thread, the moves still settling, and their lock."""

    def __init__(
        self,
        strategy: PlacementStrategy,
        mover: MoveActuator,
        headroom_cores: float,
        settle_epochs: int,
        process_min_instances: int | None = PROCESS_MIN_INSTANCES,
        min_relief_cores: float = 0.0,
    ):
        self.strategy = strategy
        # Per instance moved, the overload a plan made for overload alone must
        # remove (plan_placement).
        self.min_relief_cores = min_relief_cores
        # None: every plan on the placement thread.
        self.process_min_instances = process_min_instances
        self._planner: ProcessPoolExecutor | None = None
        self._planner_deaths = 0
        self.mover = mover
        self.headroom_cores = headroom_cores
        # A move not reported on its new node after this many epochs is news
        # in itself: stop waiting for it.
        self.settle_epochs = settle_epochs
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsched-place")
        self._job: Future | None = None
        self._done: dict[str, Any] | None = None
        # Instances the last plan moved -> their new node: until the agents
        # report them there, demands still show the old placement, and a plan
        # made from it would repeat the moves.
        self._settling: dict[str, str] = {}
        self._settling_since = 0

    @property
    def settling(self) -> dict[str, str]:
        with self._lock:
            return dict(self._settling)

    def offer(
        self,
        epoch: int,
        nodes: Callable[[], Mapping[str, str]],
        snapshot: Callable[[], PlacementOffer],
    ) -> dict[str, Any]:
        """Start a plan when idle and settled; the record's summary.

        ``nodes`` (instance id -> node this epoch) is asked only while moves
        settle, and ``snapshot`` only when a plan starts: most epochs find the
        thread busy or nothing settling, and building either at cluster size
        would cost the fast loop for nothing."""
        with self._lock:
            done, self._done = self._done, None
        busy = self._job is not None and not self._job.done()
        settling = [] if busy else self._still_settling(epoch, nodes)
        if not busy and not settling:
            self._job = self._pool.submit(self._plan_and_move, snapshot())
        out: dict[str, Any] = {"planned": False, "in_progress": busy}
        if settling:
            out["awaiting_moved"] = settling
        if done is not None:
            out.update(done)
        return out

    def _still_settling(self, epoch: int, nodes: Callable[[], Mapping[str, str]]) -> list[str]:
        with self._lock:
            if not self._settling:
                return []
            if epoch - self._settling_since > self.settle_epochs:
                log.warning(
                    "moved instances not reported on their new node after %d epochs: %s",
                    self.settle_epochs,
                    ", ".join(sorted(self._settling)),
                )
                self._settling = {}
                return []
            where = nodes()
            pending = sorted(i for i, node in self._settling.items() if where.get(i) != node)
            if not pending:
                self._settling = {}
            return pending

    def _plan(self, offer: PlacementOffer) -> Plan | None:
        """The offer's plan, in the child process when the offer is large."""
        limit = self.process_min_instances
        if (
            limit is not None
            and len(offer.demands) >= limit
            and self._planner_deaths < PLANNER_DEATHS_TOLERATED
        ):
            if self._planner is None:
                self._planner = ProcessPoolExecutor(
                    max_workers=1,
                    # Not fork: the parent runs gRPC and a dozen threads.
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_lower_priority,
                )
            try:
                future = self._planner.submit(
                    _plan_elsewhere,
                    offer,
                    self.strategy,
                    self.headroom_cores,
                    self.min_relief_cores,
                )
                plan, self.strategy = future.result()
                self._planner_deaths = 0
                return plan
            except BrokenProcessPool:
                # The child died (killed, out of memory, or it could not start:
                # a program embedding the controller must guard its main module
                # as multiprocessing requires): plan here this time, and start
                # a new child for the next plan, a few times in a row at most.
                self._planner_deaths += 1
                log.exception(
                    "epoch %d: the planner process died (%d of %d in a row)%s",
                    offer.epoch,
                    self._planner_deaths,
                    PLANNER_DEATHS_TOLERATED,
                    ""
                    if self._planner_deaths < PLANNER_DEATHS_TOLERATED
                    else "; plans are made on the placement thread from now on",
                )
                self._planner.shutdown(wait=False, cancel_futures=True)
                self._planner = None
        return _plan_offer(offer, self.strategy, self.headroom_cores, self.min_relief_cores)

    def _plan_and_move(self, offer: PlacementOffer) -> None:
        try:
            plan = self._plan(offer)
        except ValueError as exc:
            log.error("epoch %d: no placement plan: %s", offer.epoch, exc)
            with self._lock:
                self._done = {"planned": False, "error": str(exc), "epoch": offer.epoch}
            return
        if plan is None:
            return
        mover = self.mover if offer.mode == "enforce" else LogOnlyMoveActuator()
        # Pinned instances' moves are in plan.recommended, never in plan.moves:
        # the actuator only sees what dsched may move.
        try:
            if plan.moves:
                result = mover.execute(plan).to_dict()
            else:
                result = MoveResult(mover.name, False).to_dict()  # recommendations only
        except (OSError, ValueError, RuntimeError) as exc:
            # A failed move leaves every instance where it was (the actuator
            # rolls back); the next plan starts from what is measured then.
            log.error("moves planned in epoch %d failed: %s", offer.epoch, exc)
            result = {"error": str(exc)}
        moved = set(result.get("moved", ())) | set(result.get("restarted", ()))
        with self._lock:
            self._settling = {m.instance: m.to_node for m in plan.moves if m.instance in moved}
            self._settling_since = offer.epoch
            self._done = {
                "planned": True,
                "epoch": offer.epoch,
                **placement_summary(plan),
                "actuator": mover.name,
                "result": result,
            }

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the thread is idle (tests, shutdown)."""
        job = self._job
        if job is None:
            return True
        try:
            job.result(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def stop(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
        if self._planner is not None:
            self._planner.shutdown(wait=True)
            self._planner = None


def _plan_offer(
    offer: PlacementOffer,
    strategy: PlacementStrategy,
    headroom_cores: float,
    min_relief_cores: float = 0.0,
) -> Plan | None:
    return plan_placement(
        offer.demands,
        capacity=offer.capacity,
        current=offer.current,
        strategy=strategy,
        headroom_cores=headroom_cores,
        dags=offer.dags,
        pinned=offer.pinned,
        min_relief_cores=min_relief_cores,
    )


def _plan_elsewhere(
    offer: PlacementOffer,
    strategy: PlacementStrategy,
    headroom_cores: float,
    min_relief_cores: float = 0.0,
) -> tuple[Plan | None, PlacementStrategy]:
    """In the planner process: the plan, and the strategy with its memory updated."""
    return _plan_offer(offer, strategy, headroom_cores, min_relief_cores), strategy


def _lower_priority() -> None:
    """The planner yields the CPU to the controller's fast loop."""
    try:
        os.nice(PLANNER_NICENESS)
    except OSError:  # not permitted here: plan at the same priority
        pass
