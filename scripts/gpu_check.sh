#!/usr/bin/env bash
# GPU check: build the CUDA path, run the GPU tests, measure an 8B-shaped model, print one table.
#
#   scripts/gpu_check.sh [--work DIR] [--quant Q4_K_M|Q4_0] [--concurrency "1 2 4 8 16 32 64"]
#   scripts/gpu_check.sh --dry-run-cpu [--work DIR]   same pipeline, tiny shape, CPU build
#
# On one NVIDIA GPU (H100/H200 class, 16 cores) it takes under 8 minutes:
#   1. llama.cpp + bridge with CUDA (STREAMTTS_CUDA=1, kernels for this GPU's arch only;
#      flash attention and CUDA graphs on), cached in ~/.cache/streamtts
#   2. onnxruntime-gpu into a side folder (not the venv) when it is not there and pip can get it
#   3. pytest -m gpu (tests/model/test_gpu.py, the ONNX Runtime CUDA codec tests, the streaming codec on CUDA and TensorRT)
#   4. benchmarks/gpu_check.py: random Qwen3-8B-shaped Q4_K_M GGUF + real-sized npy tables,
#      streamtts convert (fused heads), bare llama.cpp decode loop, engine single-stream TTFA and
#      per-step ms, streamtts bench over the concurrency levels; one table on stdout
#
# Needs nvidia-smi, nvcc, cmake, a C/C++ compiler and a Python with streamtts's dependencies
# (PYTHON, else .venv/bin/python, else python3). Without network, the llama.cpp source must
# already be in the build cache or given as LLAMA_CPP_DIR.
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
cd "$REPO"

DRY=0
WORK=""
QUANT=Q4_K_M
LEVELS="1 2 4 8 16 32 64"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run-cpu) DRY=1 ;;
        --work) WORK="$2"; shift ;;
        --quant) QUANT="$2"; shift ;;
        --concurrency) LEVELS="$2"; shift ;;
        -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
else PY=python3
fi
WORK="${WORK:-${TMPDIR:-/tmp}/streamtts-gpu-check$([[ $DRY == 1 ]] && echo -cpu)}"
mkdir -p "$WORK"
T_ALL=$SECONDS
SUMMARY=()

phase() { echo "==> $*"; T_PHASE=$SECONDS; }
done_phase() { SUMMARY+=("$(printf '%-34s %4d s  %s' "$1" $((SECONDS - T_PHASE)) "${2:-}")"); }

# -- 1. build -----------------------------------------------------------------------------
if [[ $DRY == 1 ]]; then
    phase "building llama.cpp + bridge (CPU, dry run)"
    bash native/build.sh >"$WORK/build.log" 2>&1 || { tail -n 30 "$WORK/build.log" >&2; exit 1; }
    export STREAMTTS_CUDA=0
    done_phase "build (cpu)"
else
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
        || { echo "error: no NVIDIA GPU visible (nvidia-smi); use --dry-run-cpu on CPU machines" >&2; exit 1; }
    ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')"
    phase "building llama.cpp + bridge with CUDA for sm_$ARCH"
    STREAMTTS_CUDA=1 STREAMTTS_CUDA_ARCH="${STREAMTTS_CUDA_ARCH:-$ARCH}" bash native/build.sh \
        >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; exit 1; }
    export STREAMTTS_CUDA=1
    done_phase "build (cuda, sm_$ARCH)"

    # -- 2. onnxruntime-gpu, beside the venv (installing it into the venv would fight
    #       with the CPU onnxruntime package over the same module name)
    phase "onnxruntime-gpu"
    if "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
        done_phase "onnxruntime-gpu" "already there"
    elif timeout 180 "$PY" -m pip install -q --no-deps --target "$WORK/ort-gpu" onnxruntime-gpu >"$WORK/ort.log" 2>&1; then
        export PYTHONPATH="$WORK/ort-gpu${PYTHONPATH:+:$PYTHONPATH}"
        done_phase "onnxruntime-gpu" "installed in $WORK/ort-gpu"
    else
        done_phase "onnxruntime-gpu" "not installable here (no network?): ORT CUDA tests skip"
    fi
fi

# -- 3. GPU tests ---------------------------------------------------------------------------
phase "pytest -m gpu"
set +e
"$PY" -m pytest -q -m gpu tests/model/test_gpu.py tests/codec/test_codec_onnx.py tests/codec/test_codec_streaming.py tests/codec/test_trt_streaming.py -p no:cacheprovider >"$WORK/pytest-gpu.log" 2>&1
RC=$?
set -e
RESULT="$(tail -n 1 "$WORK/pytest-gpu.log")"
if [[ $RC != 0 && $RC != 5 ]]; then
    echo "GPU tests failed (exit $RC):" >&2
    tail -n 60 "$WORK/pytest-gpu.log" >&2
fi
done_phase "pytest -m gpu" "$RESULT"

# -- 4. measurements --------------------------------------------------------------------------
phase "measurements (benchmarks/gpu_check.py)"
ARGS=(--work "$WORK/model" --quant "$QUANT" --json "$WORK/gpu-check.json")
if [[ $DRY == 1 ]]; then
    ARGS+=(--shape tiny --gpu-layers 0 --threads 1 --bare-steps 20 --streams 2 --frames 8 --concurrency 1 2)
else
    # shellcheck disable=SC2206
    ARGS+=(--shape 8b --gpu-layers -1 --concurrency $LEVELS)
fi
"$PY" benchmarks/gpu_check.py "${ARGS[@]}" | tee "$WORK/table.txt"
done_phase "measurements"

echo
echo "==> summary ($((SECONDS - T_ALL)) s total; logs in $WORK)"
printf '%s\n' "${SUMMARY[@]}"
if [[ $RC != 0 && $RC != 5 ]]; then exit 1; fi
