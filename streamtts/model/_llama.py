"""Every ctypes declaration for the native bridge (``native/bridge.c``, ``sampler.c``, ``delay.c``,
``frames.c``, ``embed.c``), and finding it.

The bridge wraps llama.cpp (the copy vendored by llama-cpp-python 0.3.36) behind a
few plain C functions; ``native/build.sh`` builds both into one folder of the cache.
Each declaration below carries the C prototype it mirrors as a comment: when
a C file changes, this file changes with it. Every struct mirrored here is defined once, in
``native/stt.h``, and the library exports its size (``stt_sizeof_<name>``): the load compares
each with its ctypes mirror and names the one that differs.

Discovery: ``STREAMTTS_BRIDGE_LIB`` (a file) wins; otherwise the libraries a pip build put
inside the package, ``streamtts/lib/`` (``variant.txt`` there names their variant), then
the pointers build.sh writes, ``<cache>/native/current-{cuda,vulkan,cpu}``, with
``<cache> = $STREAMTTS_CACHE or $XDG_CACHE_HOME/streamtts or ~/.cache/streamtts``,
chosen as :mod:`streamtts.model.backend` says (``STREAMTTS_BACKEND``, the config key
``backend``; auto: the package's build, then CUDA, then Vulkan with a GPU, then CPU).

``ctypes.CDLL`` releases the GIL for the duration of every call.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import NativeLibraryError
from ..paths import cache_dir

log = logging.getLogger(__name__)

BRIDGE_NAME = "libstreamtts_bridge.so"
BUILD_HINT = (
    "install streamtts with pip (`pip install .` builds it into the package), or, in a "
    "checkout, build it with `native/build.sh` (CUDA: `STREAMTTS_CUDA=1 native/build.sh`, "
    "Vulkan: `STREAMTTS_VULKAN=1 native/build.sh`)"
)
PACKAGE_LIB_DIR = Path(__file__).resolve().parent.parent / "lib"  # streamtts/lib

# Status codes returned (negative) by the bridge; 0 or a count means success.
STT_OK = 0
STT_E_INVALID = -1  # bad argument, rejected before llama.cpp saw it
STT_E_NO_SLOT = -2  # no room in the KV cache
STT_E_ABORTED = -3  # llama_decode returned 2
STT_E_BATCH = -4  # llama_decode returned -1
STT_E_FATAL = -5  # llama_decode returned < -1
STT_E_OUTPUT = -6  # llama.cpp had no hidden state / logits for an output row
STT_E_MODEL = -7  # model file could not be loaded
STT_E_CONTEXT = -8  # context could not be created
STT_E_NOMEM = -9

STATUS_NAMES = {
    STT_E_INVALID: "invalid argument",
    STT_E_NO_SLOT: "no KV cache slot",
    STT_E_ABORTED: "aborted",
    STT_E_BATCH: "batch rejected by llama.cpp",
    STT_E_FATAL: "llama.cpp compute failed",
    STT_E_OUTPUT: "no output",
    STT_E_MODEL: "model load failed",
    STT_E_CONTEXT: "context creation failed",
    STT_E_NOMEM: "out of memory",
}

c_int32 = ctypes.c_int32
c_void_p = ctypes.c_void_p
c_uint64 = ctypes.c_uint64
c_char_p = ctypes.c_char_p


# typedef struct stt_params {   (native/stt.h, used by bridge.c)
#     int32_t struct_size; int32_t n_ctx; int32_t n_batch; int32_t n_ubatch; int32_t n_seq_max;
#     int32_t n_threads; int32_t n_threads_batch; int32_t n_gpu_layers; int32_t type_k;
#     int32_t type_v; int32_t flash_attn; int32_t kv_unified; int32_t embeddings; int32_t poll;
#     int32_t use_mmap;
# } stt_params;
class SttParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_int32),
        ("n_ctx", c_int32),
        ("n_batch", c_int32),
        ("n_ubatch", c_int32),
        ("n_seq_max", c_int32),
        ("n_threads", c_int32),
        ("n_threads_batch", c_int32),
        ("n_gpu_layers", c_int32),
        ("type_k", c_int32),
        ("type_v", c_int32),
        ("flash_attn", c_int32),
        ("kv_unified", c_int32),
        ("embeddings", c_int32),
        ("poll", c_int32),
        ("use_mmap", c_int32),
        ("pin_threads", c_int32),
    ]


_P = ctypes.c_void_p


def ptr(a: Any) -> int | None:
    """The address of a NumPy array's data for a ``void *`` argument (None: NULL)."""
    return None if a is None else int(a.ctypes.data)


