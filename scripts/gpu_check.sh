#!/usr/bin/env bash
# GPU check: build the CUDA path, run the GPU tests, measure an 8B-shaped model, print one table.
#
#   scripts/gpu_check.sh --make-kit DIR               write the lease kit (needs PyPI; see below)
#   scripts/gpu_check.sh --kit DIR [--work W] [--logs L] [--budget S]
#                                                     the GPU run, offline, from the kit alone
#   scripts/gpu_check.sh --dry-run-cpu --kit DIR      the same pipeline, tiny shape, CPU build
#   scripts/gpu_check.sh [--dry-run-cpu]              without a kit: source from the build cache
#                                                     or PyPI, onnxruntime-gpu with pip if it can
# Other options: --quant Q4_K_M|Q4_0, --concurrency "1 8 32 64 128", --work DIR (default
# $TMPDIR/streamtts-gpu-check[-cpu]), --logs DIR (default $OUT when set: the logs and the
# table are copied there), --budget S (seconds for the whole run; stages that would start
# later are skipped and the table says so; default 510 on a GPU, none on CPU).
#
# The kit (scripts/gpu_kit.py, manifest.json inside) holds what a lent GPU machine (no
# network, 64 MiB of files per command) lacks: the llama.cpp source trimmed to what CMake
# builds, and wheels of the Python packages the run imports that its image has not. With
# --kit the wheels go into WORK/site (never the environment), the source is unpacked under
# the cache, keyed by its hash (STREAMTTS_CACHE, default ~/.cache/streamtts/kit: a build of
# the same kit is reused), and nothing is fetched. With --dry-run-cpu --kit the Python also
# imports from its own environment only what the GPU image has (gpu_kit.py guard), so the
# rehearsal fails on anything the kit misses (tests/scripts/test_gpu_check.py runs it under unshare -n).
#
# On one NVIDIA GPU (H100/H200 class, 16 cores), within --budget:
#   1. llama.cpp + bridge with CUDA (STREAMTTS_CUDA=1, kernels for STREAMTTS_CUDA_ARCH or
#      this GPU's arch only; flash attention and CUDA graphs on)
#   2. pytest -m gpu (with --kit: tests/model/test_gpu.py, the tests that need neither
#      onnxruntime-gpu nor TensorRT; without: also the ORT CUDA and TensorRT codec tests)
#   3. benchmarks/gpu_check.py: random Qwen3-8B-shaped Q4_K_M GGUF + real-sized npy tables,
#      fused f16 heads (streamtts convert), bare llama.cpp decode, engine single-stream TTFA
#      and step ms, streamtts bench over the levels (tone codec: the backbone alone; a
#      real-architecture codec on ONNX Runtime CPU), bench --null-backbone (the CPU side of
#      a tick), GPU memory per stream, and twice the load it can carry (benchmarks/engine_load.py:
#      Poisson arrivals, real-time listeners, admission by measured capacity); one table, printed last
#
# Needs nvidia-smi, nvcc, cmake, a C/C++ compiler and a Python with numpy, onnxruntime,
# onnx, tokenizers, pyyaml, rich, threadpoolctl (PYTHON, else .venv/bin/python, else python3).
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
cd "$REPO"

DRY=0
WORK=""
KIT=""
MAKE_KIT=""
LOGS="${OUT:-}"
BUDGET=""
QUANT=Q4_K_M
LEVELS="1 8 32 64 128"
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "error: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run-cpu) DRY=1 ;;
        --work) need "$@"; WORK="$2"; shift ;;
        --kit) need "$@"; KIT="$2"; shift ;;
        --make-kit) need "$@"; MAKE_KIT="$2"; shift ;;
        --logs) need "$@"; LOGS="$2"; shift ;;
        --budget) need "$@"; BUDGET="$2"; shift ;;
        --quant) need "$@"; QUANT="$2"; shift ;;
        --concurrency) need "$@"; LEVELS="$2"; shift ;;
        -h|--help) sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [[ -n "$BUDGET" && ! "$BUDGET" =~ ^[0-9]+$ ]]; then
    echo "error: --budget takes whole seconds, got '$BUDGET'" >&2; exit 2
