#!/usr/bin/env bash
# The checks that need a GPU, as one command for a lent GPU machine (docs/accuracy-investigation.md, "Closing the gap: measurements the twin takes in").
#
# Here, first:   bash benchmarks/device_prepare.sh          (writes device-input/, ignored by git)
# There:         device `run` with carry ["device-input"], timeout about 600 s:
#                    R=$OUT; OUT=/tmp/dc BUNDLE=$R/device-check.tar.gz bash benchmarks/device_check.sh
#                (a lent machine brings back at most 8 files: BUNDLE holds them all but the profiles, which may be
#                large: copy $OUT/profile-*.json.gz beside it; BUNDLE is rewritten after every stage)
# It writes into $OUT: gpu.txt; gemm-shapes.json/.txt (the GEMM shape model against this GPU, at the validated runs'
# shapes and the A100 runs' of twin fit's protocol, batched GEMMs included) and gemm-measured.toml (the measured
# rates as [[device.gemm_measured]] entries for the machine file of this chip); hbm-stream.txt (element-wise
# bandwidth); compare.json/.txt and compare-*.png (a one-GPU step of 4 GPT layers at hidden 4096, simulated on
# --machine vs measured, per op class); run-profiled.txt, profile-rank0.json.gz and compare-trace.txt/.json/.png (the
# same step under torch.profiler: its real kernel names classed by twin compare-trace, beside the twin); the same
# three for a one-GPU step of Megatron's kernels as the A100 runs ran them (*-megatron*). Commit what comes back
# under benchmarks/results/ with the date and the GPU's name.
# Every stage runs even if an earlier one failed (a lent GPU is one try); the exit code says whether all passed.
# DEVICE=cpu REF_DIM=256 IN=<small inputs> runs the same stages on a CPU (tests/test_device_check.py does).
set -uo pipefail
OUT=${OUT:-out/device}
IN=${IN:-device-input}
MACHINE=${MACHINE:-alps}  # the machine file with the same chip: alps (GH200 = H100) for Hopper
DEVICE=${DEVICE:-cuda}
REF_DIM=${REF_DIM:-32768}  # the square GEMM the shape efficiencies are relative to
mkdir -p "$OUT"
for f in "$IN/gemm-shapes-input.json" "$IN/step-1gpu.json" "$IN/step-megatron-1gpu.json"; do
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
failed=()
stage() {  # stage NAME OUTFILE COMMAND...: run it, keep its output in OUTFILE and on stdout, note a failure
    local name=$1 file=$2 started=$SECONDS
    shift 2
    echo "== $name"
    if ! "$@" 2>&1 | tee "$file"; then
        failed+=("$name")
        echo "== $name FAILED (continuing)"
    fi
    echo "== $name: $((SECONDS - started)) s"
    bundle
}
bundle() {  # BUNDLE: everything so far but the profiles in one archive, rewritten after every stage, so that a run
    # stopped at its time limit still brings back what it measured (a lent machine returns a few files, not a folder)
    if [ -n "${BUNDLE:-}" ]; then tar czf "$BUNDLE" -C "$OUT" --exclude "$(basename "$BUNDLE")" --exclude "profile-*" . ; fi
}
stage gpu "$OUT/gpu.txt" python3 -c "import torch; print('torch', torch.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version \
    --format=csv >> "$OUT/gpu.txt"
stage gemm-shapes "$OUT/gemm-shapes.txt" python3 benchmarks/gemm_shapes.py --shapes "$IN/gemm-shapes-input.json" \
    --machine "$MACHINE" --device "$DEVICE" --reference-dim "$REF_DIM" --time-limit "${GEMM_TIME_LIMIT:-200}" \
    --out "$OUT/gemm-shapes.json" \
    --toml "$OUT/gemm-measured.toml"
stage hbm-stream "$OUT/hbm-stream.txt" python3 benchmarks/hbm_stream.py --device "$DEVICE" --gib "${HBM_GIB:-2}" \
    --peak-gb-per-s "${HBM_PEAK_GB_PER_S:-0}" --json
stage compare "$OUT/compare.txt" python3 -m twin.cli compare "$IN/step-1gpu.json" --machine "$MACHINE" --nproc 1 \
    --device "$DEVICE" --wall-timeout 150 --figures "$OUT/compare" --out /tmp/compare-run
cp /tmp/compare-run/compare.json "$OUT/compare.json" 2>/dev/null || true
# The same step under torch.profiler, its real kernels classed and set beside the twin (twin compare-trace)
stage run-profiled "$OUT/run-profiled.txt" python3 -m twin.cli run "$IN/step-1gpu.json" --nproc 1 --device "$DEVICE" \
    --wall-timeout 150 --profile-steps 2 --out /tmp/profile-run
gzip -c /tmp/profile-run/profile-rank0.json > "$OUT/profile-rank0.json.gz" 2>/dev/null || true
stage compare-trace "$OUT/compare-trace.txt" python3 -m twin.cli compare-trace "$OUT/profile-rank0.json.gz" \
    --schedule "$IN/step-1gpu.json" --machine "$MACHINE" --figure "$OUT/compare-trace.png"
stage compare-trace-json "$OUT/compare-trace.json" python3 -m twin.cli compare-trace "$OUT/profile-rank0.json.gz" \
    --schedule "$IN/step-1gpu.json" --machine "$MACHINE" --json
# Megatron's kernels as the A100 runs ran them (unfused attention, full recompute, fp16, flat optimizer): the
# executor's per-class times beside the twin's, and the real kernels under the profiler
stage compare-megatron "$OUT/compare-megatron.txt" python3 -m twin.cli compare "$IN/step-megatron-1gpu.json" \
    --machine "$MACHINE" --nproc 1 --device "$DEVICE" --wall-timeout 150 --figures "$OUT/compare-megatron" --out /tmp/compare-megatron
cp /tmp/compare-megatron/compare.json "$OUT/compare-megatron.json" 2>/dev/null || true
stage run-profiled-megatron "$OUT/run-profiled-megatron.txt" python3 -m twin.cli run "$IN/step-megatron-1gpu.json" \
    --nproc 1 --device "$DEVICE" --wall-timeout 150 --profile-steps 2 --out /tmp/profile-megatron
gzip -c /tmp/profile-megatron/profile-rank0.json > "$OUT/profile-megatron-rank0.json.gz" 2>/dev/null || true
stage compare-trace-megatron "$OUT/compare-trace-megatron.txt" python3 -m twin.cli compare-trace \
    "$OUT/profile-megatron-rank0.json.gz" --schedule "$IN/step-megatron-1gpu.json" --machine "$MACHINE" \
    --figure "$OUT/compare-trace-megatron.png"
if [ ${#failed[@]} -gt 0 ]; then
    echo "device_check: failed stages: ${failed[*]}" >&2
    exit 1
fi
echo "device_check: every stage passed; outputs in $OUT"
