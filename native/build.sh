#!/usr/bin/env bash
# Build llama.cpp (the copy vendored by llama-cpp-python) and the streamtts bridge into the
# developer cache: a thin wrapper around the CMake project at the top of the repository
# (CMakeLists.txt, the same one `pip install .` builds into the package's streamtts/lib/).
# This script adds the options below, one cached build per set of options, and the
# current-* pointers the Python side finds (streamtts/model/_llama.py: the package's own
# libraries first, then these).
#
#   native/build.sh               build (or refresh) the CPU variant
#   STREAMTTS_CUDA=1 native/build.sh   build the CUDA variant
#   STREAMTTS_VULKAN=1 native/build.sh build the Vulkan variant (AMD/Intel GPUs, lavapipe)
#   native/build.sh --print-lib   print the bridge library the Python side will load
#   native/build.sh --configure-only   stop after configuring llama.cpp (checks options fast)
#   native/build.sh --clean       remove every build, pointer and downloaded source
#
# Everything lands outside the repository, in
#   ${STREAMTTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts}/native/
#     src/llama_cpp_python-<ver>/vendor/llama.cpp   downloaded source (unless LLAMA_CPP_DIR;
#                                                   cmake/llama_source.cmake pins its SHA256)
#     <key>/build/                                  cmake build tree
#     <key>/stage/                                  `cmake --install` of the build
#     <key>/lib/                                    libstreamtts_bridge.so + libllama/libggml*.so
#     vulkan-headers/<deb version>/usr/include      newer Vulkan headers (Vulkan variant only)
#     current-cpu, current-cuda, current-vulkan     symlinks to the <key> folder last built
# <key> hashes the llama.cpp version and every option that changes the binaries, so
# switching options never reuses a stale build, and a second run with the same options
# only checks that nothing changed (seconds).
#
# Environment:
#   LLAMA_CPP_DIR            use this llama.cpp source tree instead of downloading the sdist
#   STREAMTTS_CUDA=1         build with -DGGML_CUDA=ON (flash attention kernels, CUDA graphs)
#   STREAMTTS_VULKAN=1       build with -DGGML_VULKAN=ON. Needs the Vulkan loader, glslc and
#                            SPIR-V headers (Debian: libvulkan-dev glslc glslang-tools
#                            spirv-headers; mesa-vulkan-drivers for a device). Debian 12's Vulkan
#                            headers are too old for this llama.cpp: when /usr/include has an
#                            older VK_HEADER_VERSION than 1.4, Debian 13's libvulkan-dev is
#                            fetched with apt-get download (a private sources list; nothing is
#                            installed) and unpacked into the cache; STREAMTTS_VULKAN_INCLUDE
#                            names a header folder instead
#   STREAMTTS_CUDA_ARCH      CMAKE_CUDA_ARCHITECTURES, e.g. 90 (H100/H200), 89 (L4, RTX 40xx),
#                            86 (A10, RTX 30xx), 80 (A100). Default: "native" when nvidia-smi
#                            sees a GPU, else "80;86;89;90" (slower to build)
#   STREAMTTS_NATIVE=0       build portable binaries (-DGGML_NATIVE=OFF); default 1 (-march=native)
#   STREAMTTS_CPU_ISA=avx2   CPU: a portable build with AVX2/FMA/F16C/BMI2 kernels and no AVX-512
#                            (what an AMD EPYC Zen 2/3 or a Haswell runs), whatever this CPU has;
#                            its own pointer current-cpu-avx2, so it never replaces current-cpu.
#                            The determinism tests run against it (scripts/test.sh --avx2)
#   STREAMTTS_OPENMP=1       use OpenMP for llama.cpp's CPU threads (default 0: ggml's own
#                            thread pool, which the bridge can make sleep instead of spin)
#   STREAMTTS_BATCH_INVARIANT=1  CPU: -DGGML_LLAMAFILE=OFF, so a row's result never depends on
#                            how many rows share its batch (bit-identical streams alone or
#                            batched, also when sampling); prefill about 2x slower on CPU
#   STREAMTTS_AMX=1          keep ggml's AMX kernels in a -march=native build (default 0: off; on a
#                            Firecracker VM they died with SIGILL on `tilezero` mid-decode)
#   STREAMTTS_BUILD_JOBS     parallel build jobs (default: number of CPUs)
#   STREAMTTS_BUILD_VERBOSE=1  show cmake/compiler output instead of logging it to a file
#   CC, CXX                  compilers
set -Eeuo pipefail

