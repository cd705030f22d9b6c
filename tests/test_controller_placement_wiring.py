"""Placement as step 7 of the epoch: planned when a node overflows, recorded, moved
only by the configured actuator in enforce mode."""

from __future__ import annotations

import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from controller.placement.migration import MoveResult
from dsched.config import ConfigError, from_dict
from testbed.demo import placement_figure
from tests.test_controller_epoch import SyntheticNode, config, run


@pytest.fixture
def clock():
    return [2_000_000.0]


def _overloaded(tmp_path, clock, **kw):
    c = Controller(
        config(tmp_path, node_capacity_cores={"n1": 0.5, "n2": 2.0}, **kw), clock=lambda: clock[0]
    )
    busy = SyntheticNode(c, "n1", cores=2.0)
    idle = SyntheticNode(c, "n2", cores=2.0)
    for _ in range(6):
        clock[0] += 1.0
        busy.report(clock[0], {"wc": 300})
        idle.report(clock[0], {})
        rec = c.run_epoch()
        # Planning runs on its own thread; its result shows in the next record.
        assert c.wait_placement(timeout=30)
    return c, rec


def test_an_overloaded_node_gets_a_plan_that_is_only_logged_in_dry_run(tmp_path, clock):
    c, rec = _overloaded(tmp_path, clock)
    p = rec["placement"]
    assert p["planned"] is True and p["strategy"] == "liu" and p["epoch"] < rec["epoch"]
    assert p["moves"] and all(m["from_node"] == "n1" and m["to_node"] == "n2" for m in p["moves"])
    assert p["affected_workers"] >= 1
    assert p["actuator"] == "log-only"  # dry-run never moves anything


@pytest.mark.parametrize(
    ("slot_seconds", "wait_seconds", "plans"),
    [(10.0, 300.0, 30), (2.0, 300.0, 150), (3.0, 10.0, 4), (1.0, 0.0, 1)],
)
def test_liu_waits_the_configured_seconds_in_plans_of_the_slot(
    tmp_path, clock, slot_seconds, wait_seconds, plans
):
    c = Controller(
        config(tmp_path, slot_seconds=slot_seconds, scale_in_wait_seconds=wait_seconds),
        clock=lambda: clock[0],
    )
    assert c.placement.strategy.name == "liu" and c.placement.strategy.scale_in_patience == plans
    c.stop()


@pytest.mark.parametrize(
    ("slot_seconds", "wait_seconds", "plans"),
    [(10.0, 0.0, 1), (0.5, 10.0, 20), (3.0, 10.0, 4)],
)
def test_liu_waits_the_configured_stateless_seconds_in_plans_of_the_slot(
    tmp_path, clock, slot_seconds, wait_seconds, plans
):
    c = Controller(
        config(tmp_path, slot_seconds=slot_seconds, scale_in_wait_stateless_seconds=wait_seconds),
        clock=lambda: clock[0],
    )
    assert c.placement.strategy.stateless_scale_in_patience == plans
    c.stop()


def test_strategies_that_do_not_wait_are_built_without_a_wait(tmp_path, clock):
    c = Controller(config(tmp_path, placement="rstorm"), clock=lambda: clock[0])
    assert c.placement.strategy.name == "rstorm"
    c.stop()


def test_no_placement_when_configured_off(tmp_path, clock):
    _, rec = _overloaded(tmp_path, clock, placement="none")
    assert rec["placement"]["planned"] is False


def test_nothing_to_plan_on_a_node_with_room(tmp_path, clock):
    c = Controller(config(tmp_path, placement="liu"), clock=lambda: clock[0])
    node = SyntheticNode(c)
    for _ in range(5):
        rec = run(c, node, clock, 1, {"wc": 20})
        assert c.wait_placement(timeout=30)
        assert rec["placement"]["planned"] is False


@pytest.mark.parametrize(
    "data,key",
    [({"move_actuator": "teleport"}, "move_actuator"), ({"move_actuator": "testbed"}, "move_url")],
)
def test_move_actuator_config_is_checked(data, key):
    with pytest.raises(ConfigError) as e:
        from_dict(ControllerConfig, data)
    assert e.value.key == key


class _ReportsDone:
    """A move actuator that says every planned move was carried out; what the agents
    report does not change unless the test changes it."""

    name = "testbed"

    def __init__(self) -> None:
        self.plans = []

    def execute(self, plan):
        self.plans.append(plan)
        return MoveResult(
            self.name,
            True,
            moved=[m.instance for m in plan.moves],
            affected_workers=list(plan.affected_workers),
        )


def _first_move(tmp_path, clock):
    c = Controller(
        config(
            tmp_path,
            mode="enforce",
            node_capacity_cores={"n1": 0.5, "n2": 2.0},
            forget_after_slots=4,
        ),
        clock=lambda: clock[0],
    )
    mover = c.placement.mover = _ReportsDone()
    busy, idle = SyntheticNode(c, "n1", cores=2.0), SyntheticNode(c, "n2", cores=2.0)

    def epoch(on_n1: dict, on_n2: dict) -> dict:
        clock[0] += 1.0
        busy.report(clock[0], on_n1)
        idle.report(clock[0], on_n2)
        rec = c.run_epoch()
        assert c.wait_placement(timeout=30)
        return rec

    for _ in range(8):
        epoch({"wc": 300}, {})
        if mover.plans:
            break
    assert len(mover.plans) == 1, "n1 never overloaded"
    return c, mover, epoch, (busy, idle)


