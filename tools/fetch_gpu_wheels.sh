#!/usr/bin/env bash
# Download everything tools/gpu_check.sh installs, for a GPU machine without internet.
#
# Run here (with internet), from the repository root:
#     bash tools/fetch_gpu_wheels.sh            # into shared/wheels/ (git-ignored)
#     WHEEL_DIR=/some/dir PY_VERSION=3.12 bash tools/fetch_gpu_wheels.sh
# then send the folder with the tree: shared/ travels to the device machine as is (or
# name the folder in the device run's `carry`; mind its 64 MiB cap: the CUDA wheels are
# ~3 GiB, so shared/ is the way). PY_VERSION must be the GPU machine's python3 (the
# check prints it and stops when no wheel matches).
#
# onnxruntime-gpu's extras `cuda` and `cudnn` pull the NVIDIA runtime wheels
# (nvidia-cuda-runtime-cu12, nvidia-cublas-cu12, nvidia-cudnn-cu12, nvidia-cufft-cu12,
# nvidia-curand-cu12, nvidia-cuda-nvrtc-cu12); onnxruntime.preload_dlls() loads them, so
# the machine needs only the driver.
set -euo pipefail

cd "$(dirname "$0")/.." || exit 2
WHEEL_DIR="${WHEEL_DIR:-shared/wheels}"
PY_VERSION="${PY_VERSION:-$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"
PLATFORM="${PLATFORM:-manylinux_2_28_x86_64}"
ORT_GPU="${ORT_GPU:-onnxruntime-gpu[cuda,cudnn]>=1.20}"
OG_CUDA="${OG_CUDA:-onnxruntime-genai-cuda==0.18.0}"
PIP="${PIP:-.venv/bin/pip}"
[ -x "$PIP" ] || PIP="python3 -m pip"

mkdir -p "$WHEEL_DIR"
# What the GPU tests and bench/decode.py import (not the app: no Qt on the GPU machine).
read -r -a PACKAGES <<< "numpy>=1.24 onnx>=1.16 onnx-ir tokenizers>=0.19 jinja2>=3.1 pyyaml>=6.0 platformdirs>=4.0 psutil>=5.9 huggingface_hub>=0.24 nvidia-ml-py>=12 pytest>=8"
# shellcheck disable=SC2086  # PIP may be "python3 -m pip"
$PIP download --dest "$WHEEL_DIR" --only-binary=:all: \
    --python-version "$PY_VERSION" --platform "$PLATFORM" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_27_x86_64 --platform linux_x86_64 \
    "$ORT_GPU" "$OG_CUDA" "${PACKAGES[@]}"
echo "wheels for python $PY_VERSION in $WHEEL_DIR ($(du -sh "$WHEEL_DIR" | cut -f1))"
