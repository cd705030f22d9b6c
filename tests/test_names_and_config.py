"""Name checks that guard the cgroup tree, and the TOML loader's errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.config import ControllerConfig
from dsched.config import ConfigError, from_dict, load_config
from dsched.names import InvalidName, check_name


@pytest.mark.parametrize(
    "bad", ["", "..", "a/../b", "a/b", "x\x00y", "../etc", ".hidden", "a b", "x" * 200, "a\\b"]
)
def test_unsafe_names_are_refused(bad):
    with pytest.raises(InvalidName):
        check_name("app", bad)


@pytest.mark.parametrize("good", ["wordcount", "app-1", "op_2", "kafka.reader", "a:b@c+d=e"])
def test_ordinary_names_pass(good):
    assert check_name("app", good) == good


@dataclass
class _Inner:
    weight: float = 1.0

    def validate(self):
        if self.weight <= 0:
            raise ConfigError("weight", "must be positive")


@dataclass
class _Outer:
    name: str = "x"
    period: int = 10
    inner: _Inner = field(default_factory=_Inner)
    classes: dict[str, _Inner] = field(default_factory=dict)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError) as e:
        from_dict(_Outer, {"nmae": "y"})
    assert e.value.key == "nmae" and "unknown key" in str(e.value)


def test_nested_unknown_key_is_named_with_its_table():
    with pytest.raises(ConfigError) as e:
        from_dict(_Outer, {"inner": {"wieght": 2}})
    assert e.value.key == "inner.wieght"


def test_nested_validation_names_the_full_key():
    with pytest.raises(ConfigError) as e:
        from_dict(_Outer, {"classes": {"gold": {"weight": 0}}})
    assert e.value.key == "classes.gold.weight"


def test_wrong_type_is_named():
    with pytest.raises(ConfigError) as e:
        from_dict(_Outer, {"period": "ten"})
    assert e.value.key == "period" and "integer" in str(e.value)


def test_bad_toml_and_missing_file(tmp_path: Path):
    p = tmp_path / "c.toml"
    p.write_text("listen = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(ControllerConfig, p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(ControllerConfig, tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "data,key",
    [
        ({"slot_seconds": -1}, "slot_seconds"),
        ({"theta_cores": 0}, "theta_cores"),
        ({"phi": 1}, "phi"),
        ({"mode": "sometimes"}, "mode"),
        ({"listen": "nohost"}, "listen"),
        ({"listen": "0.0.0.0:7700"}, "tls.cert"),  # off loopback without mutual TLS
    ],
)
def test_controller_config_refuses_impossible_values(data, key):
    with pytest.raises(ConfigError) as e:
        from_dict(ControllerConfig, data)
    assert e.value.key == key


def test_plaintext_remote_can_be_allowed_explicitly():
    cfg = from_dict(ControllerConfig, {"listen": "0.0.0.0:7700", "allow_plaintext_remote": True})
    assert cfg.listen == "0.0.0.0:7700"
