# exatwin: the two commands a new user needs.
#   make demo   creates .venv, installs, simulates GPT-80B on 8,192 Frontier GCDs
#   make test   creates .venv if needed, installs with the test and torch extras, runs pytest
#               (torch is the executor's: the CPU wheel torch==2.13.0, pinned in pyproject.toml)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-all bench bench-search bench-executor bench-fit fit validate clean

$(BIN)/twin: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(BIN)/twin

# The executor's tests need torch; the simulator (make demo) does not.
$(VENV)/.torch-installed: $(BIN)/twin
	$(BIN)/pip install --quiet -e '.[test,torch]'
	touch $@

demo: $(BIN)/twin
	mkdir -p out
	$(BIN)/twin simulate --machine frontier --model GPT-80B --gpus 8192 \
		--plan gx=8,gy=1,gz=16,gdata=64 --global-batch 8192 \
		--trace out/gpt80b-frontier-8192.trace.json --figure figures/timeline-gpt80b-frontier-8192.png

test: $(VENV)/.torch-installed
	$(BIN)/pytest -q

# The default suite plus the tests marked slow (CI runs this).
test-all: $(VENV)/.torch-installed
	$(BIN)/pytest -q -m ''

bench: $(BIN)/twin
	$(BIN)/python benchmarks/sim_speed.py

# twin search and twin validate, cold (an empty cache): wall time against the targets (minutes).
bench-search: $(BIN)/twin
	$(BIN)/python benchmarks/search_speed.py

# The calibrated machine files of `twin validate`'s second column (topologies/fitted/), each by `twin fit` on
# calibration runs only (benchmarks/data/README.md), minutes:
# - vTrain's A100 cluster, fitted on its 1,440 single-node runs: the host's time per op (the other fittable
#   numbers end on their bounds on these runs: docs/fit.md);
# - MosaicML's A100 40 GB cluster, fitted on its 46 one-node MPT runs (FSDP, flash attention, bf16): the
#   attention rate and the GEMM rate (the host's time per op is not determined by these GPU-bound runs;
#   MPT trains without dropout);
# - MosaicML's H100 80 GB cluster, fitted on its 37 one-node MPT runs: the same two rates; then, on that file,
#   the FP8 GEMM rate fitted on the same cluster's 7 one-node FP8 runs (the linears in FP8, Transformer Engine);
# - Perlmutter's A100s: the host's time per op carried from the first fit, the attention and GEMM rates from
#   the second (the same A100 40 GB, flash attention, bf16 and sharded data parallelism; AxoNN is another
#   code on another host, so this is a transfer, not a measurement);
# - Frontier: its GEMM rate fitted on the Frontier paper's one run on two nodes (22B on 16 GCDs).
A100_ASSUME := attention=unfused,recompute=full,dtype=fp16,optimizer=flat
MPT_PARAMS := device.attention_efficiency,device.empirical_gemm_bf16_tflop_per_s
fit: $(BIN)/twin
	mkdir -p topologies/fitted
	$(BIN)/twin fit --machine dgx-a100-800g --runs benchmarks/data/a100-megatron-single-node.csv \
		--assume $(A100_ASSUME) --params device.launch_interval_us \
		-o topologies/fitted/dgx-a100-800g.toml
	$(BIN)/twin fit --machine mpt-a100-40g --runs benchmarks/data/mpt-a100-40gb-one-node.csv \
		--assume dropout=0 --params $(MPT_PARAMS) -o topologies/fitted/mpt-a100-40g.toml
	$(BIN)/twin fit --machine mpt-h100-80g --runs benchmarks/data/mpt-h100-80gb-one-node.csv \
		--assume dropout=0 --params $(MPT_PARAMS) -o topologies/fitted/mpt-h100-80g-bf16.toml
	$(BIN)/twin fit --machine topologies/fitted/mpt-h100-80g-bf16.toml \
		--runs benchmarks/data/mpt-h100-80gb-fp8-one-node.csv --assume dropout=0 \
		--params device.empirical_gemm_fp8_tflop_per_s -o topologies/fitted/mpt-h100-80g.toml
	rm topologies/fitted/mpt-h100-80g-bf16.toml
	$(BIN)/twin fit --machine perlmutter --from topologies/fitted/dgx-a100-800g.toml \
		--params device.launch_interval_us -o topologies/fitted/perlmutter-host.toml
	$(BIN)/twin fit --machine topologies/fitted/perlmutter-host.toml --from topologies/fitted/mpt-a100-40g.toml \
		--params $(MPT_PARAMS) -o topologies/fitted/perlmutter.toml
	rm topologies/fitted/perlmutter-host.toml
	$(BIN)/twin fit --machine frontier --runs benchmarks/data/frontier-22b-16gcd.csv \
		--params device.empirical_gemm_bf16_tflop_per_s --folds 0 -o topologies/fitted/frontier.toml

# Fit on one node, predict the cluster: the A100 protocol in one table, with vTrain's multi-node runs,
# Megatron-LM's published runs on Selene and MosaicML's MPT runs on 16-128 A100 40 GB (fitted on their own
# one-node runs) as validation (3-6 minutes).
bench-fit: $(BIN)/twin
	$(BIN)/python benchmarks/fit_accuracy.py

# Every published measurement predicted; rewrites the README's Accuracy table and the validation figures.
validate: $(BIN)/twin
	$(BIN)/twin validate --figures --readme README.md

# The executor on this host: overhead against a hand-written loop, simulated vs measured, and whether the
# twin ranks plans as the host does (minutes).
bench-executor: $(VENV)/.torch-installed
	$(BIN)/python benchmarks/executor_overhead.py
	$(BIN)/python benchmarks/compare_local.py
	$(BIN)/python benchmarks/ranking_local.py

clean:
	rm -rf $(VENV) out .pytest_cache
