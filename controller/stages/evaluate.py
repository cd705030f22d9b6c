"""Stage 1 of the epoch: what each operator did over the last phi slots.

The reports of an operator's instances are summed per slot into an
:class:`OperatorView`, the input of every later stage. Pure: it reads the
observed cluster and returns new values.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, is_, itemgetter
from typing import Protocol

import numpy as np

from controller.model import InstanceHistory, InstanceSlot
from dsched.ids import InstanceKey, OperatorKey


@dataclass
class OperatorView:
    """An operator over the last phi slots, summed over its instances."""

    key: OperatorKey
    instances: list[InstanceKey]
    nodes: dict[InstanceKey, str]
    stateful: bool
    upstream: tuple[str, ...]
    seconds: np.ndarray  # slot lengths
    arrivals: np.ndarray  # tuples/s per slot
    executed: np.ndarray  # tuples/s per slot
    emitted: np.ndarray  # tuples/s per slot
    cpu_seconds: np.ndarray  # CPU-seconds per slot
    queue: np.ndarray  # tuples waiting at each slot's end
    queue_by_instance: dict[InstanceKey, float]
    usage_by_instance: dict[InstanceKey, float]
    cap_by_instance: dict[InstanceKey, float | None]  # the cap in force during the last slot
    throttled_by_instance: dict[InstanceKey, float | None]  # seconds throttled in the last slot
    latency_ms: float | None  # mean end-to-end latency of tuples finished here, last slot
    service_ms: float | None  # mean processing time per tuple, over the window
    last_timestamp: float = 0.0  # end of the newest slot
    # Instance-reported service seconds per slot (summed over instances): the
    # variability stage needs each slot's mean service time, not just the window's.
    service_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Each instance's share of the operator's arrivals over the window (empty:
    # none arrived). Fields grouping sends all of a key's tuples to one
    # instance, so a few keys spread over a few instances are far from even.
    share_by_instance: dict[InstanceKey, float] = field(default_factory=dict)

    def load_weight(self, key: InstanceKey) -> float:
        """The instance's arrivals over an even share's: 1.0 for an even split
        or when nothing arrived, 0 for an instance no key maps to."""
        share = self.share_by_instance.get(key)
        return 1.0 if share is None else len(self.instances) * share

    def window_mean(self, rates: np.ndarray) -> float:
        """The window's mean of a per-slot rate (``arrivals``, ``executed``, ...),
        each slot weighted by its length; 0 over an empty window."""
        total = float(self.seconds.sum())
        return float(rates @ self.seconds) / total if total > 0 else 0.0

    @property
    def usage_cores(self) -> float:
        return float(sum(self.usage_by_instance.values()))

    @property
    def selectivity(self) -> float:
        """Tuples emitted per tuple executed (rho: emitted / executed), over the window."""
        done = float(self.executed @ self.seconds)
        return float(self.emitted @ self.seconds) / done if done > 0 else 0.0

    @property
    def queue_change(self) -> float:
        """Mean growth of the queue per second over the window. The load model's
        delta (executed - arrivals) is its negation."""
        if len(self.queue) < 2:
            return 0.0
        return float((self.queue[-1] - self.queue[0]) / max(self.seconds[1:].sum(), 1e-9))


class Observed(Protocol):
    """What evaluate reads of the observed cluster (controller/edges/cluster.py)."""

    histories: Mapping[InstanceKey, InstanceHistory]


# What the views take from every slot of the window, and from the newest slot
# only: the numeric fields of an InstanceSlot from ``timestamp`` to
# ``service_seconds``, which lie side by side in the tuple, so a slot's values
# are read with one slice (a third less time than ten attribute reads).
_WINDOW_FIELDS = (
    "timestamp",
    "seconds",
    "arrivals",
    "executed",
    "emitted",
    "cpu_seconds",
    "queue_length",
    "latency_sum_seconds",
    "latency_count",
    "service_seconds",
)
_WIDTH = len(_WINDOW_FIELDS)
_FIRST = InstanceSlot._fields.index(_WINDOW_FIELDS[0])
if InstanceSlot._fields[_FIRST : _FIRST + _WIDTH] != _WINDOW_FIELDS:  # pragma: no cover
    raise ImportError("InstanceSlot's numeric fields are no longer side by side")
_window_of = itemgetter(slice(_FIRST, _FIRST + _WIDTH))
(
    _TIMESTAMP,
    _SECONDS,
    _ARRIVALS,
    _EXECUTED,
    _EMITTED,
    _CPU,
    _QUEUE,
    _LATENCY_SUM,
    _LATENCY_COUNT,
    _SERVICE,
) = range(_WIDTH)
# The fields summed per (operator, slot), in the order of the sums below.
_SUMMED = (_SECONDS, _ARRIVALS, _EXECUTED, _EMITTED, _CPU, _QUEUE, _SERVICE)


@dataclass
class _Layout:
    """The instances evaluate works on, in key order, and their operators.

    Sorting 20,000 histories by key and finding where each operator's run
    starts cost as much as the arithmetic; the set of instances changes
    rarely, so this is kept while the histories given are the very objects of
    the last call, in the same order (a key never changes on a history).
    """

    given: list  # the histories as given (held: their identities are the check)
    hists: list  # sorted by key
    keys: list[InstanceKey]
    first: list[int]  # index of each operator's first instance
    starts: np.ndarray
    ends: np.ndarray
    per_op: np.ndarray  # instances per operator
    op_of: np.ndarray  # operator of each instance
    ops: list[OperatorKey]
    #: Each operator's ``nodes`` mapping for ``node_list`` (copied out: views are the caller's).
    node_list: list[str] = field(default_factory=list)
    nodes: list[dict[InstanceKey, str]] = field(default_factory=list)

    @classmethod
    def of(cls, given: list) -> _Layout:
        hists = sorted(given, key=_key_of)
        keys = list(map(_key_of, hists))
        first = [0] + [
            i
            for i, (a, b) in enumerate(zip(keys, keys[1:], strict=False), start=1)
            if a.app != b.app or a.operator != b.operator
        ]
        starts = np.asarray(first)
        ends = np.append(starts[1:], len(hists))
        per_op = ends - starts
        op_of = np.repeat(np.arange(len(first)), per_op)
        ops = [OperatorKey(keys[s].app, keys[s].operator) for s in first]
        return cls(given, hists, keys, first, starts, ends, per_op, op_of, ops)

    def same(self, given: list) -> bool:
        return len(given) == len(self.given) and all(map(is_, given, self.given))

    def nodes_by_op(self) -> list[dict[InstanceKey, str]]:
        """Each operator's instance -> node, as the histories say now."""
        node_list = list(map(_node_of, self.hists))
        if node_list != self.node_list or len(self.nodes) != len(self.first):
            keys = self.keys
            bounds = zip(self.first, self.ends.tolist(), strict=True)
            self.nodes = [dict(zip(keys[s:e], node_list[s:e], strict=True)) for s, e in bounds]
            self.node_list = node_list
        return [d.copy() for d in self.nodes]


