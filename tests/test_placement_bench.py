"""``dsched bench placement``'s liu options: overrides, variants and bad input."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import placement as bench
from bench import placement_mips


def _args(tmp_path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # The smallest run that still goes through every strategy and scenario.
    return parser.parse_args(
        [
            "--json",
            str(tmp_path / "placement.json"),
            "--png",
            str(tmp_path / "placement.png"),
            "--epochs",
            "3",
            "--mips-samples",
            "4",
            "--budgets",
            "4",
            "--budget-seeds",
            "1",
            "--mips-paper-requests",
            "2",
            "--mips-paper-seeds",
            "1",
            "--mips-paper-budgets",
            "2",
            "4",
            "8",
            *extra,
        ]
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("scale_in_patience=3", ("scale_in_patience", 3)),
        ("stateful_growth=0.5", ("stateful_growth", 0.5)),
        (" scale_in = false ", ("scale_in", False)),
        ("name=abc", ("name", "abc")),
    ],
)
def test_option_values_read_as_numbers_and_bools(text, expected):
    assert bench.parse_option(text, "--liu-option") == expected


@pytest.mark.parametrize("text", ["scale_in_patience", "=3", "scale_in_patience="])
def test_malformed_option_names_the_flag(text):
    with pytest.raises(ValueError, match="--liu-option must look like KEY=VALUE"):
        bench.parse_option(text, "--liu-option")


def test_option_set_twice_is_refused():
    with pytest.raises(ValueError, match="sets scale_in_patience twice"):
        bench.parse_options(["scale_in_patience=3", "scale_in_patience=4"], "--liu-option")


def test_bad_liu_option_fails_before_any_run(tmp_path):
    with pytest.raises(ValueError, match="scale_in_patience"):
        bench.run(_args(tmp_path, "--liu-option", "scale_in_patience=0"))
    with pytest.raises(ValueError, match="no_such_option"):
        bench.run(_args(tmp_path, "--liu-variant", "no_such_option=1"))
    assert not (tmp_path / "placement.json").exists()


def test_liu_option_and_variants_are_run_and_recorded(tmp_path, capsys):
    args = _args(
        tmp_path,
        "--liu-option",
        "scale_in_patience=3",
        "--liu-variant",
        "scale_in_patience=30",
        "--liu-variant",
        "scale_in_patience=30,stateful_growth=0",
    )
    assert bench.run(args) == 0
    doc = json.loads((tmp_path / "placement.json").read_text())
    assert doc["strategy_options"]["liu"] == {
        "scale_in": True,
        "scale_in_patience": 3,
        "stateful_growth": 1.0,
    }
    variants = doc["liu_variants"]
    assert [v["overrides"] for v in variants] == [
        {"scale_in_patience": 30},
        {"scale_in_patience": 30, "stateful_growth": 0},
    ]
    assert variants[1]["options"]["stateful_growth"] == 0.0
    # A variant's sums are the sums of its scenarios, and match a direct run.
    for variant in variants:
        per = variant["per_scenario"]
        assert set(per) == set(bench.SCENARIOS)
        assert variant["figures"]["nodes_used"] == sum(f["nodes_used"] for f in per.values())
    states = bench.scenario_states(
        "shrinking", args.seed, args.epochs, peak_epochs=args.peak_epochs
    )
    direct = bench.run_strategy("liu", states, args.headroom, scale_in_patience=30)
    assert variants[0]["per_scenario"]["shrinking"]["nodes_used"] == direct["nodes_used"]
    assert isinstance(doc["liu_fewest_nodes_used_among_feasible"], bool)
    out = capsys.readouterr().out
    assert "liu with scale_in_patience=30:" in out
    # Seed 000's micro-DAG experiment rides along, with its figure beside the mips one.
    seed000 = doc["seed000"]
    for dag in ("linear", "diamond", "star"):
        rows = seed000["dags"][dag]["allocation"]
        assert all(r["mba_slots"] <= r["lsa_slots"] for r in rows)
        assert set(rows[0]["sustained_rate"]) == {"dsm", "rsm", "sam"}
    assert (tmp_path / "placement_seed000.png").exists()
    assert "seed 000 (model-driven scheduling)" in out


def test_mips_paper_section_has_every_figure_per_network_and_contender(tmp_path):
    assert bench.run(_args(tmp_path, "--liu-variant", "scale_in_patience=3")) == 0
    section = json.loads((tmp_path / "placement.json").read_text())["mips_paper"]
    assert set(section["topologies"]) == {"fat-tree", "jellyfish"}
    for block in section["topologies"].values():
        assert set(block["contenders"]) == {"mips", "ffd-bestfit", "r-heron", "t-heron"}
        for figs in block["contenders"].values():
            for key in (
                "cross_container_traffic",
                "containers",
                "cross_server_traffic_hops",
                "combined_cost",
                "plan_seconds",
            ):
                assert figs[key] >= 0, key
        assert block["mips_lowest_combined_cost"] == (
            block["contenders"]["mips"]["combined_cost"]
            < min(f["combined_cost"] for n, f in block["contenders"].items() if n != "mips")
        )
    curve = section["samples_curve"]
    assert [r["samples_per_decision"] for r in curve] == [2, 4, 8]
    assert section["samples_per_decision"] == section["converged_samples_per_decision"]
    assert section["converged_samples_per_decision"] in (2, 4, 8)


def test_mips_paper_converged_budget_and_flattening():
    curve = [
        {"samples_per_decision": b, "combined_cost": c}
        for b, c in ((8, 1.0), (16, 0.8), (32, 0.7), (64, 0.695), (128, 0.69))
    ]
    assert placement_mips.converged(curve) == 64  # 0.695 is within 1% of 0.69
    shape = placement_mips.flattening(curve)
    assert shape["flattens"] and shape["gain_first_half"] > shape["gain_second_half"]
    rising = [dict(r, combined_cost=r["samples_per_decision"] / 8) for r in curve]
    assert not placement_mips.flattening(rising)["flattens"]


def test_bad_mips_paper_options_fail_before_any_run(tmp_path):
    with pytest.raises(ValueError, match="--mips-paper-alpha"):
        bench.run(_args(tmp_path, "--mips-paper-alpha", "1.5"))
    with pytest.raises(ValueError, match="--mips-paper-samples"):
        bench.run(_args(tmp_path, "--mips-paper-samples", "0"))
    assert not (tmp_path / "placement.json").exists()


def test_seeds_sum_each_seeds_run(tmp_path):
    args = _args(tmp_path, "--seed", "4", "--seeds", "2", "--liu-variant", "scale_in_patience=3")
    assert bench.run(args) == 0
    doc = json.loads((tmp_path / "placement.json").read_text())
    assert [s["seeds"] for s in doc["scenarios"]] == [[4, 5]] * len(bench.SCENARIOS)
    for scenario in bench.SCENARIOS:
        for name, options in (("liu", {}), ("rstorm", {})):
            one_by_one = [
                bench.run_strategy(
                    name,
                    bench.scenario_states(
                        scenario, seed, args.epochs, peak_epochs=args.peak_epochs
                    ),
                    args.headroom,
                    **options,
                )
                for seed in (4, 5)
            ]
            figs = doc["per_scenario"][scenario][name]
            for key in ("affected_stateful_workers", "affected_workers", "nodes_used", "moves"):
                assert figs[key] == sum(r[key] for r in one_by_one), (scenario, name, key)
    variant = doc["liu_variants"][0]["per_scenario"]["random"]
    direct = [
        bench.run_strategy(
            "liu",
            bench.scenario_states("random", seed, args.epochs, peak_epochs=args.peak_epochs),
            args.headroom,
            scale_in_patience=3,
        )
        for seed in (4, 5)
    ]
    assert variant["affected_workers"] == sum(r["affected_workers"] for r in direct)


def test_peaks_are_the_highest_demand_over_the_last_epochs():
    for scenario in bench.SCENARIOS:
        flat = bench.scenario_states(scenario, 3, epochs=4)
        peaked = bench.scenario_states(scenario, 3, epochs=4, peak_epochs=5)
        # The epochs themselves do not depend on how much history is behind them.
        for a, b in zip(flat, peaked, strict=True):
            assert [i.demand_cores for i in a.instances] == [i.demand_cores for i in b.instances]
            assert all(i.peak_cores == i.demand_cores for i in a.instances)
        for e, state in enumerate(peaked):
            for inst in state.instances:
                assert inst.peak_demand_cores >= inst.demand_cores
                seen = [s.instance_map()[inst.id].demand_cores for s in peaked[: e + 1]]
                # Over the last 5 epochs, of which 4 - e come before epoch 0.
                assert inst.peak_demand_cores >= max(seen[-5:])
    # Random load has random history: some instance peaks above all it needs later.
    random_peaks = bench.scenario_states("random", 3, epochs=2, peak_epochs=30)
    assert any(
        i.peak_demand_cores > max(s.instance_map()[i.id].demand_cores for s in random_peaks)
        for i in random_peaks[0].instances
    )
    # Growing and shrinking load were steady before epoch 0.
    growing = bench.scenario_states("growing", 3, epochs=3, peak_epochs=30)
    assert all(i.peak_demand_cores == i.demand_cores for s in growing for i in s.instances)


def test_the_json_shows_liu_with_and_without_peaks(tmp_path):
    args = _args(tmp_path, "--peak-epochs", "4", "--liu-variant", "scale_in_patience=3")
    assert bench.run(args) == 0
    doc = json.loads((tmp_path / "placement.json").read_text())
    assert {s["peak_epochs"] for s in doc["scenarios"]} == {4}
    flat = doc["liu_demand_only"]["per_scenario"]["random"]
    direct = bench.run_strategy(
        "liu", bench.scenario_states("random", args.seed, args.epochs), args.headroom
    )
    assert flat["affected_workers"] == direct["affected_workers"]
    assert flat["nodes_used"] == direct["nodes_used"]


def test_peak_epochs_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--peak-epochs must be >= 1"):
        bench.run(_args(tmp_path, "--peak-epochs", "0"))
    with pytest.raises(ValueError, match="peak_epochs must be >= 1"):
        bench.scenario_states("random", 1, peak_epochs=0)
    assert not (tmp_path / "placement.json").exists()


def test_seeds_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        bench.run(_args(tmp_path, "--seeds", "0"))
    assert not (tmp_path / "placement.json").exists()


def test_the_command_line_reports_bad_arguments_without_a_traceback(tmp_path, capsys):
    from dsched.cli import main

    out = tmp_path / "placement.json"
    with pytest.raises(SystemExit) as exited:
        main(["bench", "placement", "--seeds", "0", "--json", str(out)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == "dsched: error: --seeds must be >= 1, got 0"
    assert not out.exists()
