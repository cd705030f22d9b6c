# dsched: `make demo` runs the main job, `make test` runs the suite.
# Every install step lives here so a fresh clone needs nothing else.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install proto lint bench clean

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

clean:
	rm -rf build *.egg-info .pytest_cache spark-warehouse