@dataclass
class SlotRows:
    """Each instance's slot values as read in the last epoch, and the order of
    the instances (:class:`_Layout`).

    Reading a field of a slot object costs more than all the arithmetic done
    on it (20,000 instances' slots lie all over memory), and a slot stays in
    its instance's window for phi epochs. Between two epochs an instance's
    deque usually gains one slot at the end (dropping the oldest when full):
    then only that slot is read, and the rest are shifted from ``rows``.
    Which case applies is decided by identity: the history objects must be the
    very ones of the last call, in the same order, and the newest slot seen
    then must now sit just before the end (or still at it, with nothing new).
    ``rows`` is as deep as the deques may grow (rows right-aligned, the unused
    left part zero), so the first epochs after a start shift too.
    Slots are frozen and histories only append, so a cached value is always
    the one the slot holds. Anything else is read afresh. It changes how fast
    the views are made, never their values.
    """

    histories: list = field(default_factory=list)  # held: their identities are the check
    newest: list = field(default_factory=list)  # each one's newest slot when read
    lengths: list[int] = field(default_factory=list)
    # rows[i, depth - k:] are instance i's k slots, oldest first, right-aligned.
    rows: np.ndarray = field(default_factory=lambda: np.empty((0, 0, _WIDTH)))
    layout: _Layout | None = None

    def order(self, given: list) -> _Layout:
        """The layout of ``given`` (histories with slots), kept while they are the same."""
        layout = self.layout
        if layout is None or not layout.same(given):
            layout = self.layout = _Layout.of(given)
        return layout

    def read(self, hists: list, deques: list) -> np.ndarray:
        """(instance, position, field) values, right-aligned to the longest deque
        (or the depth of the last call, when deeper and the histories the same)."""
        lengths = list(map(len, deques))
        n = len(deques)
        # As deep as the deques may grow (bounded), so that while they fill
        # the rows keep their shape and are shifted, not read afresh.
        depth = max(max(lengths), min(deques[0].maxlen or 0, _MAX_DEPTH))
        aligned = (
            depth <= self.rows.shape[1]
            and len(hists) == len(self.histories)
            and (hists is self.histories or all(map(is_, hists, self.histories)))
        )
        newest = list(map(_last, deques))
        if aligned:
            depth = self.rows.shape[1]
            # Changed in place: the caller gets copies (fancy indexing), and
            # every read below happens before the first write, so an error
            # leaves the cache as it was.
            rows = self.rows
            now, was = np.asarray(lengths), np.asarray(self.lengths)
            same = np.fromiter(map(is_, newest, self.newest), bool, n)
            # One slot more (the oldest dropped when the deque was full).
            grew = np.flatnonzero(~same & (now >= 2) & (now == np.minimum(was + 1, depth)))
            if len(grew) == n:  # the usual epoch: every instance has one slot more
                before = map(_second_last, deques)
                seen = self.newest
            else:
                before = map(_second_last, [deques[i] for i in grew.tolist()])
                seen = [self.newest[i] for i in grew.tolist()]
            one_more = np.fromiter(map(is_, before, seen), bool, len(grew))
            shifted = grew[one_more].tolist()
            keep = same & (now == was)
            keep[shifted] = True
            fresh = np.flatnonzero(~keep).tolist()
        else:
            rows = np.zeros((n, depth, _WIDTH))
            shifted, fresh = [], list(range(n))
        if len(shifted) == n:
            appended = _read(newest)
        elif shifted:
            appended = _read([newest[i] for i in shifted])
        counts = [lengths[i] for i in fresh]
        values = _read([s for i in fresh for s in deques[i]]) if fresh else None
        if len(shifted) == n:
            # Slices, not index lists: the whole array moves by one position.
            rows[:, :-1] = rows[:, 1:]
            rows[:, -1] = appended
        elif shifted:
            rows[shifted, :-1] = rows[shifted, 1:]
            rows[shifted, -1] = appended
        if fresh:
            pos = depth - np.repeat(counts, counts) + _ranks(counts)
            rows[np.repeat(fresh, counts), pos] = values
        self.histories, self.rows, self.lengths = hists, rows, lengths
        self.newest = newest
        return rows


