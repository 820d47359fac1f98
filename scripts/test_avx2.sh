#!/usr/bin/env bash
# The determinism tests (pytest -m determinism: every same-bits / same-codes claim that BLAS or
# ggml kernels could break) against AVX2-only kernels, whatever this CPU has: llama.cpp built
# with STREAMTTS_CPU_ISA=avx2 (GGML_NATIVE=OFF, AVX2/FMA/F16C on, AVX-512 off; its own cache
# folder and pointer, current-cpu-avx2) and NumPy's OpenBLAS on its Haswell kernels. What an
# AMD EPYC Zen 2/3 or an older Intel runs. scripts/test.sh runs it before the whole suite.
#
#   bash scripts/test_avx2.sh            # build (cached after the first time), then the tests
#   bash scripts/test_avx2.sh -k heads   # extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "test_avx2.sh: no .venv yet; run bash scripts/setup.sh --test first" >&2; exit 1; }
echo "==> building llama.cpp with AVX2-only kernels (first time: about 5 CPU-minutes; cached after)"
STREAMTTS_CPU_ISA=avx2 PATH="$PWD/.venv/bin:$PATH" bash native/build.sh
lib="$(STREAMTTS_CPU_ISA=avx2 bash native/build.sh --print-lib)"
echo "==> determinism tests on AVX2 kernels (bridge $lib, OPENBLAS_CORETYPE=Haswell)"
STREAMTTS_BRIDGE_LIB="$lib" OPENBLAS_CORETYPE=Haswell exec "$PY" -m pytest -q -m determinism "$@"
