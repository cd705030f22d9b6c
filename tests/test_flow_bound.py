"""The flow bound: no operator is granted more than its parents can send it.

Views, forecasts and demands come from a real controller fed WordCount-shaped
counters (tests/test_controller_epoch.py's synthetic node); only the grants are
set by hand, to the cases the bound must handle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.core import Controller
from controller.model import OperatorKey
from controller.stages.allocation import AppAllocation, QosAllocation
from controller.stages.demand import InstanceDemand, instance_demands
from controller.stages.flow import bound_by_parents
from controller.stages.forecast import forecast
from tests.test_controller_epoch import SyntheticNode, config, run, views_after


@pytest.fixture
def wordcount(tmp_path):
    """Views, forecasts and demands of one WordCount app at 200 lines/s."""
    c, views = views_after(tmp_path, 6, {"wc": 200.0})
    forecasts = forecast(views, 5).forecasts
    demands = instance_demands(views, forecasts, None, 1.0, 1.0, 0.01)
    c.stop()
    return views, forecasts, demands


def _key(demands, op):
    return next(k for k in demands if k.operator == op)


def _grants(demands, **scale):
    """The demands granted whole, except the operators named, granted that share."""
    cores = {k: d.cores * scale.get(k.operator, 1.0) for k, d in demands.items()}
    alloc = QosAllocation(cores)
    alloc.apps["wc"] = AppAllocation("wc", "bronze", 1.0, 0.0, 0.0, 0, sum(cores.values()), 0.0)
    return alloc


def test_a_cut_source_bounds_its_children_and_the_cpu_taken_back_is_a_cut(wordcount):
    views, forecasts, demands = wordcount
    alloc = _grants(demands, source=0.5)
    before = dict(alloc.cores)
    taken = bound_by_parents(alloc, demands, views, forecasts, 0.01)
    src, split, count = (_key(demands, op) for op in ("source", "split", "count"))
    # The source sends at most half its forecast: split is granted half its demand,
    # and count half of its own, since split is now bounded to half.
    inflow = alloc.cores[src] / forecasts[OperatorKey("wc", "source")].kappa
    rate = forecasts[OperatorKey("wc", "split")].demand_rate
    assert inflow / rate == pytest.approx(0.5, rel=0.05)
    assert alloc.cores[split] == pytest.approx(demands[split].cores * inflow / rate)
    assert alloc.cores[count] < 0.6 * demands[count].cores
    assert src not in taken and alloc.cores[src] == before[src]
    for k in (split, count):
        assert taken[k] == pytest.approx(before[k] - alloc.cores[k])
        assert alloc.cut[k] == pytest.approx(taken[k])
        assert alloc.cut_reason[k].startswith("flow ")
        assert "parents send at most" in alloc.cut_reason[k]
    assert alloc.apps["wc"].allocated_cores == pytest.approx(sum(alloc.cores.values()))
    assert alloc.apps["wc"].cut_cores == pytest.approx(sum(taken.values()))


def test_parents_granted_their_demand_bound_nothing(wordcount):
    views, forecasts, demands = wordcount
    alloc = _grants(demands)
    assert bound_by_parents(alloc, demands, views, forecasts, 0.01) == {}
    assert alloc.cores == {k: d.cores for k, d in demands.items()}
    assert alloc.cut == {}


def test_a_grant_is_never_raised_and_the_backlog_drain_and_floor_are_kept(wordcount):
    views, forecasts, demands = wordcount
    split = _key(demands, "split")
    d = demands[split]
    # A queue already there is drained whatever the parents send next slot.
    backlog = dict(demands)
    backlog[split] = InstanceDemand(split, d.node, d.cores + 0.2, "backlog", 0.2)
    alloc = _grants(backlog, source=0.25)
    bound_by_parents(alloc, backlog, views, forecasts, 0.01)
    share = alloc.cores[_key(demands, "source")] / forecasts[OperatorKey("wc", "source")].kappa
    share /= forecasts[OperatorKey("wc", "split")].demand_rate
    assert share == pytest.approx(0.25, rel=0.05)
    assert alloc.cores[split] == pytest.approx(d.cores * share + 0.2)
    # A source cut to nothing leaves its children at the floor, not below it.
    alloc = _grants(demands, source=0.0, split=0.001)
    bound_by_parents(alloc, demands, views, forecasts, 0.05)
    count = _key(demands, "count")
    assert alloc.cores[count] == pytest.approx(0.05)
    # ...and a grant below the floor is not raised to it.
    assert alloc.cores[split] == pytest.approx(0.001 * demands[split].cores)


def test_a_parent_of_unknown_cost_or_without_a_grant_bounds_nothing(wordcount):
    views, forecasts, demands = wordcount
    src_key = OperatorKey("wc", "source")
    unknown = dict(forecasts)
    unknown[src_key] = replace(forecasts[src_key], kappa=0.0)
    alloc = _grants(demands, source=0.5)
    taken = bound_by_parents(alloc, demands, views, unknown, 0.01)
    assert _key(demands, "split") not in taken
    # A held source instance (its cap is not a grant): split keeps its grant.
    alloc = _grants(demands, source=0.5)
    del alloc.cores[_key(demands, "source")]
    taken = bound_by_parents(alloc, demands, views, forecasts, 0.01)
    assert _key(demands, "split") not in taken


def test_the_controller_bounds_by_default_and_records_why(tmp_path):
    """Split's counters jump (a burst it worked through) while the source runs
    steady: split's trend forecasts more than the source can send under its grant.
    With the bound (the default) split, and count below it, keep only what their
    parents can feed, and the record says why; with it off, they keep the
    division's grants."""
    grants = {}
    for setting in ("on", "off"):
        clock = [1_000_000.0]
        c = Controller(
            config(tmp_path / setting, flow_bound=setting, theta_cores=0.005),
            clock=lambda clock=clock: clock[0],
        )
        node = SyntheticNode(c)
        run(c, node, clock, 5, {"wc": 200.0})
        burst = node.totals[("wc", "split")]
        burst["n"] += 600
        burst["cpu"] += 600 * 0.001
        rec = run(c, node, clock, 1, {"wc": 200.0})
        c.stop()
        split = next(i for i in rec["instances"] if i["operator"] == "split")
        grants[setting] = split["allocated_cores"]
        flow = [x for x in rec["cuts"] if "parents send at most" in x["reason"]]
        # Count's forecast follows split's along the DAG: the bound carries down.
        want = ["count", "split"] if setting == "on" else []
        assert sorted(x["operator"] for x in flow) == want
    assert grants["on"] < 0.8 * grants["off"]