N_STEPS=7

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
SOURCE_CMAKE="$REPO/cmake/llama_source.cmake"
# the pinned llama-cpp-python release, from the one place that names it
LLAMA_CPP_PYTHON_VERSION="$(sed -n 's/^set(STREAMTTS_LLAMA_CPP_PYTHON_VERSION "\(.*\)")$/\1/p' "$SOURCE_CMAKE")"
[[ -n "$LLAMA_CPP_PYTHON_VERSION" ]] || { echo "error: no STREAMTTS_LLAMA_CPP_PYTHON_VERSION in $SOURCE_CMAKE" >&2; exit 2; }
CACHE_ROOT="${STREAMTTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts}"
NATIVE_DIR="$CACHE_ROOT/native"
BRIDGE_NAME="libstreamtts_bridge.so"

VARIANT=cpu
if [[ "${STREAMTTS_CUDA:-0}" == 1 ]]; then VARIANT=cuda; fi
CPU_ISA="${STREAMTTS_CPU_ISA:-}"
case "$CPU_ISA" in
    "") ;;
    avx2) [[ "$VARIANT" == cpu ]] || { echo "error: STREAMTTS_CPU_ISA=avx2 is for the CPU build only" >&2; exit 2; }
          VARIANT=cpu-avx2 ;;
    *) echo "error: STREAMTTS_CPU_ISA=$CPU_ISA: the one kernel set on offer is 'avx2'" >&2; exit 2 ;;
esac
if [[ "${STREAMTTS_VULKAN:-0}" == 1 ]]; then
    if [[ "$VARIANT" == cuda ]]; then
        echo "error: STREAMTTS_CUDA=1 and STREAMTTS_VULKAN=1 together; build one variant at a time" >&2
        exit 2
    fi
    VARIANT=vulkan
fi

STEP_NO=0
STEP_NAME="starting"
LOG=""
RUN_CMD=""

step() {
    STEP_NO=$1
    STEP_NAME=$2
    echo "==> [$STEP_NO/$N_STEPS] $STEP_NAME"
}

note() { echo "    $*"; }

on_error() {
    local rc=$? line=$1 cmd=$2
    trap - ERR
    echo "error: step [$STEP_NO/$N_STEPS] ($STEP_NAME) failed with exit code $rc" >&2
    if [[ -n "$RUN_CMD" ]]; then
        echo "error:   command: $RUN_CMD" >&2
    else
        echo "error:   command (line $line): $cmd" >&2
    fi
    if [[ -n "$LOG" && -s "$LOG" ]]; then
        echo "error:   last lines of $LOG:" >&2
        tail -n 40 "$LOG" | sed 's/^/    | /' >&2
    fi
    exit "$rc"
}
trap 'on_error $LINENO "$BASH_COMMAND"' ERR

die() {
    trap - ERR
    echo "error: step [$STEP_NO/$N_STEPS] ($STEP_NAME): $*" >&2
    exit 1
}

# Run a noisy tool with its output in $LOG (or on the terminal when verbose).
run_logged() {
    RUN_CMD="$*"
    if [[ "${STREAMTTS_BUILD_VERBOSE:-0}" == 1 ]]; then
        "$@"
    else
        "$@" >>"$LOG" 2>&1
    fi
    RUN_CMD=""
}

