# dsched: `make demo` runs the main job, `make test` runs the suite.
# Every install step lives here so a fresh clone needs nothing else.
# The venv holds an editable install of this checkout with every extra
# (controller, testbed, bench, dev): testbed/ and bench/ are not in the wheel
# and import from the source tree. `make wheel` builds what nodes install.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install proto lint wheel clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dsched demo --duration $${DURATION:-120}

test: $(STAMP)
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