# typedef struct {
#     int32_t capacity, n_vq, n_audio, pair_swapped;
#     int64_t pad, gen_slot, delay_slot, audio_start, audio_end, im_end, audio_pad_code;
#     uint64_t text_salt, audio_salt;
#     int64_t *audio_length, *delayed_length, *time_step;
#     uint8_t *is_audio, *is_stopping, *audio_ended;
#     uint64_t *seed;
#     float *text_temperature; int64_t *text_top_k; double *text_top_p;
#     float *audio_temperature; int64_t *audio_top_k; double *audio_top_p; float *audio_penalty;
#     uint8_t *seen;
#     uint8_t *mark;
# } stt_delay_states;   (native/stt.h, used by delay.c)
class SttDelayStates(ctypes.Structure):
    _fields_ = [
        *((n, c_int32) for n in ("capacity", "n_vq", "n_audio", "pair_swapped")),
        *((n, ctypes.c_int64) for n in ("pad", "gen_slot", "delay_slot", "audio_start", "audio_end", "im_end", "audio_pad_code")),
        ("text_salt", c_uint64),
        ("audio_salt", c_uint64),
        *((n, _P) for n in (
            "audio_length", "delayed_length", "time_step", "is_audio", "is_stopping", "audio_ended", "seed",
            "text_temperature", "text_top_k", "text_top_p",
            "audio_temperature", "audio_top_k", "audio_top_p", "audio_penalty", "seen", "mark",
        )),
    ]  # fmt: skip


# int32_t stt_delay_step(const stt_delay_states *st, const int64_t *slots, int32_t n_b,
#     const float *pair, int64_t pair_stride, float *audio, int64_t audio_b_stride,
#     int64_t audio_k_stride, int64_t *out, void *scratch, uint8_t *bad);   (native/delay.c)
DELAY_STEP_ARGS = [ctypes.POINTER(SttDelayStates), _P, c_int32, _P, ctypes.c_int64, _P,
                   ctypes.c_int64, ctypes.c_int64, _P, _P, _P]  # fmt: skip


# typedef struct {
#     int32_t capacity, n_vq;
#     int64_t pad;
#     int64_t *ring, *count;
# } stt_frames;   (native/stt.h, used by frames.c)
class SttFrames(ctypes.Structure):
    _fields_ = [("capacity", c_int32), ("n_vq", c_int32), ("pad", ctypes.c_int64), ("ring", _P), ("count", _P)]


# typedef struct {
#     int64_t n_embd, text_rows, n_vq, audio_rows;
#     int32_t text_f16;
#     const void *text;
#     const float *audio;
# } stt_embed;   (native/stt.h, used by embed.c)
class SttEmbed(ctypes.Structure):
    _fields_ = [
        *((n, ctypes.c_int64) for n in ("n_embd", "text_rows", "n_vq", "audio_rows")),
        ("text_f16", c_int32),
        ("text", _P),
        ("audio", _P),
    ]


# size_t stt_sizeof_params(void); size_t stt_sizeof_delay_states(void);
# size_t stt_sizeof_frames(void); size_t stt_sizeof_embed(void);   (native/stt.h)
MIRRORED: dict[str, type[ctypes.Structure]] = {
    "params": SttParams,
    "delay_states": SttDelayStates,
    "frames": SttFrames,
    "embed": SttEmbed,
}
"""Each struct of ``native/stt.h`` by the name its ``stt_sizeof_<name>`` carries."""


def _declarer(lib: ctypes.CDLL, missing: str) -> Callable[[str, object, list[object]], None]:
    """``fn(name, restype, argtypes)`` declaring one symbol of ``lib``; a symbol it lacks raises
    :class:`NativeLibraryError` saying ``missing`` (why, and what to do)."""

    def fn(name: str, restype: object, argtypes: list[object]) -> None:
        try:
            f = getattr(lib, name)
        except AttributeError as exc:
            raise NativeLibraryError(f"{lib._name}: missing symbol {name}: {missing}") from exc
        f.restype = restype
        f.argtypes = argtypes

    return fn


