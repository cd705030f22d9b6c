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
# distribution (bin/, lib/). --no-deps: apache-flink's Python dependencies pin an
# old grpcio, and the testbed drives Flink through its scripts and REST only.
FLINK_VERSION := 2.3.0
FLINK_DIR     := .flink
FLINK_STAMP   := $(FLINK_DIR)/.installed

.PHONY: demo test install proto lint wheel clean flink

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Order-only on the venv: reinstalling the venv does not download Flink again.
# --upgrade replaces a partial pyflink/ left by an interrupted install.
$(FLINK_STAMP): | $(STAMP)
	@for tool in java javac jar jcmd; do \
	  command -v $$tool >/dev/null 2>&1 && continue; \
	  echo "$$tool not found: installing openjdk-17-jdk-headless"; \
	  apt-get install -y openjdk-17-jdk-headless \
	    || { apt-get update && apt-get install -y openjdk-17-jdk-headless; } \
	    || { echo "could not install a JDK 17: install openjdk-17-jdk-headless (java, javac, jar, jcmd) and rerun make flink" >&2; exit 1; }; \
	  break; \
	done
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(FLINK_DIR) apache-flink==$(FLINK_VERSION) apache-flink-libraries==$(FLINK_VERSION)
	touch $@

flink: $(FLINK_STAMP)

demo: $(STAMP) $(FLINK_STAMP)
	$(VENV)/bin/dsched demo --duration $${DURATION:-120}

test: $(STAMP) $(FLINK_STAMP)
	$(PY) -m pytest $${PYTEST_ARGS:-}

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Idsched_pb=proto --python_out=. --grpc_python_out=. --pyi_out=. proto/dsched.proto

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The daemons only (no testbed/, no bench/): pip install the wheel from dist/ on
# every node, with the `[controller]` extra on the controller's.
wheel: $(STAMP)
	$(PY) -m pip wheel --quiet --no-deps -w dist .

clean:
	rm -rf build dist *.egg-info .pytest_cache spark-warehouse