fi

if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
else PY=python3
fi

if [[ -n "$MAKE_KIT" ]]; then
    exec "$PY" scripts/gpu_kit.py make "$MAKE_KIT"
fi

WORK="${WORK:-${TMPDIR:-/tmp}/streamtts-gpu-check$([[ $DRY == 1 ]] && echo -cpu)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
T_ALL=$SECONDS
if [[ -z "$BUDGET" ]]; then BUDGET=$([[ $DRY == 1 ]] && echo 0 || echo 510); fi
DEADLINE=0
if [[ "$BUDGET" != 0 ]]; then DEADLINE=$(( $(date +%s) + BUDGET )); fi
SUMMARY=()
RC=0

phase() { echo "==> $*"; T_PHASE=$SECONDS; }
done_phase() { SUMMARY+=("$(printf '%-34s %4d s  %s' "$1" $((SECONDS - T_PHASE)) "${2:-}")"); }
# seconds left (at least 1: `timeout 0` would mean no limit at all)
left() {
    if [[ $DEADLINE == 0 ]]; then echo 100000; return; fi
    local s=$(( DEADLINE - $(date +%s) ))
    echo $(( s > 1 ? s : 1 ))
}

# The logs and the table go to LOGS (the device's returned-files folder): at most 8 files.
save_logs() {
    [[ -n "$LOGS" ]] || return 0
    mkdir -p "$LOGS"
    local f
    for f in table.txt gpu-check.json pytest-gpu.log measure.log kit.log probe.log; do
        [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$LOGS/$f"
    done
    # a CUDA build log runs to megabytes: its end says what failed
    [[ -f "$WORK/build.log" ]] && tail -n 3000 "$WORK/build.log" >"$LOGS/build.log"
    { printf '%s\n' "${SUMMARY[@]}"; command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 || true; } \
        >"$LOGS/summary.txt"
}
trap save_logs EXIT

# -- 0. the kit -----------------------------------------------------------------------------
if [[ -n "$KIT" ]]; then
    phase "the kit: $KIT"
    [[ -d "$KIT" ]] || { echo "error: --kit $KIT is not a folder (make one with --make-kit)" >&2; exit 1; }
    KIT="$(cd "$KIT" && pwd)"
    : >"$WORK/kit.log"
    # the kit's own check: every file listed, sizes and hashes right, under the limit
    "$PY" scripts/gpu_kit.py check "$KIT" | tee -a "$WORK/kit.log"
    SITE="$WORK/site"
    rm -rf "$SITE"
    "$PY" scripts/gpu_kit.py install "$KIT" "$SITE" >>"$WORK/kit.log" 2>&1 \
        || { cat "$WORK/kit.log" >&2; echo "error: installing the kit's wheels into $SITE failed" >&2; exit 1; }
    if [[ $DRY == 1 ]]; then
        "$PY" scripts/gpu_kit.py guard "$SITE" >>"$WORK/kit.log"
    fi
    export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
    # nothing may be fetched: pip without an index, the hub offline
    export PIP_NO_INDEX=1 HF_HUB_OFFLINE=1
    if [[ -z "${STREAMTTS_CACHE:-}" ]]; then
        STREAMTTS_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/streamtts/kit"
    fi
    export STREAMTTS_CACHE
    LLAMA_CPP_DIR="$("$PY" scripts/gpu_kit.py llama-src "$KIT" "$STREAMTTS_CACHE/native/src")"
    export LLAMA_CPP_DIR
    "$PY" - >>"$WORK/kit.log" 2>&1 <<'PYEOF'
import sys
print("python", sys.version.split()[0], sys.executable)
for name in ("numpy", "onnxruntime", "onnx", "tokenizers", "yaml", "rich", "msgspec", "gguf"):
    m = __import__(name)
    print(f"  {name} {getattr(m, '__version__', '?')} {getattr(m, '__file__', '')}")
PYEOF
    done_phase "kit" "wheels in $SITE, llama.cpp in $LLAMA_CPP_DIR"
fi

# -- 1. build -----------------------------------------------------------------------------
if [[ $DRY == 1 ]]; then
    phase "building llama.cpp + bridge (CPU, dry run)"
    STREAMTTS_CUDA=0 bash native/build.sh >"$WORK/build.log" 2>&1 || { tail -n 30 "$WORK/build.log" >&2; exit 1; }
    export STREAMTTS_CUDA=0
    done_phase "build (cpu)" "$(grep -m1 -o 'done in [0-9]* s' "$WORK/build.log" | tail -n1)"
else
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
        || { echo "error: no NVIDIA GPU visible (nvidia-smi); use --dry-run-cpu on CPU machines" >&2; exit 1; }
    ARCH="${STREAMTTS_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')}"
    phase "building llama.cpp + bridge with CUDA for sm_$ARCH"
    STREAMTTS_CUDA=1 STREAMTTS_CUDA_ARCH="$ARCH" timeout "$(left)" bash native/build.sh \
        >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; echo "error: the CUDA build failed or ran out of time" >&2; exit 1; }
    export STREAMTTS_CUDA=1
    done_phase "build (cuda, sm_$ARCH)"

    # -- onnxruntime-gpu, beside the environment (installing it there would fight with the
    #    CPU onnxruntime package over the same module name); never from a kit: its wheel is
    #    far over a lease's 64 MiB and the machine has no network
    phase "onnxruntime-gpu"
    if "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
        done_phase "onnxruntime-gpu" "already there"
    elif [[ -n "$KIT" ]]; then
        done_phase "onnxruntime-gpu" "not in the kit: ORT CUDA tests not run"
    elif timeout 180 "$PY" -m pip install -q --no-deps --target "$WORK/ort-gpu" onnxruntime-gpu >"$WORK/ort.log" 2>&1; then
        export PYTHONPATH="$WORK/ort-gpu${PYTHONPATH:+:$PYTHONPATH}"
        done_phase "onnxruntime-gpu" "installed in $WORK/ort-gpu"
    else
        done_phase "onnxruntime-gpu" "not installable here (no network?): ORT CUDA tests skip"
    fi
