#!/usr/bin/env bash
# The checks that need a GPU, as one command for a lent GPU machine (README, "Closing the gap: measurements the twin takes in").
#
# Here, first:   bash benchmarks/device_prepare.sh          (writes device-input/, ignored by git)
# There:         device `run` with carry ["device-input"], timeout about 600 s:
#                    bash benchmarks/device_check.sh
# It writes into $OUT: gpu.txt; gemm-shapes.json/.txt (the GEMM shape model against this GPU) and gemm-measured.toml
# (the measured rates as [[device.gemm_measured]] entries for the machine file of this chip); compare.json/.txt
# and compare-*.png (a one-GPU step of 4 GPT layers at hidden 4096, simulated on --machine vs measured, per op
# class); run-profiled.txt, profile-rank0.json.gz and compare-trace.txt/.json (the same step under torch.profiler:
# its real kernel names classed by twin compare-trace, beside the twin). Commit what comes back under
# benchmarks/results/ with the date and the GPU's name.
set -euo pipefail
OUT=${OUT:-out/device}
IN=${IN:-device-input}
MACHINE=${MACHINE:-alps}  # the machine file with the same chip: alps (GH200 = H100) for Hopper
mkdir -p "$OUT"
for f in "$IN/gemm-shapes-input.json" "$IN/step-1gpu.json"; do
    if [ ! -f "$f" ]; then
        echo "device_check: $f is missing; run benchmarks/device_prepare.sh here first and carry $IN" >&2
        exit 2
    fi
done
if ! python3 -c "import simpy" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$IN"/simpy-*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
python3 benchmarks/gemm_shapes.py --shapes "$IN/gemm-shapes-input.json" --machine "$MACHINE" --device cuda \
    --out "$OUT/gemm-shapes.json" --toml "$OUT/gemm-measured.toml" | tee "$OUT/gemm-shapes.txt"
python3 -m twin.cli compare "$IN/step-1gpu.json" --machine "$MACHINE" --nproc 1 --device cuda \
    --figures "$OUT/compare" --out /tmp/compare-run | tee "$OUT/compare.txt"
# The same step under torch.profiler, its real kernels classed and set beside the twin (twin compare-trace)
python3 -m twin.cli run "$IN/step-1gpu.json" --nproc 1 --device cuda --profile-steps 2 --out /tmp/profile-run \
    | tee "$OUT/run-profiled.txt"
gzip -c /tmp/profile-run/profile-rank0.json > "$OUT/profile-rank0.json.gz"
python3 -m twin.cli compare-trace "$OUT/profile-rank0.json.gz" --schedule "$IN/step-1gpu.json" --machine "$MACHINE" \
    | tee "$OUT/compare-trace.txt"
python3 -m twin.cli compare-trace "$OUT/profile-rank0.json.gz" --schedule "$IN/step-1gpu.json" --machine "$MACHINE" \
    --json > "$OUT/compare-trace.json"