def test_no_plan_repeats_moves_the_agents_have_not_reported_yet(tmp_path, clock):
    c, mover, epoch, _ = _first_move(tmp_path, clock)
    moved = sorted(m.instance for m in mover.plans[0].moves)
    # n1 still reports everything (the reports lag the move): no plan from that view.
    for _ in range(4):
        rec = epoch({"wc": 300}, {})
        assert len(mover.plans) == 1
        assert rec["placement"]["awaiting_moved"] == moved
    # After forget_after_slots epochs without the instances on their new node,
    # the reports are believed and planning resumes.
    epoch({"wc": 300}, {})
    epoch({"wc": 300}, {})
    assert len(mover.plans) == 2


def test_planning_resumes_once_moved_instances_report_from_their_new_node(tmp_path, clock):
    c, mover, epoch, (busy, idle) = _first_move(tmp_path, clock)
    # Every instance now reports from n2, which has room; its counters carry on.
    idle.totals = busy.totals
    rec = epoch({}, {"wc": 300})
    assert "awaiting_moved" not in rec["placement"]
    assert c.placement.settling == {}
    assert len(mover.plans) == 1


def test_the_demo_placement_figure_reads_plans_from_the_decision_records(tmp_path, clock):
    c, rec = _overloaded(tmp_path, clock)
    figure = placement_figure(c.store.decisions(100))
    last = figure["plans"][-1]
    assert last["reported_in_epoch"] == rec["epoch"]
    assert last["planned_in_epoch"] == rec["placement"]["epoch"] < rec["epoch"]
    assert last["affected_workers"] == rec["placement"]["affected_workers"] >= 1
    assert last["actuator"] == "log-only" and last["moves"] == rec["placement"]["moves"]
    assert figure["affected_workers"] == sum(p["affected_workers"] for p in figure["plans"])
    assert figure["moves"] >= len(last["moves"])
    # Records without a finished plan add nothing.
    assert placement_figure([{"epoch": 1, "placement": {"planned": False}}])["plans"] == []


def _peak_epochs(tmp_path, clock, **kw) -> list[dict]:
    """Records of a run where wc's load first is high, then falls, and wd's rises
    then falls, on a node with room for all of it."""
    c = Controller(config(tmp_path, node_capacity_cores={"n1": 2.0}, **kw), clock=lambda: clock[0])
    node = SyntheticNode(c, cores=2.0)
    wc = [300, 300, 300, 200, 120, 30, 30, 30, 30, 30, 30]
    wd = [30, 30, 150, 250, 250, 100, 30, 30, 30, 30, 30]
    records = []
    for a, b in zip(wc, wd, strict=True):
        records.append(run(c, node, clock, 1, {"wc": a, "wd": b}))
        assert c.wait_placement(timeout=30)
    c.stop()
    return records


def test_rows_carry_the_peak_demand_over_the_last_stateful_peak_seconds(tmp_path, clock):
    # 3 s at a 1-s slot: a window of 3 epochs, over 11 epochs it slides.
    window = 3
    records = _peak_epochs(tmp_path, clock, slot_seconds=1.0, stateful_peak_seconds=3.0)

    def rows(rec):
        return {f"{r['app']}/{r['operator']}/{r['instance']}": r for r in rec["instances"]}

    ids = set(rows(records[-1]))
    assert len(ids) == 6
    # Every instance is in every record from the first that has any (the first
    # report gives no rates yet), so each window is a run of consecutive epochs.
    first = next(k for k, rec in enumerate(records) if rec["instances"])
    assert first <= 1
    assert all(set(rows(rec)) == ids for rec in records[first:])
    slid = 0
    for k in range(first, len(records)):
        history = [rows(r) for r in records[max(first, k - window + 1) : k + 1]]
        for iid, row in rows(records[k]).items():
            expected = max(h[iid]["demand_cores"] - h[iid]["backlog_cores"] for h in history)
            assert row["peak_demand_cores"] == expected, (k, iid)
            all_time = max(rows(r)[iid]["demand_cores"] for r in records[first : k + 1])
            slid += expected < all_time
    # Load fell: peaks above the demand now, and high values that dropped out.
    assert any(r["peak_demand_cores"] > r["demand_cores"] for r in records[6]["instances"])
    assert slid > 0
    assert all(r["peak_demand_cores"] == r["demand_cores"] for r in records[-1]["instances"])


def test_rows_carry_no_peak_without_placement(tmp_path, clock):
    records = _peak_epochs(tmp_path, clock, placement="none", stateful_peak_seconds=3.0)
    assert records[-1]["instances"]
    assert not any("peak_demand_cores" in r for rec in records for r in rec["instances"])


