#!/usr/bin/env bash
# Install everything (system packages, .venv, llama.cpp build) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> running the test suite"
exec .venv/bin/python -m pytest -q "$@"