# cmake --build's output into $LOG, and its progress shown as it comes: Ninja's [n/N] (or
# make's [ n%]) counters with the time left at the pace so far: one line redrawn on a
# terminal, else a line every 10 %.
build_progress() {
    local line n total pct left tenth=-1 start=$SECONDS tty=0
    [[ -t 1 ]] && tty=1
    while IFS= read -r line; do
        printf '%s\n' "$line" >>"$LOG"
        if [[ "$line" =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
            n=${BASH_REMATCH[1]}; total=${BASH_REMATCH[2]}
        elif [[ "$line" =~ ^\[\ *([0-9]+)%\] ]]; then
            n=${BASH_REMATCH[1]}; total=100
        else
            continue
        fi
        (( total > 0 )) || continue
        pct=$(( 100 * n / total ))
        left=""
        if (( n >= total / 20 && n > 0 && n < total )); then  # a pace worth extrapolating
            left=", about $(( ( (SECONDS - start) * (total - n) / n + 59 ) / 60 )) min left"
        fi
        if (( tty )); then
            printf '\r    [%d/%d] %d %%, %d s%s   ' "$n" "$total" "$pct" "$(( SECONDS - start ))" "$left"
        elif (( pct / 10 > tenth )); then
            tenth=$(( pct / 10 ))
            printf '    [%d/%d] %d %%, %d s%s\n' "$n" "$total" "$pct" "$(( SECONDS - start ))" "$left"
        fi
    done
    if (( tty )); then printf '\n'; fi
}

usage() {
    sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

# VK_HEADER_VERSION_COMPLETE of a header folder, as "1.4.309"
vk_header_version() {
    local h="$1/vulkan/vulkan_core.h"
    [[ -f "$h" ]] || { echo none; return; }
    local complete patch
    complete="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\), VK_HEADER_VERSION).*/\1.\2/p' "$h")"
    patch="$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$h")"
    echo "${complete:-0.0}.${patch:-0}"
}

# Sets VK_INCLUDE, the Vulkan header folder to build against: STREAMTTS_VULKAN_INCLUDE, the
# system's when it is 1.4 or newer, else Debian 13's libvulkan-dev unpacked into the cache
# (downloaded once; its headers only, nothing is installed).
vulkan_include() {
    if [[ -n "${STREAMTTS_VULKAN_INCLUDE:-}" ]]; then
        [[ -f "$STREAMTTS_VULKAN_INCLUDE/vulkan/vulkan_core.h" ]] \
            || die "STREAMTTS_VULKAN_INCLUDE=$STREAMTTS_VULKAN_INCLUDE has no vulkan/vulkan_core.h"
        VK_INCLUDE="$STREAMTTS_VULKAN_INCLUDE"; return
    fi
    local sys; sys="$(vk_header_version /usr/include)"
    [[ "$sys" != none ]] \
        || die "STREAMTTS_VULKAN=1 but /usr/include/vulkan/vulkan_core.h is missing (apt-get install libvulkan-dev)"
    if [[ "$sys" == 1.[4-9].* || "$sys" == [2-9].* ]]; then
        VK_INCLUDE=/usr/include; return
    fi
    local root="$NATIVE_DIR/vulkan-headers" have
    have="$(ls -d "$root"/*/usr/include 2>/dev/null | sort -V | tail -n1 || true)"
    if [[ -n "$have" && -f "$have/vulkan/vulkan_core.h" ]]; then
        VK_INCLUDE="$have"; return
    fi
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
        || die "the system's Vulkan headers ($sys) are too old for llama.cpp's Vulkan backend and apt-get is not here to fetch newer ones; set STREAMTTS_VULKAN_INCLUDE to a Vulkan 1.4 include folder"
    note "the system's Vulkan headers are $sys (too old): fetching Debian 13's libvulkan-dev"
    local apt_dir; apt_dir="$(mktemp -d "$NATIVE_DIR/vulkan-apt.XXXXXX")"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$apt_dir/deb"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        >"$apt_dir/sources.list"
    # a private sources list, package lists and cache: the system's apt state is not touched
    local opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/parts"
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Debug::NoLocking=1")
    LOG="$apt_dir/apt.log"
    run_logged apt-get "${opts[@]}" update
    RUN_CMD="apt-get download libvulkan-dev (trixie)"
    (cd "$apt_dir/deb" && apt-get "${opts[@]}" download libvulkan-dev >>"$LOG" 2>&1)
    RUN_CMD=""
    local deb ver
    deb="$(ls "$apt_dir"/deb/libvulkan-dev_*.deb)"
    ver="$(dpkg-deb -f "$deb" Version)"
    rm -rf -- "${root:?}/$ver"
    mkdir -p "$root/$ver"
    dpkg-deb -x "$deb" "$root/$ver"
    [[ -f "$root/$ver/usr/include/vulkan/vulkan_core.h" ]] \
        || die "$(basename "$deb") has no usr/include/vulkan/vulkan_core.h"
    rm -rf -- "$apt_dir"
    LOG=""
    VK_INCLUDE="$root/$ver/usr/include"
    note "Vulkan headers $(vk_header_version "$VK_INCLUDE") from $(basename "$deb") in $VK_INCLUDE"
}

# -- command line -----------------------------------------------------------------------

ACTION=build
for arg in "$@"; do
    case "$arg" in
        --print-lib) ACTION=print-lib ;;
        --clean) ACTION=clean ;;
        --configure-only) ACTION=configure ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    esac
