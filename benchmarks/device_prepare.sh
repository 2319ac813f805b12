#!/usr/bin/env bash
# Run here, before asking for a GPU machine: writes device-input/ (ignored by git), which the device `run`
# carries, for benchmarks/device_check.sh there. The GPU machine has torch, numpy, networkx and matplotlib but
# no simpy and no network, so simpy travels as its wheel (pure Python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p device-input
# 1. every GEMM shape of the validated runs and of the A100 runs of twin fit's protocol (benchmarks/data, as make fit
#    assumes them), with the FLOPs each run spends in it
DATA=${DATA:-benchmarks/data}
ASSUME=attention=unfused,recompute=full,dtype=fp16,optimizer=flat
"$PY" benchmarks/gemm_shapes.py --dry-run --out device-input/gemm-shapes-input.json \
    --runs "$DATA/a100-megatron-single-node.csv" --runs "$DATA/a100-megatron-multi-node.csv" --assume "$ASSUME"
# 2. one GPU's step at training shapes (4 GPT layers, hidden 4096, 4 x 2048 tokens), for twin compare there.
#    Both steps pad GPT-2's 50,257-token vocabulary to 50,304 (a multiple of 128), as Megatron does: unpadded, the
#    logits GEMM in NT layout ran on an sm75 CUTLASS kernel at 136-140 TF/s on an H200, a fifth of the others'
#    rate (benchmarks/results/2026-12-04-nvidia-h200, docs/gpu-h200.md), which no real run of the twin's pays
#    and the twin does not model
"$PY" -m twin.cli export --machine alps --model-spec layers=4,hidden=4096,heads=32,seq=2048,vocab=50304 \
    --gpus 1 --plan gx=1,mbs=4 --global-batch 4 -o device-input/step-1gpu.json
# 3. one GPU's step of Megatron's kernels as the A100 runs ran them (unfused attention, full recompute, fp16, the
#    flat optimizer) at the single-node file's larger model shape (hidden 2048, 16 heads, sequence 1024), 4 layers
"$PY" -m twin.cli export --machine dgx-a100-800g \
    --model-spec layers=4,hidden=2048,heads=16,seq=1024,vocab=50304,dtype=fp16 --gpus 1 \
    --plan gx=1,mbs=8,attention=unfused,recompute=full,optimizer=flat --global-batch 16 -o device-input/step-megatron-1gpu.json
# 4. simpy's wheel, the version installed here
version=$("$PY" -c "import importlib.metadata as m; print(m.version('simpy'))")
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d device-input "simpy==$version"
ls -la device-input
