"""The config schema: the generated reference is current, every key is documented,
strategies are chosen by name through one registry, per-strategy options are typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import ControllerConfig
from controller.core import build_placement
from dsched.config import load_config
from dsched.config_doc import main as config_doc_main
from dsched.config_doc import render, undocumented
from dsched.registry import Registry, UnknownPlugin

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_docs_config_md_is_generated_from_the_schema():
    assert REFERENCE.read_text() == render(), (
        "docs/config.md is stale: python -m dsched.config_doc --write docs/config.md"
    )
    assert config_doc_main(["--check", str(REFERENCE)]) == 0


def test_check_fails_on_a_stale_reference(tmp_path):
    stale = tmp_path / "config.md"
    stale.write_text(render().replace("phi", "psi", 1))
    assert config_doc_main(["--check", str(stale)]) == 1


def test_every_key_of_every_daemon_is_documented():
    assert undocumented() == []


def test_an_unknown_strategy_names_the_key_and_the_known_ones(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('allocator = "fifo"\n')
    with pytest.raises(UnknownPlugin) as err:
        load_config(ControllerConfig, path)
    assert err.value.key == "allocator" and "qos-dp" in str(err.value)
    assert err.value.known == ["demand", "qos-dp"]


def test_placement_options_reach_the_strategy(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        f'state_dir = "{tmp_path}"\nplacement = "mips"\n'
        "[placement_options.mips]\nsamples_per_decision = 7\nseed = 3\n"
    )
    loop = build_placement(load_config(ControllerConfig, path))
    assert loop is not None and (loop.strategy.samples_per_decision, loop.strategy.seed) == (7, 3)
    path.write_text(
        'placement = "aniello-offline"\n[placement_options.aniello-offline]\nbeta = 0.25\n'
    )
    assert build_placement(load_config(ControllerConfig, path)).strategy.beta == 0.25


def test_registry_refuses_a_name_twice_and_lists_names():
    reg: Registry[int] = Registry("widget", "widget")
    reg.add("a", lambda: 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("a", lambda: 2)
    assert reg.names() == ["a"] and reg.create("a") == 1 and "a" in reg
    with pytest.raises(UnknownPlugin, match="unknown widget 'b' \\(known: a\\)"):
        reg.create("b")