done

if [[ "$ACTION" == print-lib ]]; then
    lib="$NATIVE_DIR/current-$VARIANT/lib/$BRIDGE_NAME"
    if [[ ! -f "$lib" ]]; then
        hint="native/build.sh"
        [[ "$VARIANT" == cuda ]] && hint="STREAMTTS_CUDA=1 native/build.sh"
        [[ "$VARIANT" == vulkan ]] && hint="STREAMTTS_VULKAN=1 native/build.sh"
        echo "error: no $VARIANT build yet ($lib missing); run $hint" >&2
        exit 1
    fi
    readlink -f "$lib"
    exit 0
fi

if [[ "$ACTION" == clean ]]; then
    if [[ -d "$NATIVE_DIR" ]]; then
        echo "==> removing $NATIVE_DIR"
        rm -rf -- "$NATIVE_DIR"
    else
        echo "==> nothing to clean ($NATIVE_DIR does not exist)"
    fi
    exit 0
fi

T_START=$(date +%s)
mkdir -p "$NATIVE_DIR"

# one build at a time per cache (two shells, or tests, may start it together)
lock_cache() {
    command -v flock >/dev/null || return 0
    exec 9>"$NATIVE_DIR/$1"
    if ! flock -n 9; then
        echo "==> waiting for another native/build.sh on $NATIVE_DIR ($1)"
        flock 9
    fi
}
lock_cache .build.lock

# -- 1. source ----------------------------------------------------------------------------

step 1 "locating the llama.cpp source"
command -v cmake >/dev/null || die "cmake not found (apt-get install cmake, or pip install cmake)"
if [[ -n "${LLAMA_CPP_DIR:-}" ]]; then
    [[ -d "$LLAMA_CPP_DIR" ]] || die "LLAMA_CPP_DIR=$LLAMA_CPP_DIR is not a folder"
    LLAMA_DIR="$(cd "$LLAMA_CPP_DIR" && pwd)"
    [[ -f "$LLAMA_DIR/include/llama.h" ]] || die "LLAMA_CPP_DIR=$LLAMA_CPP_DIR has no include/llama.h"
    SRC_ID="dir:$LLAMA_DIR:$(sha256sum "$LLAMA_DIR/include/llama.h" | cut -c1-16)"
    note "using LLAMA_CPP_DIR=$LLAMA_DIR"
else
    LLAMA_DIR="$NATIVE_DIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    SRC_ID="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    if [[ -f "$LLAMA_DIR/include/llama.h" ]]; then
        note "cached: $LLAMA_DIR"
    else
        # the CMake project's own download (pinned URL and SHA256), run as a script
        mkdir -p "$NATIVE_DIR/src"
        LOG="$NATIVE_DIR/src/download.log"
        : >"$LOG"
        note "downloading the llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist (about 75 MB; seconds to a minute)"
        run_logged cmake "-DSTREAMTTS_SOURCE_CACHE=$NATIVE_DIR/src" -P "$SOURCE_CMAKE"
        [[ -f "$LLAMA_DIR/include/llama.h" ]] || die "no $LLAMA_DIR/include/llama.h after the download"
        LOG=""
        note "source in $LLAMA_DIR"
    fi
