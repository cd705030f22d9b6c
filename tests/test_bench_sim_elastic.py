"""``dsched bench sim --scenario elastic --runs N``: the comparison on N seeds,
contenders' figures averaged, each seed's rows kept."""

from __future__ import annotations

import argparse

import pytest

from bench.sim_elastic import over_seeds, run_elastic


def test_several_seeds_average_the_figures_and_keep_each_run():
    args = argparse.Namespace(
        epochs=4, seed=1, step=0.1, policies="dsched-fixed,util-scaler", runs=2
    )
    doc = run_elastic(args)
    assert doc["seeds"] == [1, 2]
    for row in doc["contenders"].values():
        runs = row["runs"]
        assert [r["seed"] for r in runs] == [1, 2]
        for key in ("gold_violation_ratio", "node_epochs", "cpu_used_core_seconds"):
            assert row[key] == pytest.approx(sum(r[key] for r in runs) / 2)
        assert row["gold_violation_ratio_max"] == max(r["gold_violation_ratio"] for r in runs)
    # The two seeds are two different runs (arrivals drawn afresh).
    fixed = doc["contenders"]["dsched-fixed"]["runs"]
    assert fixed[0]["cpu_used_core_seconds"] != fixed[1]["cpu_used_core_seconds"]
    assert "node_epochs_vs_util_scaler" not in doc["targets"]  # no dsched contender
    assert doc["targets"]["fixed_gold_beyond_bound"] in (True, False)


def test_over_seeds_of_one_run_is_that_run():
    row = {
        "gold_violation_ratio": 0.02,
        "node_epochs": 10,
        "cpu_used_core_seconds": 5.0,
        "gold_bound": 0.01,
    }
    out = over_seeds([row], [7])
    assert out["gold_violation_ratio"] == 0.02 and out["gold_violation_ratio_max"] == 0.02
    assert out["node_epochs"] == 10 and out["runs"] == [{"seed": 7, **row}]