def _declare(lib: ctypes.CDLL) -> None:
    P = ctypes.POINTER
    fn = _declarer(lib, "the bridge is older than this Python code; rebuild it with `native/build.sh`")

    # void stt_params_default(stt_params *p);
    fn("stt_params_default", None, [P(SttParams)])
    for name in MIRRORED:  # size_t stt_sizeof_<name>(void);
        fn(f"stt_sizeof_{name}", ctypes.c_size_t, [])
    # stt_ctx *stt_create(const char *model_path, const stt_params *p,
    #                     int32_t *status, char *err, int32_t err_len);
    fn("stt_create", c_void_p, [c_char_p, P(SttParams), P(c_int32), c_char_p, c_int32])
    # void stt_free(stt_ctx *c);
    fn("stt_free", None, [c_void_p])
    # int32_t stt_decode(stt_ctx *c, int32_t n_rows, const float *embd, const int32_t *pos,
    #                    const int32_t *seq_id, const int8_t *output,
    #                    float *hidden_out, float *logits_out);
    # (pointers passed as addresses: numpy's .ctypes.data, or c_void_p objects)
    fn(
        "stt_decode",
        c_int32,
        [c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p],
    )
    # int32_t stt_decode_ex(stt_ctx *c, int32_t n_rows, const float *embd, const int32_t *pos,
    #                       const int32_t *seq_id, const int8_t *output,
    #                       float *hidden_out, float *logits_out, int32_t out_capacity);
    fn(
        "stt_decode_ex",
        c_int32,
        [c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int32],
    )
    # int32_t stt_decode_lend(stt_ctx *c, int32_t n_rows, const float *embd, const int32_t *pos,
    #                         const int32_t *seq_id, const int8_t *output, float *hidden_out,
    #                         float *logits_out, int32_t out_capacity, float **lent);
    fn(
        "stt_decode_lend",
        c_int32,
        [c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int32, P(c_void_p)],
    )
    # int32_t stt_set_logit_columns(stt_ctx *c, const int32_t *cols, int32_t n);
    fn("stt_set_logit_columns", c_int32, [c_void_p, c_void_p, c_int32])
    # int32_t stt_n_logit_columns(const stt_ctx *c);
    fn("stt_n_logit_columns", c_int32, [c_void_p])
    # int32_t stt_copy_logits_row(stt_ctx *c, int32_t i, float *dst);
    fn("stt_copy_logits_row", c_int32, [c_void_p, c_int32, c_void_p])
    # int32_t stt_seq_rm(stt_ctx *c, int32_t seq, int32_t p0);
    fn("stt_seq_rm", c_int32, [c_void_p, c_int32, c_int32])
    # int32_t stt_seq_pos_max(stt_ctx *c, int32_t seq, int32_t *pos_out);
    fn("stt_seq_pos_max", c_int32, [c_void_p, c_int32, P(c_int32)])
    # int32_t stt_seq_state_size(stt_ctx *c, int32_t seq, uint64_t *size_out);
    fn("stt_seq_state_size", c_int32, [c_void_p, c_int32, P(c_uint64)])
    # int32_t stt_seq_state_get(stt_ctx *c, int32_t seq, uint8_t *dst, uint64_t capacity,
    #                           uint64_t *written);
    fn("stt_seq_state_get", c_int32, [c_void_p, c_int32, c_void_p, c_uint64, P(c_uint64)])
    # int32_t stt_seq_state_set(stt_ctx *c, int32_t seq, const uint8_t *src, uint64_t size);
    fn("stt_seq_state_set", c_int32, [c_void_p, c_int32, c_void_p, c_uint64])
    # int32_t stt_llama_last_error(char *buf, int32_t len);
    fn("stt_llama_last_error", c_int32, [c_char_p, c_int32])
    # int32_t stt_n_embd(const stt_ctx *c);   (and n_vocab, n_ctx, n_ctx_seq, n_seq_max,
    #                                           n_batch, n_threads, n_threads_batch,
    #                                           n_threads_max, has_threadpool alike)
    for getter in (
        "stt_n_embd",
        "stt_n_vocab",
        "stt_n_ctx",
        "stt_n_ctx_seq",
        "stt_n_seq_max",
        "stt_n_batch",
        "stt_n_threads",
        "stt_n_threads_batch",
        "stt_n_threads_max",
        "stt_has_threadpool",
    ):
        fn(getter, c_int32, [c_void_p])
    # int32_t stt_pin_caller(stt_ctx *c, int32_t on);
    fn("stt_pin_caller", c_int32, [c_void_p, c_int32])
    # int32_t stt_set_n_threads(stt_ctx *c, int32_t n_threads, int32_t n_threads_batch);
    fn("stt_set_n_threads", c_int32, [c_void_p, c_int32, c_int32])
    # const char *stt_last_error(const stt_ctx *c);
    fn("stt_last_error", c_char_p, [c_void_p])
    # const char *stt_version(void);
    fn("stt_version", c_char_p, [])
    # void stt_set_log_forward(int32_t level);
    fn("stt_set_log_forward", None, [c_int32])
    # const char *stt_system_info(void);
    fn("stt_system_info", c_char_p, [])
    # const char *stt_placement(const stt_ctx *c);
    fn("stt_placement", c_char_p, [c_void_p])
    # int32_t stt_devices(char *buf, int32_t len);   (native/devices.c)
    fn("stt_devices", c_int32, [ctypes.c_char_p, c_int32])
    # stt_delay_step: prototype above DELAY_STEP_ARGS
    fn("stt_delay_step", c_int32, DELAY_STEP_ARGS)
    # int32_t stt_frames_push(const stt_frames *fa, const int64_t *slots, int32_t n_b,
    #     const int64_t *rows, int64_t row_stride, int64_t *frames_out, uint8_t *ready,
    #     int64_t *index);   (native/frames.c)
    fn("stt_frames_push", c_int32, [P(SttFrames), _P, c_int32, _P, ctypes.c_int64, _P, _P, _P])
    # int32_t stt_embed_rows(const stt_embed *e, const int64_t *slots, int32_t n_b,
    #     const int64_t *rows, int64_t n_rows, int64_t row_stride, float *out,
    #     int64_t out_stride);   (native/embed.c)
    fn("stt_embed_rows", c_int32, [P(SttEmbed), _P, c_int32, _P, ctypes.c_int64, ctypes.c_int64, _P, ctypes.c_int64])
    # stt_pool *stt_pool_new(int32_t n_threads);   (native/pool.c; NULL on failure)
    fn("stt_pool_new", c_void_p, [c_int32])
    # void stt_pool_free(stt_pool *p);
    fn("stt_pool_free", None, [c_void_p])
    # int32_t stt_pool_threads(const stt_pool *p);
    fn("stt_pool_threads", c_int32, [c_void_p])
    # int32_t stt_pool_delay_step(stt_pool *p, int32_t chunk, int32_t *rcs,
    #     <stt_delay_step's arguments up to scratch>, int64_t scratch_row, uint8_t *bad);
    #     (native/delay.c)
    fn("stt_pool_delay_step", c_int32, [c_void_p, c_int32, _P, *DELAY_STEP_ARGS[:-1], ctypes.c_int64, _P])
    # int32_t stt_pool_embed_rows(stt_pool *p, int32_t chunk, int32_t *rcs,
    #     <stt_embed_rows' arguments>);   (native/embed.c)
    fn("stt_pool_embed_rows", c_int32, [c_void_p, c_int32, _P, P(SttEmbed), _P, c_int32, _P, ctypes.c_int64, ctypes.c_int64, _P, ctypes.c_int64])
    # void stt_set_pool(stt_ctx *c, stt_pool *pool);   (native/bridge.c)
    fn("stt_set_pool", None, [c_void_p, c_void_p])
    # int32_t stt_pool_gather_rows(stt_pool *p, int32_t n, const float *src, int64_t src_stride,
    #     const int64_t *idx, float *dst, int64_t dst_stride, int64_t n_floats);   (native/pool.c)
    fn("stt_pool_gather_rows", c_int32, [c_void_p, c_int32, _P, ctypes.c_int64, _P, _P, ctypes.c_int64, ctypes.c_int64])
    # int32_t stt_sample_rows(const float *base, const int64_t *offsets, int32_t n_rows,
    #     int32_t n_cols, const float *temperature, const int64_t *top_k, const double *top_p,
    #     const double *u, const uint8_t *seen, const float *penalty, void *scratch,
    #     int64_t *out, uint8_t *bad);   (native/sampler.c)
    fn(
        "stt_sample_rows",
        c_int32,
        [c_void_p, c_void_p, c_int32, c_int32, c_void_p, c_void_p, c_void_p, c_void_p,
         c_void_p, c_void_p, c_void_p, c_void_p, c_void_p],
    )  # fmt: skip


