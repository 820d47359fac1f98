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
#
# The quick tests: `bash scripts/test.sh tests/core tests/text` (only folders of pure code
# named: tests/core, tests/text, tests/timing, tests/kernels, tests/audio) installs only what
# they need (scripts/setup.sh --quick-test: the runtime, pytest and hypothesis; no browser,
# Redis, HAProxy or Vulkan build).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "$#" -gt 0 ]; then
  quick=1
  for a in "$@"; do
    case "$a" in
      tests/core|tests/core/*|tests/text|tests/text/*|tests/timing|tests/timing/*) ;;
      tests/kernels|tests/kernels/*|tests/audio|tests/audio/*) ;;
      -*) ;;  # pytest's own options
      *) quick=0 ;;
    esac
  done
fi
setup=(bash scripts/setup.sh --test)
[ "$quick" = 1 ] && setup=(bash scripts/setup.sh --quick-test)
if [ "${STREAMTTS_TEST_PLAN:-0}" = 1 ]; then  # say which setup these arguments get, and stop
  echo "${setup[*]}"
  exit 0
fi
"${setup[@]}"
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