fi
LLAMA_VERSION_BASE="$(sed -n 's/^set(LLAMA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)).*/\2/p' \
    "$LLAMA_DIR/CMakeLists.txt" | paste -sd. -)"

# -- 2. tools and build key ----------------------------------------------------------------

# a GPU variant's build (12 minutes for Vulkan on 2 cores) holds only its own lock past the
# shared source step, so CPU builds (and bridge rebuilds) run meanwhile
if [[ "$VARIANT" != cpu ]]; then
    exec 9>&-
    lock_cache ".build-$VARIANT.lock"
fi

step 2 "checking tools and computing the build key"
CC="${CC:-cc}"
CXX="${CXX:-c++}"
command -v "$CC" >/dev/null || die "C compiler '$CC' not found"
command -v "$CXX" >/dev/null || die "C++ compiler '$CXX' not found"
GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
JOBS="${STREAMTTS_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
NATIVE_OPT=ON
if [[ "${STREAMTTS_NATIVE:-1}" == 0 ]]; then NATIVE_OPT=OFF; fi
ISA_OPTS=()
if [[ "$CPU_ISA" == avx2 ]]; then
    # spelt out, so a changed ggml default never brings AVX-512 (or drops AVX2) silently
    NATIVE_OPT=OFF
    ISA_OPTS=(-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
              -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF
              -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF
              -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
OPENMP_OPT=OFF
if [[ "${STREAMTTS_OPENMP:-0}" == 1 ]]; then OPENMP_OPT=ON; fi
# llamafile's sgemm computes batches of >= 2 rows with another accumulation order than
# the 1-row path: off, every batch size gives bit-identical rows (slower CPU prefill).
LLAMAFILE_OPT=ON
if [[ "${STREAMTTS_BATCH_INVARIANT:-0}" == 1 ]]; then LLAMAFILE_OPT=OFF; fi
# ggml's AMX matmul (Q4_0/Q8_0/K-quants on Sapphire Rapids and later) assumes tile state
# survives between calls; on a VM that lost it the process died with SIGILL. -march=native
# predefines __AMX_INT8__, and undefining it leaves that code out.
AMX_FLAGS=""
if [[ "$NATIVE_OPT" == ON && "${STREAMTTS_AMX:-0}" != 1 ]]; then
    AMX_FLAGS="-U__AMX_INT8__ -U__AMX_TILE__ -U__AMX_BF16__"
fi

# the top-level CMakeLists.txt sets what every build shares (shared libraries, no llama.cpp
# tools/tests, RPATH $ORIGIN); these are the options of this cached build. The backends
# are linked in (GGML_BACKEND_DL=OFF): one CPU kernel set, this CPU's (-march=native) unless
# STREAMTTS_NATIVE=0 / STREAMTTS_CPU_ISA. The wheel's runtime-dispatched variants: pip.
CMAKE_OPTS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE="$NATIVE_OPT"
    -DGGML_OPENMP="$OPENMP_OPT"
    -DGGML_LLAMAFILE="$LLAMAFILE_OPT"
    -DGGML_BACKEND_DL=OFF
    -DGGML_CPU_ALL_VARIANTS=OFF
    "${ISA_OPTS[@]}"
    -DSTREAMTTS_INSTALL_LIBDIR=lib
    -DSTREAMTTS_BUILD_LABEL="$VARIANT"
    -DCMAKE_C_COMPILER="$CC"
    -DCMAKE_CXX_COMPILER="$CXX"
    "-DCMAKE_C_FLAGS=$AMX_FLAGS"
    "-DCMAKE_CXX_FLAGS=$AMX_FLAGS"
)
TOOLCHAIN="$("$CC" --version | sed -n 1p); $("$CXX" --version | sed -n 1p)"
if [[ "$NATIVE_OPT" == ON ]]; then
    # -march=native binaries are only good on this kind of CPU: key on its feature flags
    TOOLCHAIN+="; cpu $( (grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || uname -m) | sha256sum | cut -c1-8)"