# -- discovery ------------------------------------------------------------------------------


def _variant_lib(variant: str) -> Path:
    return cache_dir() / "native" / f"current-{variant}" / "lib" / BRIDGE_NAME


def package_lib() -> tuple[str, Path] | None:
    """(variant, path) of the bridge a pip build installed into streamtts/lib, if any."""
    path = PACKAGE_LIB_DIR / BRIDGE_NAME
    if not path.is_file():
        return None
    try:
        variant = (PACKAGE_LIB_DIR / "variant.txt").read_text(encoding="utf-8").strip() or "cpu"
    except OSError:
        variant = "cpu"
    return variant, path


def candidate_paths() -> list[tuple[str, Path]]:
    """(variant, path) pairs to try, best first, following the environment and the
    config key (model/backend.py): the package's own build, then the developer builds."""
    from . import backend

    env = os.environ.get("STREAMTTS_BRIDGE_LIB")
    if env:
        return [("env", Path(env).expanduser())]
    want, _ = backend.wanted()
    pkg = package_lib()
    first = [pkg] if pkg is not None and want in ("auto", pkg[0]) else []
    if want != "auto":
        return first + [(want, _variant_lib(want))]
    return first + [(v, _variant_lib(v)) for v in backend.VARIANTS]


# The system's C++ runtime, made global before the bridge loads. Global symbols are looked up
# first, so libllama's std:: calls reach this libstdc++ and no other copy. Seen on the lent
# H200 (CUDA 13, Ubuntu 24.04's g++ 13): the libggml-cuda.so built there carried a copy of
# libstdc++ and exported its symbols (2555, std::locale's and ios_base's among them), ahead
# of libstdc++ in the load order. libllama's first std::ostream call (print_info, loading
# any model, GPU layers or not) ran in that copy and segfaulted; LD_PRELOAD of libstdc++
# made the same build load and run.
CXX_RUNTIME = "libstdc++.so.6"


