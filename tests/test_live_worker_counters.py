"""A worker process's instance counts Storm's "emitted", as the in-process engine does.

The controller multiplies a parent's selectivity (emitted / executed) by its rate
for each child, so "emitted" must count tuples per output stream, not copies
per subscriber ("transferred"): with the HTTP monitor's ``retrieve`` feeding
three counters, counting copies predicted each counter three times its arrivals.
"""

from __future__ import annotations

import queue
import random
from types import SimpleNamespace

from testbed.live.http_monitor import _log_line, http_monitor
from testbed.live.workers import _STOP, OperatorRuntime, WorkerConfig, WorkerInstance


class _Outbox:
    def __init__(self) -> None:
        self.items: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item: tuple, urgent: bool = False) -> None:
        self.items.put(item)


def test_emitted_counts_tuples_per_stream_and_sent_counts_every_copy():
    spec = {op.name: op for op in http_monitor().operators}["retrieve"]
    config = WorkerConfig(
        worker_id="w1",
        app="httpmon",
        node="n1",
        stateful=False,
        address=None,
        authkey=b"",
        operators={"retrieve": OperatorRuntime(spec, children=3)},
    )
    out = _Outbox()
    worker = SimpleNamespace(
        config=config, out=out, register=lambda *a: None, unregister=lambda *a: None
    )
    inst = WorkerInstance(worker, "retrieve", 0, {}, [])
    rng = random.Random(1)
    for n in range(5):
        key, line = _log_line(n, rng)
        inst.queue.put((n, (0,), 0.0, key, line))
    inst.queue.put(_STOP)
    inst.thread.start()
    inst.thread.join(10)
    assert not inst.thread.is_alive()
    done = []
    while not out.items.empty():
        item = out.items.get()
        if item[0] == "done":
            done.append(item)
    assert len(done) == 5
    # Each parsed line is one record on one stream, copied to three subscribers.
    assert [d[5] for d in done] == [3] * 5
    assert inst.counters.executed == 5
    assert inst.counters.emitted == 5
