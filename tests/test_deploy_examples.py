"""The example configurations in deploy/examples/ load, and say what an operator relies on.

Each example is loaded the way its daemon loads its configuration file: with
``agent.daemon.load``, ``controller.daemon.load`` and
``spark_stream.daemon.load_history_config``, which refuse unknown keys and run every
validation. The examples name their certificates under /etc/dsched/pki/, and the
loaders check that certificate files exist, so each test loads a copy whose pki
directory is a temporary one holding (empty) files of those names; one test shows
that this is the only thing the unmodified examples lack on a machine without them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path, PurePosixPath

import pytest

from agent import daemon as agent_daemon
from agent.cgroups import DEFAULT_MOUNTS
from controller import daemon as controller_daemon
from controller.config import unix_socket_path
from controller.edges.history import history_config
from controller.qos import default_qos_classes
from dsched.config import ConfigError, parse_hostport
from dsched.names import check_name
from spark_stream.daemon import load_history_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"
SYSTEMD = ROOT / "systemd"
PKI = "/etc/dsched/pki/"
AGENT = EXAMPLES / "agent.toml"
CONTROLLER = EXAMPLES / "controller.toml"


# ---------------------------------------------------------------- helpers


def unit(name: str) -> dict[str, list[str]]:
    """Key -> every value it is given in systemd/<name>, in order."""
    out: dict[str, list[str]] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def config_path_of(name: str) -> str:
    """The file a unit's ExecStart passes as --config."""
    (exec_start,) = unit(name)["ExecStart"]
    m = re.search(r"--config\s+(\S+)", exec_start)
    assert m, f"{name}: ExecStart passes no --config: {exec_start}"
    return m.group(1)


def writable(name: str) -> list[PurePosixPath]:
    """The unit's ReadWritePaths= (a leading '-' only makes a path optional)."""
    return [
        PurePosixPath(word.removeprefix("-"))
        for value in unit(name).get("ReadWritePaths", [])
        for word in value.split()
    ]


def tmpfiles_directory() -> str:
    """The directory systemd/tmpfiles.d/dsched.conf creates (/run/dsched)."""
    (line,) = [
        line
        for line in (SYSTEMD / "tmpfiles.d" / "dsched.conf").read_text().splitlines()
        if line.startswith("d ")
    ]
    return line.split()[1]


def under_one_of(path: str | Path, roots: list[PurePosixPath]) -> bool:
    p = PurePosixPath(str(path))
    return any(p == root or root in p.parents for root in roots)


def installed(example: Path, tmp_path: Path, text: str | None = None) -> Path:
    """A copy of ``example`` (or of ``text``) whose /etc/dsched/pki/ is a scratch
    directory holding a file for every certificate, key and CA the example names."""
    text = example.read_text() if text is None else text
    pki = tmp_path / "pki"
    pki.mkdir(exist_ok=True)
    for name in re.findall(re.escape(PKI) + r"([\w.-]+)", text):
        (pki / name).write_text("placeholder: the loaders check that the file exists\n")
    copy = tmp_path / example.name
    copy.write_text(text.replace(PKI, f"{pki}/"))
    return copy


def load_agent(path: Path):
    return agent_daemon.load(agent_daemon.build_parser().parse_args(["--config", str(path)]))


def load_controller(path: Path):
    return controller_daemon.load(controller_daemon.parse_args(["--config", str(path)]))


def load_history(path: Path):
    return load_history_config(str(path), None, None)


def uncommented(text: str, header: str) -> str:
    """``text`` with the commented-out table ``# <header>`` and its ``# key = value``
    lines uncommented."""
    lines = text.splitlines()
    start = lines.index(f"# {header}")
    end = start + 1
    while end < len(lines) and re.match(r"# [a-z_]+ = ", lines[end]):
        end += 1
    assert end > start + 1, f"no commented keys under # {header}"
    body = [line.removeprefix("# ") for line in lines[start:end]]
    return "\n".join(lines[:start] + body + lines[end:]) + "\n"


def relative(path: Path, tmp_path: Path) -> str:
    """A loaded path as the example wrote it (the scratch pki dir back to /etc/dsched/pki/)."""
    return str(path).replace(f"{tmp_path / 'pki'}/", PKI)


# ---------------------------------------------------------------- the files


@pytest.mark.parametrize(
    ("example", "units"),
    [
        (AGENT, ["dsched-agent.service"]),
        (CONTROLLER, ["dsched-controller.service", "dsched-history.service"]),
    ],
)
def test_each_example_is_for_the_file_its_units_read(example, units):
    first = example.read_text().splitlines()[0]
    for name in units:
        target = config_path_of(name)
        assert first.startswith(f"# {target}:"), (
            f"{example.name} names {first!r}, {name} reads {target}"
        )
        assert PurePosixPath(target).name == example.name


