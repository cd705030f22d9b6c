"""HistoryFeed in plain types, and spark_stream as the history's one home: no Spark needed."""

from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from spark_stream.config import HistoryConfig
from spark_stream.feed import MAX_PENDING_WRITES, SEED_PER_EPOCH, HistoryFeed, OperatorSeed
from tests import test_history_samples as H

PACKAGE = Path(__file__).resolve().parent.parent / "spark_stream"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_spark_stream_imports_nothing_of_the_controller_and_has_no_cycle():
    modules = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
    for name, imports in modules.items():
        foreign = sorted(
            i for i in imports if i.split(".")[0] in ("controller", "testbed", "bench")
        )
        assert not foreign, f"spark_stream/{name}.py imports {foreign}"
    inside = {
        name: {i.split(".")[1] for i in imports if i.startswith("spark_stream.")} & set(modules)
        for name, imports in modules.items()
    }

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in inside[start] - seen:
            if nxt == goal or reaches(nxt, goal, seen | {nxt}):
                return True
        return False

    assert [m for m in modules if reaches(m, m, set())] == []


def _table(config: HistoryConfig, windows: int = 12) -> None:
    """wc/source: 10 (w + 1) arrivals per 10-s window; wc/split: kappa 0.003, and
    nothing executed in its newest window (no kappa there)."""
    rows = [H.operator_window("wc", "source", w, 10.0 * (w + 1)) for w in range(windows)]
    rows += [H.operator_window("wc", "split", w, 50.0, kappa=0.003) for w in range(windows)]
    rows.append(H.operator_window("wc", "split", windows, 0.0))
    H.write_operator_table(config, rows)


def test_seed_returns_the_newest_kappa_and_source_rates_oldest_first(tmp_path):
    config = HistoryConfig.under(tmp_path)
    _table(config)
    feed = HistoryFeed(config)
    asked = {("wc", "source"): True, ("wc", "split"): False, ("wc", "count"): False}
    seed = feed.seed(dict(asked))
    assert seed == {
        ("wc", "source"): OperatorSeed(kappa=0.002, source_rates=tuple(range(1, 13))),
        # Not a source: no rates; its last window executed nothing, so the kappa before.
        ("wc", "split"): OperatorSeed(kappa=0.003, source_rates=()),
    }
    assert seed[("wc", "split")].kappa == 0.003
    # Each operator is asked once; count has no history and gets no entry.
    assert feed.seed(asked) == {}
    feed.stop()


def test_seed_reads_a_bounded_number_of_new_operators_per_call(tmp_path):
    config = HistoryConfig.under(tmp_path)
    ops = [f"op{i:02d}" for i in range(SEED_PER_EPOCH + 4)]
    H.write_operator_table(config, [H.operator_window("wc", op, 0, 10.0) for op in ops])
    feed = HistoryFeed(config)
    asked = {("wc", op): False for op in ops}
    first = feed.seed(asked)
    assert sorted(first) == [("wc", op) for op in ops[:SEED_PER_EPOCH]]
    assert sorted(feed.seed(asked)) == [("wc", op) for op in ops[SEED_PER_EPOCH:]]
    assert feed.seed(asked) == {}
    feed.stop()


def test_spool_writes_on_a_background_thread_and_drops_when_writes_pile_up(tmp_path):
    registry = CollectorRegistry()
    feed = HistoryFeed(HistoryConfig.under(tmp_path), registry)
    release = threading.Event()
    write_slot = feed.writer.write_slot

    def slow_write_slot(*args):
        release.wait(10)
        return write_slot(*args)

    feed.writer.write_slot = slow_write_slot
    for slot in range(MAX_PENDING_WRITES + 1):
        instances, nodes = H.slot_samples(slot)
        feed.spool(slot + 1, H.T0 + H.SLOT_SECONDS * slot, instances, nodes, {"slot": slot})
    assert feed.writer.dropped_total == 1 and not feed.flush(0.05)
    release.set()
    assert feed.flush()
    files = sorted(feed.config.spool_dir.glob("slot-*.json"))
    assert len(files) == MAX_PENDING_WRITES
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [line["kind"] for line in lines].count("instance") == len(H.slot_samples(0)[0])
    assert json.loads(lines[-2]["decision"]) == {"slot": 0}
    before = time.time()
    status = feed.status()
    # No window yet: the history trails since the first slot spooled.
    assert status["spool_dropped"] == 1
    assert before - H.T0 <= status["lag_seconds"] <= time.time() - H.T0
    assert status["spool_bytes"] == sum(f.stat().st_size for f in files)
    assert registry.get_sample_value("dsched_history_spool_dropped_total") == 1
    assert registry.get_sample_value("dsched_history_spool_files") == MAX_PENDING_WRITES
    feed.stop()


def test_lag_counts_from_the_first_slot_spooled_until_a_window_is_readable(tmp_path):
    registry = CollectorRegistry()
    feed = HistoryFeed(HistoryConfig.under(tmp_path), registry)
    assert feed.lag_seconds() is None
    assert registry.get_sample_value("dsched_history_lag_seconds") is None
    first = time.time() - 30.0
    for slot in range(3):
        instances, nodes = H.slot_samples(slot)
        feed.spool(slot + 1, first + H.SLOT_SECONDS * slot, instances, nodes, None)
    assert feed.flush()
    # The job has written nothing: the gauge exists and grows from the first slot.
    lag = registry.get_sample_value("dsched_history_lag_seconds")
    assert 30.0 <= lag <= time.time() - first
    # Once a window is readable (the job's progress file names its end), its end
    # decides, not the first slot.
    end = time.time() - 5.0
    feed.config.progress_path.parent.mkdir(parents=True, exist_ok=True)
    feed.config.progress_path.write_text(json.dumps({"latest_window_end": end}))
    assert 5.0 <= feed.lag_seconds() <= time.time() - end
    feed.stop()