def test_rows_carry_the_demand_placement_judges_averaged_over_its_seconds(tmp_path, clock):
    window = 3
    records = _peak_epochs(tmp_path, clock, slot_seconds=1.0, placement_demand_seconds=3.0)

    def rows(rec):
        return {f"{r['app']}/{r['operator']}/{r['instance']}": r for r in rec["instances"]}

    first = next(k for k, rec in enumerate(records) if rec["instances"])
    for k in range(first, len(records)):
        history = [rows(r) for r in records[max(first, k - window + 1) : k + 1]]
        for iid, row in rows(records[k]).items():
            expected = sum(h[iid]["demand_cores"] - h[iid]["backlog_cores"] for h in history) / len(
                history
            )
            assert row["placement_demand_cores"] == pytest.approx(expected), (k, iid)


def _spike(
    tmp_path,
    clock,
    placement_demand_seconds: float,
    rates=(60, 60, 60, 60, 300, 60, 60),
    placement_rise_seconds: float = 0.0,
    **options,
) -> list[dict]:
    """n1 (0.5 cores) is over its room for one epoch of six; n2 is idle."""
    c = Controller(
        config(
            tmp_path,
            node_capacity_cores={"n1": 0.5, "n2": 2.0},
            placement_demand_seconds=placement_demand_seconds,
            placement_rise_seconds=placement_rise_seconds,
            **options,
        ),
        clock=lambda: clock[0],
    )
    busy = SyntheticNode(c, "n1", cores=2.0)
    idle = SyntheticNode(c, "n2", cores=2.0)
    records = []
    for rate in rates:
        clock[0] += 1.0
        busy.report(clock[0], {"wc": rate})
        idle.report(clock[0], {})
        records.append(c.run_epoch())
        assert c.wait_placement(timeout=30)
    c.stop()
    return records


def test_a_node_over_its_room_for_one_epoch_moves_nothing_when_placement_averages(tmp_path, clock):
    # Judged by the demand now, the spike gets a plan...
    now = _spike(tmp_path / "now", clock, 0.0)
    assert any(r["placement"].get("planned") for r in now)
    # ...averaged over five 1-s epochs it is fitted by the allocator and nothing moves.
    averaged = _spike(tmp_path / "avg", clock, 5.0)
    assert not any(r["placement"].get("planned") for r in averaged)
    spike = averaged[4]["instances"]
    assert sum(r["demand_cores"] for r in spike) > 0.4  # over n1's room (0.5 - 0.1)
    assert sum(r["placement_demand_cores"] for r in spike) < 0.4


def test_a_rise_is_planned_by_the_short_mean_before_the_long_mean_sees_it(tmp_path, clock):
    # n1 (room 0.4 core) goes over its room for good after ten quiet epochs.
    ramp = (60,) * 10 + (200,) * 5

    def first_plan(records):
        return next((k for k, r in enumerate(records) if r["placement"].get("planned")), None)

    def judged(record):
        return sum(r["placement_demand_cores"] for r in record["instances"])

    # A 10-s mean has not seen the rise five epochs into it: n1's caps are cut.
    mean = _spike(tmp_path / "mean", clock, 10.0, ramp)
    assert first_plan(mean) is None
    # The mean over the last three 1-s epochs sees it in the second.
    rise = _spike(tmp_path / "rise", clock, 10.0, ramp, placement_rise_seconds=3.0)
    assert judged(rise[11]) > 0.4 > judged(mean[11])
    assert first_plan(rise) == 12
    # Where the load is flat, both judge the long mean.
    for k in range(1, 10):
        assert judged(rise[k]) == pytest.approx(judged(mean[k])), k


def test_a_spike_under_the_room_over_the_short_mean_moves_nothing(tmp_path, clock):
    # One epoch over n1's room (0.43 core against 0.4): the demand now plans...
    spike = (60, 60, 60, 60, 150, 60, 60)
    assert any(r["placement"].get("planned") for r in _spike(tmp_path / "now", clock, 0.0, spike))
    # ...a mean over three epochs sees a third of it, and nothing moves.
    short = _spike(tmp_path / "rise", clock, 10.0, spike, placement_rise_seconds=3.0)
    assert not any(r["placement"].get("planned") for r in short)
    assert sum(r["demand_cores"] for r in short[4]["instances"]) > 0.4


def test_an_overflow_that_relieves_less_than_the_floor_per_move_moves_nothing(tmp_path, clock):
    # n1 is over its room (0.4 core) by a few hundredths of a core for good.
    small = (60,) * 4 + (150,) * 4

    def planned(records):
        return [r["placement"] for r in records if r["placement"].get("planned")]

    assert planned(_spike(tmp_path / "any", clock, 0.0, small))
    floored = _spike(tmp_path / "floor", clock, 0.0, small, placement_min_relief_cores=0.2)
    assert not planned(floored)
    over = sum(r["placement_demand_cores"] for r in floored[-1]["instances"]) - 0.4
    assert 0.0 < over < 0.2
    # An overflow of several times the floor still gets its plan.
    big = _spike(
        tmp_path / "big", clock, 0.0, (60,) * 4 + (300,) * 4, placement_min_relief_cores=0.2
    )
    assert planned(big)