def test_the_agent_example_loads_with_mutual_tls(tmp_path):
    cfg = load_agent(installed(AGENT, tmp_path))
    assert cfg.tls.enabled and None not in (cfg.tls.ca, cfg.tls.cert, cfg.tls.key)
    assert not cfg.allow_plaintext_remote
    # The controller's door decides dry-run; an agent in dry_run would never enforce.
    assert not cfg.dry_run
    # The controller refuses an agent whose node_id is not its certificate's name,
    # and docs/security.md issues node N's certificate as N.pem, N.key.
    assert Path(cfg.tls.cert).name == f"{cfg.node_id}.pem"
    assert Path(cfg.tls.key).name == f"{cfg.node_id}.key"


def test_the_controller_example_starts_in_dry_run_with_mutual_tls(tmp_path):
    cfg = load_controller(installed(CONTROLLER, tmp_path))
    assert cfg.mode == "dry-run"
    host, _ = parse_hostport("listen", cfg.listen)
    assert host == "0.0.0.0", "the example serves agents on other hosts"
    assert None not in (cfg.tls.cert, cfg.tls.key, cfg.tls.ca)
    assert not cfg.allow_plaintext_remote
    assert unix_socket_path(cfg.admin_listen) is not None, "admin door on a Unix socket"
    assert not cfg.admin_tls.enabled


def test_the_history_service_reads_the_history_the_controller_runs(tmp_path):
    """dsched-history.service reads controller.toml's [history]; the controller puts
    that table under its own state_dir and slot. Both must be the same job."""
    path = installed(CONTROLLER, tmp_path)
    cfg = load_controller(path)
    embedded = history_config(cfg.history, cfg.state_dir, cfg.slot_seconds)
    standalone = load_history(path)
    assert dataclasses.asdict(standalone) == dataclasses.asdict(embedded)
    assert config_path_of("dsched-history.service") == config_path_of("dsched-controller.service")


def test_the_qos_classes_and_the_assignments_shown(tmp_path):
    cfg = load_controller(installed(CONTROLLER, tmp_path))
    assert set(cfg.qos.classes) == {"gold", "silver", "bronze"}
    assert cfg.qos.default_class == "bronze"
    # The comment says these are the built-in classes: listing them changes nothing.
    assert cfg.qos.classes == default_qos_classes()
    shown = re.findall(r"^#\s+dschedctl qos set (\S+) (\S+)$", CONTROLLER.read_text(), re.M)
    assert {cls for _, cls in shown} == {"gold", "silver", "bronze"}, shown
    for app, cls in shown:
        check_name("app", app)
        assert cls in cfg.qos.classes


# ---------------------------------------------------------------- paths and ports


def test_the_controller_paths_are_the_units_paths(tmp_path):
    cfg = load_controller(installed(CONTROLLER, tmp_path))
    for name in ("dsched-controller.service", "dsched-history.service"):
        settings = unit(name)
        (state,) = settings["StateDirectory"]
        assert cfg.state_dir == Path("/var/lib") / state, name
        assert settings["WorkingDirectory"] == [str(cfg.state_dir)], name
    assert cfg.history.state_dir == cfg.state_dir
    admin = unix_socket_path(cfg.admin_listen)
    assert under_one_of(admin.parent, writable("dsched-controller.service"))
    # The socket's group is the controller's own (empty), the unit's Group=dsched:
    # the group sysusers.d creates and operations.md puts operators in.
    assert cfg.admin_socket_group == ""
    assert unit("dsched-controller.service")["Group"] == ["dsched"]
    assert admin.parent == Path(tmpfiles_directory())
    for key in ("cert", "key", "ca"):
        assert relative(getattr(cfg.tls, key), tmp_path).startswith(PKI), key


def test_the_agent_paths_are_the_units_paths(tmp_path):
    cfg = load_agent(installed(AGENT, tmp_path))
    rw = writable("dsched-agent.service")
    assert Path(cfg.socket).parent == Path(tmpfiles_directory())
    assert under_one_of(Path(cfg.socket).parent, rw)
    mounts = [cfg.cgroup_mount] if cfg.cgroup_mount else list(DEFAULT_MOUNTS.values())
    for mount in mounts:
        assert under_one_of(mount, rw), f"cgroup mount {mount} not in ReadWritePaths {rw}"
    assert under_one_of(cfg.resctrl_mount, rw)
    for key in ("cert", "key", "ca"):
        assert relative(getattr(cfg.tls, key), tmp_path).startswith(PKI), key