fi
if [[ "$VARIANT" == cuda ]]; then
    command -v nvcc >/dev/null || die "STREAMTTS_CUDA=1 but nvcc is not on PATH (install the CUDA toolkit)"
    # flash-attention kernels and CUDA graphs are llama.cpp's defaults; they are spelt out
    # so a changed default never silently drops them. Whether flash attention is used is a
    # run-time choice (BackboneParams.flash_attn).
    CMAKE_OPTS+=(-DSTREAMTTS_CUDA=ON -DGGML_CUDA_FA=ON -DGGML_CUDA_GRAPHS=ON)
    CUDA_ARCH="${STREAMTTS_CUDA_ARCH:-}"
    if [[ -z "$CUDA_ARCH" ]]; then
        if nvidia-smi -L >/dev/null 2>&1; then
            CUDA_ARCH=native
        else
            # "native" fails without a visible GPU (e.g. in a container build)
            CUDA_ARCH="80;86;89;90"
            note "no GPU visible: building CUDA kernels for $CUDA_ARCH (set STREAMTTS_CUDA_ARCH to narrow)"
        fi
    fi
    CMAKE_OPTS+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH")
    TOOLCHAIN+="; $(nvcc --version | tail -n1)"
fi
[[ "$VARIANT" == cuda ]] || CMAKE_OPTS+=(-DSTREAMTTS_CUDA=OFF)
[[ "$VARIANT" == vulkan ]] || CMAKE_OPTS+=(-DSTREAMTTS_VULKAN=OFF)
if [[ "$VARIANT" == vulkan ]]; then
    command -v glslc >/dev/null \
        || die "STREAMTTS_VULKAN=1 but glslc is not on PATH (apt-get install libvulkan-dev glslc glslang-tools spirv-headers, or bash scripts/setup.sh --test)"
    [[ -f /usr/include/spirv/unified1/spirv.hpp || -n "${VULKAN_SDK:-}" ]] \
        || die "STREAMTTS_VULKAN=1 but the SPIR-V headers are missing (apt-get install spirv-headers)"
    vulkan_include
    CMAKE_OPTS+=(-DSTREAMTTS_VULKAN=ON "-DVulkan_INCLUDE_DIR=$VK_INCLUDE")
    TOOLCHAIN+="; $(glslc --version 2>&1 | sed -n 1p); vulkan headers $(vk_header_version "$VK_INCLUDE")"
fi
# "project 2": the build tree is the top-level CMake project's (no longer llama.cpp's own)
KEY_TEXT="project 2|$SRC_ID|$LLAMA_VERSION_BASE|$VARIANT|${GENERATOR[*]:-make}|${CMAKE_OPTS[*]}|$TOOLCHAIN"
KEY_HASH="$(printf '%s' "$KEY_TEXT" | sha256sum | cut -c1-12)"
KEY="llama-$LLAMA_CPP_PYTHON_VERSION-$VARIANT-$KEY_HASH"
if [[ -n "${LLAMA_CPP_DIR:-}" ]]; then KEY="llama-dir-$VARIANT-$KEY_HASH"; fi
OUT="$NATIVE_DIR/$KEY"
BUILD="$OUT/build"
LIB="$OUT/lib"
mkdir -p "$BUILD" "$LIB"
printf '%s\n' "$KEY_TEXT" >"$OUT/key.txt"
note "variant $VARIANT, GGML_NATIVE=$NATIVE_OPT, GGML_OPENMP=$OPENMP_OPT, jobs $JOBS"
note "toolchain: $TOOLCHAIN"
note "build folder: $OUT"

# -- 3. configure --------------------------------------------------------------------------

step 3 "configuring llama.cpp and the bridge (cmake; seconds)"
LOG="$OUT/cmake-configure.log"
CONF_STAMP="$OUT/configure.stamp"
# the source, as the CMake project finds it: the named tree, or the sdist it unpacked into
# the cache (then the bridge's version line says llama-cpp-python==<version>)
if [[ -n "${LLAMA_CPP_DIR:-}" ]]; then
    SRC_ARGS=("-DLLAMA_CPP_DIR=$LLAMA_DIR")
else
    SRC_ARGS=(-DLLAMA_CPP_DIR= "-DSTREAMTTS_SOURCE_CACHE=$NATIVE_DIR/src")
