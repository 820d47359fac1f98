#!/usr/bin/env bash
# Install everything (system packages, .venv, llama.cpp build) and run the whole test suite,
# then its determinism tests on AVX2-only kernels (scripts/test_avx2.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> running the test suite"
.venv/bin/python -m pytest -q "$@"
# with no arguments (the whole suite, as CI runs it): the determinism tests once more on
# AVX2-only kernels (scripts/test_avx2.sh); STREAMTTS_TEST_AVX2=0 skips them
if [ "$#" = 0 ] && [ "${STREAMTTS_TEST_AVX2:-1}" != 0 ]; then
  exec bash scripts/test_avx2.sh
fi