def test_agents_and_controller_meet(tmp_path):
    agent = load_agent(installed(AGENT, tmp_path))
    controller = load_controller(installed(CONTROLLER, tmp_path))
    assert (
        parse_hostport("controller", agent.controller)[1]
        == parse_hostport("listen", controller.listen)[1]
    )
    # The controller's server certificate is signed by the agents' CA, which the
    # agent checks it with (docs/security.md): one CA file on both sides.
    assert Path(agent.tls.ca).name == Path(controller.tls.ca).name


def scrape_ports() -> dict[str, set[int]]:
    """Job name -> the ports of its targets in deploy/prometheus/prometheus.yml."""
    text = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    out: dict[str, set[int]] = {}
    for job, body in re.findall(r"job_name:\s*(\S+)(.*?)(?=job_name:|\Z)", text, re.S):
        out[job] = {int(p) for p in re.findall(r'"[^":]+:(\d+)"', body)}
    return out


def test_metrics_ports_are_the_ones_prometheus_scrapes(tmp_path):
    ports = scrape_ports()
    agent = load_agent(installed(AGENT, tmp_path))
    controller = load_controller(installed(CONTROLLER, tmp_path))
    assert ports["dsched-agent"] == {parse_hostport("metrics", agent.metrics)[1]}
    assert ports["dsched-controller"] == {parse_hostport("metrics", controller.metrics)[1]}
    # Prometheus runs elsewhere: the examples serve metrics beyond loopback.
    assert parse_hostport("metrics", agent.metrics)[0] == "0.0.0.0"
    assert parse_hostport("metrics", controller.metrics)[0] == "0.0.0.0"


# ---------------------------------------------------------------- commented tables


def test_the_commented_flink_tables_load_and_agree(tmp_path):
    agent_dir, controller_dir = tmp_path / "agent", tmp_path / "controller"
    agent_dir.mkdir()
    controller_dir.mkdir()
    agent = load_agent(installed(AGENT, agent_dir, uncommented(AGENT.read_text(), "[[engine]]")))
    controller = load_controller(
        installed(CONTROLLER, controller_dir, uncommented(CONTROLLER.read_text(), "[[engine]]"))
    )
    (agent_engine,) = agent.engine
    (controller_engine,) = controller.engine
    assert agent_engine.kind == controller_engine.kind == "flink"
    assert agent_engine.rest_url == controller_engine.rest_url


def test_the_commented_discovery_rule_loads(tmp_path):
    cfg = load_agent(installed(AGENT, tmp_path, uncommented(AGENT.read_text(), "[[discovery]]")))
    (rule,) = cfg.discovery
    assert re.fullmatch(rule.thread_name, "split-3").groupdict() == {
        "operator": "split",
        "instance": "3",
    }


# ---------------------------------------------------------------- what the loaders refuse


@pytest.mark.skipif(Path(PKI).exists(), reason="this machine has /etc/dsched/pki/")
@pytest.mark.parametrize("load", [load_agent, load_controller], ids=["agent", "controller"])
def test_unmodified_examples_lack_only_the_certificates(load):
    example = AGENT if load is load_agent else CONTROLLER
    with pytest.raises(ConfigError) as err:
        load(example)
    assert err.value.key.startswith("tls."), err.value
    assert "does not exist" in str(err.value) and PKI in str(err.value)


@pytest.mark.parametrize(
    ("example", "load", "table", "typo"),
    [
        (AGENT, load_agent, None, "sample_second = 1.0"),
        (AGENT, load_agent, "[tls]", "certificate = 'node-1.pem'"),
        (CONTROLLER, load_controller, None, "theta_core = 0.1"),
        (CONTROLLER, load_controller, "[qos.classes.gold]", "target_latency = 100.0"),
        (CONTROLLER, load_history, "[history]", "spark_mastr = 'local[2]'"),
    ],
    ids=["agent", "agent-tls", "controller", "controller-qos", "history"],
)
def test_a_key_the_loader_does_not_know_is_refused(tmp_path, example, load, table, typo):
    """Loading the examples above is what catches an unknown key in them: the loader
    refuses one, naming it. Shown here on copies with a misspelt key added."""
    text = example.read_text()
    if table is None:
        text = f"{typo}\n{text}"
    else:
        assert f"\n{table}\n" in text
        text = text.replace(f"\n{table}\n", f"\n{table}\n{typo}\n", 1)
    key = typo.split(" = ")[0]
    with pytest.raises(ConfigError, match="unknown key") as err:
        load(installed(example, tmp_path, text))
    assert err.value.key.endswith(key), err.value