def _global_cxx_runtime() -> None:
    try:
        ctypes.CDLL(CXX_RUNTIME, mode=ctypes.RTLD_GLOBAL)
    except OSError:  # not a glibc system with GNU's C++ runtime: nothing to put first
        pass


def _open(path: Path) -> ctypes.CDLL:
    _global_cxx_runtime()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeLibraryError(
            f"cannot load the llama.cpp bridge {path}: {exc}; {BUILD_HINT}"
        ) from exc
    _declare(lib)
    check_layouts(lib, path)
    return lib


def check_layouts(lib: ctypes.CDLL, path: Path) -> None:
    """Every struct of ``native/stt.h`` has the size of its mirror here, or the library is
    another version than this Python code (its fields would be read scrambled)."""
    for name, mirror in MIRRORED.items():
        got = int(getattr(lib, f"stt_sizeof_{name}")())
        expected = ctypes.sizeof(mirror)
        if got != expected:
            raise NativeLibraryError(
                f"{path}: stt_{name} is {got} bytes in the library but {expected} in "
                f"streamtts/model/_llama.py ({mirror.__name__}); rebuild with `native/build.sh`"
            )


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None


def open_bridge() -> tuple[ctypes.CDLL, Path]:
    """Find and load the bridge following the environment (not cached; see load_bridge)."""
    from . import backend

    tried: list[str] = []
    errors: list[NativeLibraryError] = []
    want, who = backend.wanted()
    for variant, path in candidate_paths():
        if not path.is_file():
            if want != "auto" and variant == want and not errors:
                raise backend.missing_build(variant, who, path)
            tried.append(f"{path} ({variant}: missing)")
            continue
        if variant == "vulkan" and not backend.prepare_vulkan(who, strict=want == "vulkan"):
            tried.append(f"{path} (vulkan: no Vulkan GPU; `STREAMTTS_BACKEND=vulkan` takes a CPU-type device)")
            continue
        try:
            return _open(path), path.resolve()
        except NativeLibraryError as exc:
            # e.g. a CUDA build on a machine without a usable driver: try the CPU build
            tried.append(f"{path} ({variant}: {exc})")
            errors.append(exc)
            log.info(
                "llama.cpp bridge %s (%s) did not load, trying the next one: %s", path, variant, exc
            )
    if len(errors) == 1 and len(tried) == 1:
        raise errors[0]
    raise NativeLibraryError(
        "the llama.cpp bridge library is not built (looked for "
        + "; ".join(tried)
        + f"); {BUILD_HINT}"
    )


