#!/usr/bin/env bash
# Install everything (system packages, .venv, llama.cpp build) and run the whole test suite.
# With no arguments (the whole suite, as CI runs it) the determinism tests first run once on
# AVX2-only kernels (scripts/test_avx2.sh: a portable AVX2 build of llama.cpp and OpenBLAS's
# Haswell kernels), so a claim that holds only on this machine's kernels fails here;
# STREAMTTS_TEST_AVX2=0 skips that run. Before the suite the CPU wheel is built (or found in
# its cache) by scripts/test_wheel.sh --build, for tests/scripts/test_wheel.py;
# STREAMTTS_TEST_WHEEL=0 skips that step. The container image is built (or found in its cache)
# by scripts/test_image.sh --build, for tests/deploy/test_image.py; STREAMTTS_TEST_IMAGE=0
# skips that step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ "$#" = 0 ] && [ "${STREAMTTS_TEST_AVX2:-1}" != 0 ]; then
  bash scripts/test_avx2.sh
fi
# the CPU wheel (cached by a hash of its inputs; from scratch it compiles every ggml CPU
# variant, with progress here): tests/scripts/test_wheel.py installs and runs it
if [ "$#" = 0 ] && [ "${STREAMTTS_TEST_WHEEL:-1}" != 0 ]; then
  echo "==> building the CPU wheel (scripts/test_wheel.sh --build; cached)"
  bash scripts/test_wheel.sh --build
fi
# the container image (deploy/Dockerfile on a Debian base made from packages; cached by a
# hash of its inputs, rebuilt only when they change): tests/deploy/test_image.py runs it
if [ "$#" = 0 ] && [ "${STREAMTTS_TEST_IMAGE:-1}" != 0 ]; then
  echo "==> building the container image (scripts/test_image.sh --build; cached)"
  bash scripts/test_image.sh --build
fi
echo "==> running the test suite"
exec .venv/bin/python -m pytest -q "$@"
