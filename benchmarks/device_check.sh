#!/usr/bin/env bash
# The checks that need a GPU, as one command for a lent GPU machine (README, "Checks that need a GPU").
#
# Here, before asking for the machine (the GPU machine has no simpy, so the shapes are found here):
#   .venv/bin/python benchmarks/gemm_shapes.py --dry-run --out device-input/gemm-shapes-input.json
# There (device `run`, carry ["device-input"], timeout ~600 s):
#   bash benchmarks/device_check.sh
# It writes $OUT/gpu.txt, $OUT/gemm-shapes.json and $OUT/gemm-shapes.txt; commit what comes back under
# benchmarks/results/ with the date and the GPU's name.
set -euo pipefail
OUT=${OUT:-out/device}
INPUT=${INPUT:-device-input/gemm-shapes-input.json}
mkdir -p "$OUT"
if [ ! -f "$INPUT" ]; then
    echo "device_check: $INPUT is missing; write it here first with benchmarks/gemm_shapes.py --dry-run --out $INPUT" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
# The GPU's chip decides which machine file's shape model to compare with: alps (GH200 = H100) for Hopper.
PYTHONUNBUFFERED=1 python3 benchmarks/gemm_shapes.py --shapes "$INPUT" --machine "${MACHINE:-alps}" \
    --device cuda --out "$OUT/gemm-shapes.json" | tee "$OUT/gemm-shapes.txt"