def load_bridge() -> ctypes.CDLL:
    """Find, load and declare the bridge library once per process."""
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            _lib, _lib_path = open_bridge()
            log.info(
                "llama.cpp bridge: %s - %s; CPU backend %s",
                _lib_path, bridge_version(_lib), cpu_backend(_lib) or "none",
            )  # fmt: skip
        return _lib


def cpu_backend(lib: ctypes.CDLL | None = None) -> str:
    """File name of the CPU backend ggml loaded: ``libggml-cpu.so`` for a build with the
    backends linked in (native/build.sh), ``libggml-cpu-<variant>.so`` (haswell, skylakex,
    icelake, zen4, ...) for the wheel, where ggml picks the best variant this CPU runs.
    "" when none is loaded, or the bridge predates stt_cpu_backend."""
    lib = lib if lib is not None else load_bridge()
    try:
        fn = lib.stt_cpu_backend
    except AttributeError:
        return ""
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    raw = fn()
    return os.path.basename(raw.decode("utf-8", "replace")) if raw else ""


def loaded_backend() -> str:
    """cpu, cuda or vulkan: the variant of the loaded bridge (from its build's version line)."""
    version = bridge_version()
    for v in ("cuda", "vulkan", "cpu"):
        if f"{v} build" in version:
            return v
    return "cpu"


def use_backend(name: str) -> None:
    """Apply the config key ``backend`` before the bridge loads; once loaded, a different
    build cannot replace it in this process (its libraries share names)."""
    from . import backend

    backend.request(name)
    if _lib is None:
        return
    want, who = backend.wanted()
    have = loaded_backend()
    if want != "auto" and want != have:
        raise NativeLibraryError(
            f"{who}, but this process already loaded the {have} build of the llama.cpp bridge "
            f"({_lib_path}); one build per process: start a new one"
        )


def devices() -> list[dict[str, Any]]:
    """The compute devices the loaded build registered: name, description, type (cpu, gpu,
    igpu, accel), free and total bytes (ggml-backend's registry, native/devices.c)."""
    buf = ctypes.create_string_buffer(16384)
    n = int(load_bridge().stt_devices(buf, len(buf)))
    out: list[dict[str, Any]] = []
    for line in buf.value.decode("utf-8", "replace").splitlines()[: max(n, 0)]:
        name, desc, kind, free, total = line.split("\t")
        out.append({"name": name, "description": desc, "type": kind, "free": int(free), "total": int(total)})
    return out


def loaded_path() -> Path | None:
    """Path of the loaded bridge, None before load_bridge()."""
    return _lib_path


def bridge_version(lib: ctypes.CDLL | None = None) -> str:
    lib = lib if lib is not None else load_bridge()
    raw = lib.stt_version()
    return raw.decode("utf-8", "replace") if raw else ""


def system_info() -> str:
    raw = load_bridge().stt_system_info()
    return raw.decode("utf-8", "replace") if raw else ""


def set_llama_log(on: bool, debug: bool = False) -> None:
    """Forward llama.cpp's own log lines (INFO and above; with debug, DEBUG too) to stderr
    (config ``log_llama``). The default comes from ``STREAMTTS_LLAMA_LOG=1`` (or 2)."""
    load_bridge().stt_set_log_forward(2 if on and debug else int(on))