fi

# -- 1b. a model loads through this build -------------------------------------------------------
# A tiny random GGUF, every layer on the GPU: a build that cannot load a model stops here,
# with the native stack (cuda-gdb is on the GPU image, gdb is not) and which of the linked
# libraries export C++ runtime symbols (one that does shadows libstdc++ for libllama).
phase "loading a model through the bridge"
cat >"$WORK/probe.py" <<'PYEOF'
import sys
from pathlib import Path

from streamtts.demo import random_quant
from streamtts.model.backbone import Backbone, BackboneParams

path = Path(sys.argv[1])
if not path.is_file():
    random_quant.write_gguf(path, random_quant.SHAPES["tiny"], "Q4_K_M")
b = Backbone(BackboneParams(model_path=str(path), n_ctx=256, n_batch=64, n_seq_max=1, n_threads=2,
                            n_gpu_layers=int(sys.argv[2])))
print("loaded: n_embd", b.n_embd)
PYEOF
PROBE_ARGS=("$WORK/probe.gguf" "$([[ $DRY == 1 ]] && echo 0 || echo -1)")
if timeout 120 "$PY" -X faulthandler "$WORK/probe.py" "${PROBE_ARGS[@]}" >"$WORK/probe.log" 2>&1; then
    done_phase "model load" "$(tail -n 1 "$WORK/probe.log")"
