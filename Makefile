# dsched: `make demo` runs the main job, `make test` runs the suite.
# Every install step lives here so a fresh clone needs nothing else.
# The venv holds an editable install of this checkout with every extra
# (controller, testbed, bench, dev): testbed/ and bench/ are not in the wheel
# and import from the source tree. `make wheel` builds what nodes install.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Apache Flink for testbed/flink: the PyPI wheels' pyflink/ is a complete
# distribution (bin/, lib/), installed from lock/flink.txt by
# testbed/flink/install.py (which says why without dependencies).
FLINK_DIR     := .flink
FLINK_STAMP   := $(FLINK_DIR)/.installed

.PHONY: demo test install lock proto lint wheel clean flink prometheus

# Every package comes from lock/dev.txt, hashes checked, so the suite runs with
# the same versions on any day; the checkout itself goes in last, without
# dependencies and with the locked setuptools (no isolated build env to fill).
$(STAMP): pyproject.toml lock/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes -r lock/dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# Refresh the locks on purpose: the newest releases that pyproject.toml's ranges
# allow, for CPython 3.11 on Linux. dev.txt is the development venv (every
# extra, the tools); agent.txt and controller.txt are what a node installs
# beside the wheel, resolved to the same versions; flink.txt is the testbed's
# Flink. Review the diff, run `make proto` (the stubs follow grpcio-tools) and
# `make test`, then commit lock/ with whatever they changed.
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-unknown-linux-gnu --no-header --annotation-style line
lock: $(STAMP)
	$(UV_COMPILE) --upgrade --extra dev pyproject.toml lock/tools.in -o lock/dev.txt
	$(UV_COMPILE) --constraint lock/dev.txt pyproject.toml -o lock/agent.txt
	$(UV_COMPILE) --constraint lock/dev.txt --extra controller pyproject.toml -o lock/controller.txt
	$(UV_COMPILE) --upgrade --no-deps lock/flink.in -o lock/flink.txt

# Order-only on the venv: reinstalling the venv does not download Flink again.
$(FLINK_STAMP): | $(STAMP)
	@for tool in java javac jar jcmd; do \
	  command -v $$tool >/dev/null 2>&1 && continue; \
	  echo "$$tool not found: installing openjdk-17-jdk-headless"; \
	  apt-get install -y openjdk-17-jdk-headless \
	    || { apt-get update && apt-get install -y openjdk-17-jdk-headless; } \
	    || { echo "could not install a JDK 17: install openjdk-17-jdk-headless (java, javac, jar, jcmd) and rerun make flink" >&2; exit 1; }; \
	  break; \
	done
	$(PY) -m testbed.flink.install --target $(FLINK_DIR)
	touch $@

flink: $(FLINK_STAMP)

# Prometheus and promtool for tests/test_prometheus.py (a real server scrapes the
# daemons; promtool checks the metrics, rules and rule tests in deploy/prometheus).
# Debian's package would start a system-wide prometheus at install: a policy-rc.d
# that refuses every start is in place during the install (ours only if none was
# there), and afterwards the service is disabled (and stopped, under systemd).
# --no-install-recommends: no node exporter.
prometheus:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && exit 0; \
	echo "promtool not found: installing prometheus (service left stopped)"; \
	own_policy=; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
	  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1; \
	fi; \
	apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }; \
	apt_install || { apt-get update && apt_install; }; status=$$?; \
	[ -n "$$own_policy" ] && rm -f /usr/sbin/policy-rc.d; \
	if command -v systemctl >/dev/null 2>&1; then systemctl disable prometheus.service >/dev/null 2>&1; fi; \
	if [ -d /run/systemd/system ]; then systemctl stop prometheus.service >/dev/null 2>&1; fi; \
	if command -v update-rc.d >/dev/null 2>&1; then update-rc.d prometheus disable >/dev/null 2>&1; fi; \
	[ $$status -eq 0 ] || { echo "could not install prometheus: install Debian's prometheus package (prometheus, promtool) and rerun make prometheus" >&2; exit 1; }

demo: $(STAMP) $(FLINK_STAMP)
	$(VENV)/bin/dsched demo --duration $${DURATION:-120}

# Two passes: most tests on two workers, then those marked serial alone
# (tests/conftest.py says which and why). PYTEST_ARGS reaches both.
test: $(STAMP) $(FLINK_STAMP) prometheus systemd-tools tmux
	$(PY) -m pytest -n 2 --dist loadgroup -m "not serial" $${PYTEST_ARGS:-}
	$(PY) -m pytest -m serial $${PYTEST_ARGS:-}

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Idsched_pb=proto --python_out=. --grpc_python_out=. --pyi_out=. proto/dsched.proto

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The daemons only (no testbed/, no bench/): pip install the wheel from dist/ on
# every node, with the `[controller]` extra on the controller's (docs/operations.md).
# An sdist, then the wheel built from it. --no-isolation builds with the venv's
# setuptools, without an index; BUILD_FLAGS= builds in an isolated env instead.
BUILD_FLAGS ?= --no-isolation
wheel: $(STAMP)
	$(PY) -m build $(BUILD_FLAGS) --outdir dist .

# systemd-analyze for tests/test_systemd.py (verify and security of systemd/*.service).
# Debian's systemd package has it; it need not be PID 1.
.PHONY: systemd-tools
systemd-tools:
	@command -v systemd-analyze >/dev/null 2>&1 && exit 0; \
	echo "systemd-analyze not found: installing systemd"; \
	apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd; }; \
	apt_install || { apt-get update && apt_install; } \
	  || { echo "could not install systemd-analyze: install Debian's systemd package and rerun make systemd-tools" >&2; exit 1; }

# tmux for tests/test_ctl_top.py (dschedctl top driven in a real terminal).
.PHONY: tmux
tmux:
	@command -v tmux >/dev/null 2>&1 && exit 0; \
	echo "tmux not found: installing tmux"; \
	apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tmux; }; \
	apt_install || { apt-get update && apt_install; } \
	  || { echo "could not install tmux: install Debian's tmux package and rerun make tmux" >&2; exit 1; }

clean:
	rm -rf build dist *.egg-info .pytest_cache spark-warehouse