def llama_last_error() -> str:
    """Last ERROR line llama.cpp logged in this process ('' if none)."""
    buf = ctypes.create_string_buffer(1024)
    load_bridge().stt_llama_last_error(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


# ==== llama.cpp's own quantizer (libllama, next to the bridge) ================================
# ``streamtts convert-hf`` quantizes with llama.cpp's ``llama_model_quantize``, the code behind
# ``llama-quantize``, so its files match the official chain's byte for byte. These symbols are
# libllama's, not the bridge's: the library is opened from the bridge's folder (the bridge links
# it, so the process already has it loaded, with the bridge's log callback installed).

LLAMA_LIB_NAME = "libllama.so"
GGML_TYPE_COUNT = 43  # enum ggml_type's count in this llama.cpp (the "no override" value)


# typedef struct llama_model_quantize_params {
#     int32_t nthread; enum llama_ftype ftype; enum ggml_type output_tensor_type;
#     enum ggml_type token_embedding_type; bool allow_requantize; bool quantize_output_tensor;
#     bool only_copy; bool pure; bool keep_split; bool dry_run;
#     const struct llama_model_imatrix_data * imatrix;
#     const struct llama_model_kv_override * kv_overrides;
#     const struct llama_model_tensor_override * tt_overrides;
#     const int32_t * prune_layers; size_t max_buf_size;
# } llama_model_quantize_params;
class LlamaModelQuantizeParams(ctypes.Structure):
    _fields_ = [
        ("nthread", c_int32),
        ("ftype", ctypes.c_int),
        ("output_tensor_type", ctypes.c_int),
        ("token_embedding_type", ctypes.c_int),
        ("allow_requantize", ctypes.c_bool),
        ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool),
        ("pure", ctypes.c_bool),
        ("keep_split", ctypes.c_bool),
        ("dry_run", ctypes.c_bool),
        ("imatrix", c_void_p),
        ("kv_overrides", c_void_p),
        ("tt_overrides", c_void_p),
        ("prune_layers", c_void_p),
        ("max_buf_size", ctypes.c_size_t),
    ]


def _declare_llama(lib: ctypes.CDLL) -> None:
    fn = _declarer(lib, "not the llama.cpp this streamtts expects; rebuild with `native/build.sh`")

    # struct llama_model_quantize_params llama_model_quantize_default_params(void);
    fn("llama_model_quantize_default_params", LlamaModelQuantizeParams, [])
    # uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out,
    #                               const llama_model_quantize_params * params);
    fn(
        "llama_model_quantize",
        ctypes.c_uint32,
        [c_char_p, c_char_p, ctypes.POINTER(LlamaModelQuantizeParams)],
    )


def _check_quantize_layout(lib: ctypes.CDLL, path: Path) -> None:
    """The defaults llama.cpp hands back must read as its source says they are; a struct
    layout that differs from the library's would scramble them (and every call after)."""
    d = lib.llama_model_quantize_default_params()
    ok = (
        d.nthread == 0
        and d.output_tensor_type == GGML_TYPE_COUNT
        and d.token_embedding_type == GGML_TYPE_COUNT
        and d.quantize_output_tensor
        and not (d.allow_requantize or d.only_copy or d.pure or d.keep_split or d.dry_run)
        and not (d.imatrix or d.kv_overrides or d.tt_overrides or d.prune_layers)
        and d.max_buf_size > 0
    )
    if not ok:
        raise NativeLibraryError(
            f"{path}: llama_model_quantize_params does not match streamtts/_llama.py "
            f"(defaults read back as ftype={d.ftype}, output_tensor_type={d.output_tensor_type}, "
            f"max_buf_size={d.max_buf_size}); rebuild with `native/build.sh`"
        )


_llama_lock = threading.Lock()
_llama_lib: ctypes.CDLL | None = None


def load_llama() -> ctypes.CDLL:
    """libllama from the loaded bridge's folder, with the quantize symbols declared (once)."""
    global _llama_lib
    bridge = load_bridge()
    with _llama_lock:
        if _llama_lib is None:
            # stt_system_info runs the bridge's one-time init: llama.cpp's log lines go to the
            # bridge's callback (quiet unless STREAMTTS_LLAMA_LOG, errors kept for messages)
            # and llama_backend_init has run.
            bridge.stt_system_info()
            bridge_path = loaded_path()
            assert bridge_path is not None
            path = bridge_path.parent / LLAMA_LIB_NAME
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise NativeLibraryError(f"cannot load {path}: {exc}; {BUILD_HINT}") from exc
            _declare_llama(lib)
            _check_quantize_layout(lib, path)
            _llama_lib = lib
        return _llama_lib