def test_a_parent_sends_no_more_than_reaches_it_plus_its_queue(wordcount):
    """A source granted twice its demand still sends only what arrives at it, plus
    its queue drained: a split forecast at 1.5x that is sized for what comes."""
    views, forecasts, demands = wordcount
    src_key, split_key = OperatorKey("wc", "source"), OperatorKey("wc", "split")
    src, split = _key(demands, "source"), _key(demands, "split")
    ahead = dict(forecasts)
    ahead[split_key] = replace(forecasts[split_key], rate=1.5 * forecasts[src_key].demand_rate)
    sends = forecasts[src_key].demand_rate * forecasts[src_key].selectivity
    alloc = _grants(demands, source=2.0)
    bound_by_parents(alloc, demands, views, ahead, 0.01)
    assert alloc.cores[split] == pytest.approx(demands[split].cores * sends / ahead[split_key].rate)
    # With a queue at the source, its drain is sent too.
    d = demands[src]
    drain = dict(demands)
    drain[src] = InstanceDemand(src, d.node, d.cores + 0.005, "backlog", 0.005)
    alloc = _grants(drain, source=2.0)
    bound_by_parents(alloc, drain, views, ahead, 0.01)
    kappa = forecasts[src_key].kappa
    more = (forecasts[src_key].demand_rate + 0.005 / kappa) * forecasts[src_key].selectivity
    assert more < ahead[split_key].rate
    assert alloc.cores[split] == pytest.approx(demands[split].cores * more / ahead[split_key].rate)


def test_a_parent_whose_forecast_collapses_for_a_slot_still_sends_its_window_rate(wordcount):
    """A slot whose counters were read late shows no arrivals at the source, and
    its forecast falls to next to nothing: the source still sends what it
    processed over the window, so split below it is not starved."""
    views, forecasts, demands = wordcount
    src_key = OperatorKey("wc", "source")
    glitch = dict(forecasts)
    glitch[src_key] = replace(forecasts[src_key], rate=0.01 * forecasts[src_key].demand_rate)
    alloc = _grants(demands)
    taken = bound_by_parents(alloc, demands, views, glitch, 0.01)
    assert _key(demands, "split") not in taken
    assert alloc.cores == {k: d.cores for k, d in demands.items()}
