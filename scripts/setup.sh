#!/usr/bin/env bash
# Install streamtts on a fresh Debian/Ubuntu machine: system packages, a virtual
# environment in .venv with the package, and the llama.cpp bridge (cached outside
# the repo, so a second run takes seconds).
#
#   bash scripts/setup.sh          # runtime (+ model writing, playback, download, examples, redis)
#   bash scripts/setup.sh --quick-test  # runtime + pytest and hypothesis: what the quick tests
#                                  # need (scripts/test.sh tests/core tests/text)
#   bash scripts/setup.sh --test   # also the test tools (pytest, Playwright + Debian's Chromium,
#                                  # redis-server and haproxy for the cluster tests, espeak-ng
#                                  # for the word-timing benchmark and test) and the Vulkan build
#                                  # of llama.cpp, run on Mesa's lavapipe by the vulkan tests
#                                  # (once per cache: ~12 min on 2 cores), and buildah +
#                                  # mmdebstrap for the container image test
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_TEST=0
QUICK_TEST=0
for a in "$@"; do
  case "$a" in
    --test) WITH_TEST=1 ;;
    --quick-test) QUICK_TEST=1 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

step() { echo "==> $*"; }
trap 'echo "setup.sh: FAILED during: ${CURRENT:-start} (exit $?)" >&2' ERR

# -- 1. system packages ------------------------------------------------------------------
CURRENT="system packages"
pkgs=(build-essential cmake python3-venv libportaudio2 libsndfile1 curl)
# The cluster tests start their own redis-server and haproxy (deploy/local-cluster.sh); the
# packages' own services are not used.
[ "$WITH_TEST" = 1 ] && pkgs+=(chromium redis-server haproxy espeak-ng)
# llama.cpp's Vulkan backend (the loader, shader compiler, SPIR-V headers) and Mesa's
# drivers, lavapipe among them: a Vulkan device on the CPU for the vulkan tests
[ "$WITH_TEST" = 1 ] && pkgs+=(libvulkan-dev glslc glslang-tools spirv-headers mesa-vulkan-drivers)
# the container image test (scripts/test_image.sh): buildah builds and runs deploy/Dockerfile,
# mmdebstrap makes its Debian base from packages (no registry needed)
[ "$WITH_TEST" = 1 ] && pkgs+=(buildah mmdebstrap)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  step "installing system packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then SUDO="sudo"; else
      echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  step "system packages present"
fi

# -- 2. python environment ---------------------------------------------------------------
CURRENT="python environment"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
extras="model,audio,hub,examples,redis"
[ "$QUICK_TEST" = 1 ] && extras="$extras,quicktest"
[ "$WITH_TEST" = 1 ] && extras="test"
step "installing streamtts[$extras] into .venv"
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i "warning" || true
.venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v -i "warning" || true
.venv/bin/python -c "import streamtts, numpy, onnxruntime, tokenizers" || { echo "setup.sh: python packages failed to install" >&2; exit 1; }

# -- 3. llama.cpp + bridge -----------------------------------------------------------------
CURRENT="native build"
step "building llama.cpp and the streamtts bridge (cached)"
# (a first build says how long it takes, and shows its progress: native/build.sh, step 4)
PATH="$PWD/.venv/bin:$PATH" bash native/build.sh
if [ "$WITH_TEST" = 1 ]; then
  CURRENT="native build (Vulkan)"
  step "building llama.cpp's Vulkan variant for the vulkan tests (cached)"
  PATH="$PWD/.venv/bin:$PATH" STREAMTTS_VULKAN=1 bash native/build.sh
fi
# speak's default output: say now, not after the first synthesis, when nothing can play
if [ ! -d /dev/snd ] || [ -z "$(ls -A /dev/snd 2>/dev/null)" ]; then
  echo "    no sound card found (/dev/snd is empty): \`streamtts speak\` writes its audio to speak.wav" \
       "instead (or --save FILE)"
fi
step "setup complete: activate with 'source .venv/bin/activate'"