else
    LIBDIR="${STREAMTTS_CACHE:-$HOME/.cache/streamtts}/native/current-$([[ $DRY == 1 ]] && echo cpu || echo cuda)/lib"
    set +e  # what follows only gathers evidence
    {
        echo "--- the load failed; std:: symbols each library defines (nm -D): all, and std::locale / ios_base ones"
        for lib in $(ldd "$LIBDIR"/libggml-*.so "$LIBDIR"/libllama.so 2>/dev/null | awk '/=> \//{print $3}' | sort -u); do
            syms="$(nm -D --defined-only "$lib" 2>/dev/null || true)"
            printf '%6s %6s  %s\n' "$(grep -cE '_ZNSt|_ZNKSt|_ZSt' <<<"$syms")" \
                "$(grep -cE '_ZNSt6locale|_ZNKSt6locale|_ZNSt8ios_base' <<<"$syms")" "$lib"
        done
        if command -v cuda-gdb >/dev/null; then
            echo "--- cuda-gdb backtrace:"
            timeout 120 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args "$PY" "$WORK/probe.py" "${PROBE_ARGS[@]}" 2>&1 | tail -n 120
        fi
    } >>"$WORK/probe.log" 2>&1
    set -e
    STDCXX="$(g++ -print-file-name=libstdc++.so.6 2>/dev/null || true)"
    if [[ -f "$STDCXX" ]] && LD_PRELOAD="$STDCXX" timeout 120 "$PY" -X faulthandler "$WORK/probe.py" "${PROBE_ARGS[@]}" >>"$WORK/probe.log" 2>&1; then
        export LD_PRELOAD="$STDCXX"
        done_phase "model load" "failed, then loaded with LD_PRELOAD=$STDCXX (kept for the run; probe.log says why)"
    else
        done_phase "model load" "failed (probe.log: the stack and the libraries)"
        tail -n 80 "$WORK/probe.log" >&2
        echo "error: a model does not load through this build; see $WORK/probe.log" >&2
        exit 1
    fi
fi

# -- 2. GPU tests ---------------------------------------------------------------------------
phase "pytest -m gpu"
TESTS=(tests/model/test_gpu.py)
if [[ -z "$KIT" ]]; then
    TESTS+=(tests/codec/test_codec_onnx.py tests/codec/test_codec_streaming.py tests/codec/test_trt_streaming.py)
fi
set +e
timeout "$(left)" "$PY" -m pytest -q -m gpu "${TESTS[@]}" -p no:cacheprovider >"$WORK/pytest-gpu.log" 2>&1
TRC=$?
set -e
RESULT="$(tail -n 1 "$WORK/pytest-gpu.log")"
if [[ $TRC != 0 && $TRC != 5 ]]; then
    RC=1
    echo "GPU tests failed (exit $TRC):" >&2
    tail -n 60 "$WORK/pytest-gpu.log" >&2
fi
done_phase "pytest -m gpu" "$RESULT"

# -- 3. measurements --------------------------------------------------------------------------
phase "measurements (benchmarks/gpu_check.py)"
ARGS=(--work "$WORK/model" --quant "$QUANT" --json "$WORK/gpu-check.json" --deadline "$DEADLINE")
if [[ $DRY == 1 ]]; then
    ARGS+=(--shape tiny --gpu-layers 0 --threads 1 --bare-steps 20 --streams 2 --frames 8
           --concurrency 1 2 --null-levels 2 4 --codec-scale tiny
           "--load-stage=--load 2 --max-streams 4 --probe 4 --duration 6 --min-s 1 --max-s 3")
else
    # shellcheck disable=SC2206
    ARGS+=(--shape 8b --gpu-layers -1 --concurrency $LEVELS --null-levels 64 128 --codec-scale 0.25)
fi
set +e
# the stages watch the deadline themselves; the timeout is for a stage that hangs
PYTHONUNBUFFERED=1 timeout "$(( $(left) + 20 ))" "$PY" benchmarks/gpu_check.py "${ARGS[@]}" \
    >"$WORK/measure.log" 2>&1
MRC=$?
set -e
if [[ $MRC != 0 ]]; then
    RC=1
    echo "benchmarks/gpu_check.py failed (exit $MRC):" >&2
    tail -n 40 "$WORK/measure.log" >&2
fi
done_phase "measurements" "exit $MRC"

# the table last: from the stages' JSON, also when the run stopped part way
if [[ -f "$WORK/gpu-check.json" ]]; then
    "$PY" benchmarks/gpu_check.py --table-from "$WORK/gpu-check.json" >"$WORK/table.txt" 2>&1 || RC=1
fi
echo
echo "==> summary ($((SECONDS - T_ALL)) s total; logs in $WORK${LOGS:+, copied to $LOGS})"
printf '%s\n' "${SUMMARY[@]}"
echo
[[ -f "$WORK/table.txt" ]] && cat "$WORK/table.txt"
exit $RC