fi
CONF_TEXT="$KEY_TEXT|${SRC_ARGS[*]}"
# a build folder that another checkout configured (CMake keeps the project's path; CI clones
# into a new folder each run): its CMake cache starts anew, its objects stay (little rebuilt)
if [[ -f "$BUILD/CMakeCache.txt" ]] && ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$REPO" "$BUILD/CMakeCache.txt"; then
    note "configured from another checkout: configuring again for $REPO"
    rm -rf -- "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
fi
if [[ -f "$BUILD/CMakeCache.txt" && -f "$CONF_STAMP" && "$(cat "$CONF_STAMP")" == "$CONF_TEXT" ]]; then
    note "already configured"
else
    : >"$LOG"
    rm -f "$CONF_STAMP"
    run_logged cmake -S "$REPO" -B "$BUILD" "${GENERATOR[@]}" "${CMAKE_OPTS[@]}" "${SRC_ARGS[@]}"
    printf '%s' "$CONF_TEXT" >"$CONF_STAMP"
    note "configured (log: $LOG)"
fi
if [[ "$ACTION" == configure ]]; then
    echo "==> configure only: stopping here"
    exit 0
fi

# -- 4. build ------------------------------------------------------------------------------

if [[ -f "$LIB/$BRIDGE_NAME" ]]; then
    step 4 "building llama.cpp and the bridge (incremental: seconds unless sources changed)"
else
    case "$VARIANT" in
        cuda) est="30-60 min for the CUDA kernels" ;;
        vulkan) est="about 12 min on 2 cores" ;;
        *) est="about 5 min on 2 cores (measured 4m48s), 2 min on 8" ;;
    esac
    step 4 "building llama.cpp and the bridge (from scratch: $est)"
fi
LOG="$OUT/cmake-build.log"
: >"$LOG"
T0=$(date +%s)
if [[ "${STREAMTTS_BUILD_VERBOSE:-0}" == 1 ]]; then
    run_logged cmake --build "$BUILD" --config Release -j "$JOBS"
else
    RUN_CMD="cmake --build $BUILD --config Release -j $JOBS"
    cmake --build "$BUILD" --config Release -j "$JOBS" 2>&1 | build_progress
    RUN_CMD=""
fi
note "done in $(( $(date +%s) - T0 )) s (log: $LOG)"

# -- 5. install ------------------------------------------------------------------------------

step 5 "installing the libraries into $OUT/stage (cmake --install; seconds)"
LOG="$OUT/cmake-install.log"
: >"$LOG"
run_logged cmake --install "$BUILD" --component streamtts_native --prefix "$OUT/stage"

# -- 6. collect ------------------------------------------------------------------------------

step 6 "collecting the bridge and libllama/libggml into $LIB"
LOG=""
shopt -s nullglob
found=0
for f in "$OUT/stage/lib"/*.so* "$OUT/stage/lib/variant.txt"; do
    found=1
    name="$(basename "$f")"
    if [[ -L "$f" ]]; then
        ln -sfn "$(readlink "$f")" "$LIB/$name"
    elif ! cmp -s "$f" "$LIB/$name"; then
        # copy then rename: a process that has the old file mapped keeps working
        cp "$f" "$LIB/.$name.tmp"
        mv -f "$LIB/.$name.tmp" "$LIB/$name"
        note "updated $name"
    fi
done
shopt -u nullglob
[[ $found == 1 && -e "$LIB/libllama.so" ]] || die "no libllama.so in $OUT/stage/lib after the install"
[[ -e "$LIB/$BRIDGE_NAME" ]] || die "no $BRIDGE_NAME in $OUT/stage/lib after the install"

# -- 7. pointer -----------------------------------------------------------------------------

step 7 "pointing $NATIVE_DIR/current-$VARIANT at this build"
LOG=""
ln -sfn "$KEY" "$NATIVE_DIR/.current-$VARIANT.tmp"
mv -Tf "$NATIVE_DIR/.current-$VARIANT.tmp" "$NATIVE_DIR/current-$VARIANT"
note "bridge: $NATIVE_DIR/current-$VARIANT/lib/$BRIDGE_NAME"
echo "==> done in $(( $(date +%s) - T_START )) s"
