#!/usr/bin/env bash
# One GPU check, run in one go on a machine with an NVIDIA GPU (about 5 minutes):
# install the CUDA extra from carried wheels (no internet), run the `gpu` tests, and
# run bench/decode.py on CUDA (our engine eager and with CUDA graphs, onnxruntime-genai).
#
#     bash tools/gpu_check.sh                 # results under $OUT (or ./gpu_check_out)
#
# Wheels: tools/fetch_gpu_wheels.sh, run beforehand on a machine with internet, fills
# shared/wheels/ (WHEEL_DIR overrides). Writes to $OUT: env.txt, pytest.txt, junit.xml,
# bench-eager.json and bench-graph.json (bench/decode.py), summary.txt.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-$PWD/gpu_check_out}"
WHEEL_DIR="${WHEEL_DIR:-shared/wheels}"
VENV="${GPU_VENV:-/tmp/gpu-check-venv}"
mkdir -p "$OUT"
status=0

log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

{ nvidia-smi || echo "nvidia-smi failed"; python3 --version; } > "$OUT/env.txt" 2>&1
if [ ! -d "$WHEEL_DIR" ]; then
    log "no wheels in $WHEEL_DIR: run tools/fetch_gpu_wheels.sh first"; exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || { log "python3 -m venv failed"; exit 2; }
fi
PY="$VENV/bin/python"
if ! "$PY" -m pip install --quiet --no-index --find-links "$WHEEL_DIR" \
        "onnxruntime-gpu[cuda,cudnn]" onnxruntime-genai-cuda numpy onnx onnx-ir tokenizers \
        jinja2 pyyaml platformdirs psutil huggingface_hub nvidia-ml-py pytest \
        >> "$OUT/env.txt" 2>&1; then
    log "pip install from $WHEEL_DIR failed (python $("$PY" -V 2>&1)): see env.txt"; exit 2
fi
# The NVIDIA runtime wheels' libraries, for every process (pytest, bench workers).
NV_LIBS="$("$PY" -c 'import glob, os, site
dirs = [d for p in site.getsitepackages() for d in glob.glob(os.path.join(p, "nvidia", "*", "lib"))]
print(":".join(sorted(dirs)))')"
export LD_LIBRARY_PATH="${NV_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD"
"$PY" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' \
    >> "$OUT/env.txt" 2>&1

# 1. The gpu tests (they skip without CUDA: a skip here is a failure), then the
#    device-path and gate tests that also run on the CPU.
if timeout 240 "$PY" -m pytest -m gpu -rA -p no:cacheprovider --junitxml="$OUT/junit.xml" \
        tests/engine/runtime/test_gpu.py > "$OUT/pytest.txt" 2>&1 \
        && ! grep -q "SKIPPED" "$OUT/pytest.txt"; then
    log "gpu tests: passed"
else
    status=1; log "gpu tests: FAILED or skipped (see pytest.txt)"
fi
tail -n 1 "$OUT/pytest.txt" | tee -a "$OUT/summary.txt"
if timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/engine/runtime/test_decode_device.py \
        tests/engine/runtime/test_cuda_graph.py > "$OUT/pytest-cpu-path.txt" 2>&1; then
    log "device-path tests on this machine's CPU: passed"
else
    status=1; log "device-path tests: FAILED (see pytest-cpu-path.txt)"
fi

# 2. Decode bench on CUDA: ours eager, ours with CUDA graphs, onnxruntime-genai.
export ONNX_GENAI_BACKEND=cuda
BENCH_DIR="${BENCH_DIR:-/tmp/gpu-check-bench}"  # models are built there once, not in $OUT
bench() {  # name, extra env...
    local name="$1" rc=0; shift
    env "$@" timeout 150 "$PY" -m bench.decode --quick --precisions fp32 \
        --prompt-lens 32,512 --arms "${ARMS:-ours,og}" --out "$BENCH_DIR" \
        > "$OUT/$name.txt" 2>&1 || rc=$?
    cp "$BENCH_DIR/decode.json" "$OUT/$name.json" 2>/dev/null && rm -f "$BENCH_DIR/decode.json"
    # bench.decode also exits 1 when a speed target is missed: the JSON says which
    [ "$rc" -eq 0 ] || status=1
    log "bench $name: exit $rc ($OUT/$name.json, log $name.txt)"
}
bench bench-eager ONNX_GENAI_CUDA_GRAPH=0
ARMS=ours bench bench-graph ONNX_GENAI_CUDA_GRAPH=1
log "exit status $status"
exit "$status"
