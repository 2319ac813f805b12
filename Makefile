# exatwin: the two commands a new user needs.
#   make demo   creates .venv, installs, simulates GPT-80B on 8,192 Frontier GCDs
#   make test   creates .venv if needed, installs with test extras, runs pytest
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-all bench clean

$(BIN)/twin: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(BIN)/twin

demo: $(BIN)/twin
	mkdir -p out
	$(BIN)/twin simulate --machine frontier --model GPT-80B --gpus 8192 \
		--plan gx=8,gy=1,gz=16,gdata=64 --global-batch 8192 \
		--trace out/gpt80b-frontier-8192.trace.json --figure figures/timeline-gpt80b-frontier-8192.png

test: $(BIN)/twin
	$(BIN)/pytest -q

# The default suite plus the tests marked slow (CI runs this).
test-all: $(BIN)/twin
	$(BIN)/pytest -q -m ''

bench: $(BIN)/twin
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) out .pytest_cache
