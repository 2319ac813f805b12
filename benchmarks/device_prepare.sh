#!/usr/bin/env bash
# Run here, before asking for a GPU machine: writes device-input/ (ignored by git), which the device `run`
# carries, for benchmarks/device_check.sh there. The GPU machine has torch, numpy, networkx and matplotlib but
# no simpy and no network, so simpy travels as its wheel (pure Python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p device-input
# 1. every GEMM shape of the validated runs, with the FLOPs each run spends in it
"$PY" benchmarks/gemm_shapes.py --dry-run --out device-input/gemm-shapes-input.json
# 2. one GPU's step at training shapes (4 GPT layers, hidden 4096, 4 x 2048 tokens), for twin compare there
"$PY" -m twin.cli export --machine alps --model-spec layers=4,hidden=4096,heads=32,seq=2048,vocab=50257 \
    --gpus 1 --plan gx=1,mbs=4 --global-batch 4 -o device-input/step-1gpu.json
# 3. simpy's wheel, the version installed here
version=$("$PY" -c "import importlib.metadata as m; print(m.version('simpy'))")
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d device-input "simpy==$version"
ls -la device-input
