"""Controller config: QoS classes, strategy names, node capacity; bad values name the key."""

from __future__ import annotations

import pytest

from controller.config import ControllerConfig
from controller.daemon import main as controller_main
from dsched.config import ConfigError, load_config

BAD = [
    ("[qos.classes.gold]\ntarget_latency_ms = -5\n", "qos.classes.gold.target_latency_ms"),
    ("[qos.classes.gold]\nweight = 0\n", "qos.classes.gold.weight"),
    ("[qos.classes.gold]\nmax_violation_ratio = 1.0\n", "qos.classes.gold.max_violation_ratio"),
    ("[qos.classes.gold]\nmax_violation_ratio = 0\n", "qos.classes.gold.max_violation_ratio"),
    ("[qos.classes.gold]\ntarget_ms = 5\n", "qos.classes.gold.target_ms"),
    ('[qos]\ncolour = "red"\n', "qos.colour"),
    ('[qos]\ndefault_class = "platinum"\n', "qos.default_class"),
    ('allocator = "fifo"\n', "allocator"),
    ('placement = "random"\n', "placement"),
    ('dp_value = "money"\n', "dp_value"),
    ("scale_in_wait_seconds = -1\n", "scale_in_wait_seconds"),
    ("scale_in_wait_seconds = nan\n", "scale_in_wait_seconds"),
    ("scale_in_wait_stateless_seconds = -1\n", "scale_in_wait_stateless_seconds"),
    ("scale_in_wait_stateless_seconds = inf\n", "scale_in_wait_stateless_seconds"),
    ("scale_in_wait_stateless_seconds = true\n", "scale_in_wait_stateless_seconds"),
    ('scale_in_wait_stateless_seconds = "10"\n', "scale_in_wait_stateless_seconds"),
    ("placement_demand_seconds = -0.5\n", "placement_demand_seconds"),
    ("placement_demand_seconds = nan\n", "placement_demand_seconds"),
    ("placement_demand_seconds = false\n", "placement_demand_seconds"),
    ("placement_demand_seconds = inf\n", "placement_demand_seconds"),
    ('placement_demand_seconds = "10"\n', "placement_demand_seconds"),
    ("placement_demand_seconds = 1e20\n", "placement_demand_seconds"),
    ("placement_rise_seconds = -2\n", "placement_rise_seconds"),
    ("placement_rise_seconds = nan\n", "placement_rise_seconds"),
    ('placement_rise_seconds = "2"\n', "placement_rise_seconds"),
    ("placement_rise_seconds = 1e20\n", "placement_rise_seconds"),
    # Without a longer mean, a rise window changes nothing.
    ("placement_rise_seconds = 2\n", "placement_rise_seconds"),
    ("placement_demand_seconds = 2\nplacement_rise_seconds = 2\n", "placement_rise_seconds"),
    ("placement_min_relief_cores = -0.02\n", "placement_min_relief_cores"),
    ("placement_min_relief_cores = nan\n", "placement_min_relief_cores"),
    ("placement_min_relief_cores = inf\n", "placement_min_relief_cores"),
    ("placement_min_relief_cores = true\n", "placement_min_relief_cores"),
    ('placement_min_relief_cores = "0.02"\n', "placement_min_relief_cores"),
    ("stateful_peak_seconds = 1e20\n", "stateful_peak_seconds"),
    ("scale_in_wait_stateless_seconds = nan\n", "scale_in_wait_stateless_seconds"),
    ("stateful_peak_seconds = -1\n", "stateful_peak_seconds"),
    ("stateful_peak_seconds = nan\n", "stateful_peak_seconds"),
    ("stateful_peak_seconds = inf\n", "stateful_peak_seconds"),
    ("node_cost = -1\n", "node_cost"),
    ("[node_capacity_cores]\nn1 = 0\n", "node_capacity_cores.n1"),
    ('allocater = "qos-dp"\n', "allocater"),
    ('predictors = ["linear_trend", "crystal_ball"]\n', "predictors[1]"),
    ("predictors = []\n", "predictors"),
    ('cap_actuator = "ssh"\n', "cap_actuator"),
    ('move_actuator = "kubectl"\n', "move_actuator"),
    ("[placement_options.mips]\nsamples_per_decision = 0\n", "placement_options.mips"),
    # The key before samples were counted per decision: unknown, named.
    ("[placement_options.mips]\nsamples = 256\n", "placement_options.mips.samples"),
    ("[placement_options.liu]\nstateful_growth = -1\n", "placement_options.liu"),
    ("[placement_options.mips]\nsampels = 5\n", "placement_options.mips.sampels"),
    ("max_instance_cores = 0\n", "max_instance_cores"),
    ("max_clock_skew_seconds = -1\n", "max_clock_skew_seconds"),
    ("decisions_kept = 0\n", "decisions_kept"),
    ("arima_fits_per_epoch = -1\n", "arima_fits_per_epoch"),
    ("move_timeout_seconds = 0\n", "move_timeout_seconds"),
    ('kappa_estimator = "median"\n', "kappa_estimator"),
    ('flow_bound = "maybe"\n', "flow_bound"),
    ("forecast_median = true\n", "forecast_median"),
    ('forecast_median = "yes"\n', "forecast_median"),
]


@pytest.mark.parametrize(("toml", "key"), BAD)
def test_bad_config_names_the_key(tmp_path, toml, key):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(ControllerConfig, path)
    assert err.value.key == key


def test_bad_config_fails_the_daemon_at_startup(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(f'state_dir = "{tmp_path}"\n[qos.classes.gold]\nweight = 0\n')
    assert controller_main(["--config", str(path)]) == 2
    assert "qos.classes.gold.weight" in capsys.readouterr().err


def test_defaults_are_qos_dp_liu_and_three_classes():
    cfg = load_config(ControllerConfig, None)
    assert cfg.allocator == "qos-dp" and cfg.placement == "liu"
    assert set(cfg.qos.classes) == {"gold", "silver", "bronze"}
    gold, bronze = cfg.qos.classes["gold"], cfg.qos.classes["bronze"]
    assert gold.weight > cfg.qos.classes["silver"].weight > bronze.weight
    assert gold.target_latency_ms < bronze.target_latency_ms


def test_classes_and_capacity_from_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'allocator = "demand"\nplacement = "none"\n'
        '[qos]\ndefault_class = "batch"\n'
        "[qos.classes.rt]\ntarget_latency_ms = 20\nmax_violation_ratio = 0.05\nweight = 10\n"
        "[qos.classes.batch]\ntarget_latency_ms = 5000\nmax_violation_ratio = 0.5\nweight = 1\n"
        "[node_capacity_cores]\nlocal = 1.0\n"
    )
    cfg = load_config(ControllerConfig, path)
    assert set(cfg.qos.classes) == {"rt", "batch"}
    assert cfg.qos.classes["rt"].weight == 10.0
    assert cfg.node_capacity_cores == {"local": 1.0}
    assert (cfg.allocator, cfg.placement) == ("demand", "none")


@pytest.mark.parametrize(
    "key",
    [
        "scale_in_wait_seconds",
        "scale_in_wait_stateless_seconds",
        "placement_demand_seconds",
        "placement_rise_seconds",
        "stateful_peak_seconds",
    ],
)
@pytest.mark.parametrize("bad", [True, "10", None, -1.0, float("nan")])
def test_a_window_in_seconds_built_in_code_is_checked_too(key, bad):
    # Not only what TOML can say: a config built in code is validated the same way.
    with pytest.raises(ConfigError) as err:
        ControllerConfig(**{key: bad}).validate()
    assert err.value.key == key