def _ranks(counts: list[int]) -> np.ndarray:
    """0, 1, .., c - 1 for each count c, concatenated."""
    total = int(sum(counts))
    starts = np.repeat(np.cumsum([0, *counts[:-1]]), counts)
    return np.arange(total) - starts


def _read(slots: list) -> np.ndarray:
    return np.fromiter(
        chain.from_iterable(map(_window_of, slots)), float, len(slots) * _WIDTH
    ).reshape(len(slots), _WIDTH)


# The deepest rows made for deques that are not full yet (memory: 20,000
# instances x 64 x 10 fields of 8 bytes is 100 MB).
_MAX_DEPTH = 64
_cap_of = attrgetter("cap_cores")
_throttled_of = attrgetter("throttled_seconds")
_key_of = attrgetter("key")
_node_of = attrgetter("node")
_slots_of = attrgetter("slots")
_stateful_of = attrgetter("stateful")
_last = itemgetter(-1)
_second_last = itemgetter(-2)


def evaluate(
    cluster: Observed,
    phi: int,
    exclude: Container[InstanceKey] = (),
    rows: SlotRows | None = None,
) -> dict[OperatorKey, OperatorView]:
    """Views of every operator with slots. Instances in ``exclude`` (unmeasured this
    slot: their engine's counters are missing) are left out; the epoch holds their caps.
    ``rows``, when given, remembers the values read from slots between calls
    (:class:`SlotRows`).

    All instances are summed at once: their window slots are read into one
    array (instance by instance, oldest slot first) and summed per (operator,
    slot) with ``bincount``, which adds in that order, the order of a sum over
    the instances one by one; so the views equal those of a loop over the
    instances to the last bit (tests/test_epoch_vectorised.py holds that loop).
    """
    hists = [h for h in cluster.histories.values() if h.slots]
    if exclude:  # usually empty: then no key is hashed
        hists = [h for h in hists if h.key not in exclude]
    if not hists:
        return {}
    cache = rows if rows is not None else SlotRows()
    # Operators in key order, instances by index within each.
    layout = cache.order(hists)
    hists, keys, first = layout.hists, layout.keys, layout.first
    starts, ends, per_op, op_of = layout.starts, layout.ends, layout.per_op, layout.op_of
    n_ops, n_inst = len(first), len(hists)
    deques = list(map(_slots_of, hists))
    lengths = np.fromiter(map(len, deques), int, n_inst)
    # Instances on different nodes report on their own clocks; align by
    # recency (the k-th newest slot of each) over the slots all of them have.
    window = np.minimum(np.minimum.reduceat(lengths, starts), phi)
    take = window[op_of]
    # Each instance's last ``take`` slots, instance by instance, oldest first.
    cached = cache.read(hists, deques)
    last_slots = cache.newest  # each deque's newest slot, as read
    depth = cached.shape[1]
    inst = np.repeat(np.arange(n_inst), take)
    values = cached[inst, depth - np.repeat(take, take) + _ranks(take.tolist())]
    n_slots = len(values)
    # Slot j of operator o sums into row slot_start[o] + j.
    slot_start = np.concatenate(([0], np.cumsum(window)[:-1]))
    inst_first_slot = np.concatenate(([0], np.cumsum(take)[:-1]))
    position = np.arange(n_slots) - np.repeat(inst_first_slot, take)
    row = np.repeat(slot_start[op_of], take) + position
    n_rows = int(window.sum())
    sums = {c: np.bincount(row, weights=values[:, c], minlength=n_rows) for c in _SUMMED}
    secs = sums[_SECONDS] / np.repeat(per_op, window)
    arrivals = sums[_ARRIVALS] / secs
    executed = sums[_EXECUTED] / secs
    emitted = sums[_EMITTED] / secs
    flat_op = np.repeat(op_of, take)
    inst_arrivals = np.bincount(inst, weights=values[:, _ARRIVALS], minlength=n_inst)
    op_arrivals = np.bincount(op_of, weights=inst_arrivals, minlength=n_ops)
    arrived = (op_arrivals > 0).tolist()
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = (inst_arrivals / op_arrivals[op_of]).tolist()
    service = np.bincount(flat_op, weights=values[:, _SERVICE], minlength=n_ops).tolist()
    service_count = np.bincount(flat_op, weights=values[:, _EXECUTED], minlength=n_ops).tolist()
    # The newest slot of each instance.
    last_rows = inst_first_slot + take - 1
    last_values = values[last_rows]
    lat_sum = np.bincount(op_of, weights=last_values[:, _LATENCY_SUM], minlength=n_ops).tolist()
    lat_count = np.bincount(op_of, weights=last_values[:, _LATENCY_COUNT], minlength=n_ops)
    lat_count = lat_count.tolist()
    newest = np.maximum.reduceat(last_values[:, _TIMESTAMP], starts).tolist()
    last_secs = last_values[:, _SECONDS]
    with np.errstate(divide="ignore", invalid="ignore"):
        usage = np.where(last_secs > 0, last_values[:, _CPU] / last_secs, 0.0).tolist()
    queue_last = last_values[:, _QUEUE].tolist()
    caps = list(map(_cap_of, last_slots))
    throttled = list(map(_throttled_of, last_slots))
    stateful = np.logical_or.reduceat(
        np.fromiter(map(_stateful_of, hists), bool, n_inst), starts
    ).tolist()
    nodes = layout.nodes_by_op()
    views: dict[OperatorKey, OperatorView] = {}
    bounds = zip(
        first,
        ends.tolist(),
        slot_start.tolist(),
        (slot_start + window).tolist(),
        strict=True,
    )
    cpu_sums, queue_sums, service_sums = sums[_CPU], sums[_QUEUE], sums[_SERVICE]
    for o, (s, e, a, b) in enumerate(bounds):
        ks = keys[s:e]
        op = layout.ops[o]
        views[op] = OperatorView(
            key=op,
            instances=ks,
            nodes=nodes[o],
            stateful=stateful[o],
            upstream=hists[s].upstream,
            seconds=secs[a:b],
            arrivals=arrivals[a:b],
            executed=executed[a:b],
            emitted=emitted[a:b],
            cpu_seconds=cpu_sums[a:b],
            queue=queue_sums[a:b],
            queue_by_instance=dict(zip(ks, queue_last[s:e], strict=True)),
            usage_by_instance=dict(zip(ks, usage[s:e], strict=True)),
            cap_by_instance=dict(zip(ks, caps[s:e], strict=True)),
            throttled_by_instance=dict(zip(ks, throttled[s:e], strict=True)),
            latency_ms=(1000 * lat_sum[o] / lat_count[o]) if lat_count[o] else None,
            service_ms=(1000 * service[o] / service_count[o]) if service_count[o] else None,
            last_timestamp=newest[o],
            service_seconds=service_sums[a:b],
            share_by_instance=dict(zip(ks, shares[s:e], strict=True)) if arrived[o] else {},
        )
    return views
