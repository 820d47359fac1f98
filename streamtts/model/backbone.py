"""The Qwen3 backbone, run by llama.cpp through our C bridge.

``Backbone`` owns one llama.cpp model + context. It is fed embedding rows (one per
stream and tick, each with its own sequence id and position) and returns, for the
rows marked as outputs, the final hidden state (after the last RMSNorm) and the
selected columns of the GGUF output layer's logits.

Two ways to decode:

- ``decode(embd, pos, seq, output, hidden_out=None, logits_out=None)`` checks every
  array (dtype, shape, contiguity, buffer sizes) and is the one to use anywhere but
  the engine's hot loop;
- ``bind(...)`` once with persistent buffers, then ``decode_bound(n_rows)`` every tick:
  no NumPy allocation, no array inspection, just the native call on stored pointers.

Every native failure raises ``BackboneError(op, code, message)``; a call that fails
validation leaves the KV cache as it was. The GIL is released during native calls.
One Backbone must be used by one thread at a time (the engine thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ..errors import BackboneError, ConfigError, DeviceMemoryError, ModelFileError
from . import _llama
from ._llama import STT_E_INVALID, STT_E_MODEL
from .placement import Placement, parse_placement
from .threads import physical_cores

log = logging.getLogger(__name__)

# ggml_type ids (ggml.h) of the KV cache types llama.cpp accepts.
KV_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "bf16": 30,
}

# llama_flash_attn_type: -1 auto, 0 disabled, 1 enabled.
FLASH_ATTN: dict[str, int] = {
    "auto": -1,
    "enabled": 1,
    "enable": 1,
    "on": 1,
    "true": 1,
    "disabled": 0,
    "disable": 0,
    "off": 0,
    "false": 0,
}

F32 = npt.NDArray[np.float32]

# llama.cpp attends over a sequence's used KV cells rounded up to a multiple of this
# (llama-kv-cache.cpp, n_pad_cur): a step's cost steps up at each multiple
KV_PAD = 256


class BackboneParams(msgspec.Struct, frozen=True, kw_only=True):
    model_path: str
    # total KV cells, all sequences; llama.cpp rounds each sequence's share up to a multiple of 256
    n_ctx: int
    n_batch: int  # max rows per decode() call
    n_seq_max: int = 1
    n_threads: int = 0  # 0 = physical cores
    n_threads_batch: int = 0  # threads for multi-row decodes; 0 = n_threads
    n_ubatch: int = 0  # physical batch; 0 = n_batch
    n_gpu_layers: int = 0  # -1 = all
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str | bool = "auto"  # auto | enabled | disabled (also true/false)
    kv_unified: bool = False
    # CPU worker threads: None = llama.cpp's default pool; 0..100 = our own ggml threadpool
    # with this polling level (0 = workers sleep between decodes instead of spinning).
    thread_poll: int | None = 0
    use_mmap: bool = True
    # Linux, our own pool (thread_poll 0..100), 2+ threads: each of llama.cpp's threads keeps
    # one CPU (the decoding thread calls pin_caller), so two never share a core (bridge.c)
    pin_threads: bool = False


def kv_type_id(name: str) -> int:
    try:
        return KV_TYPES[name.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"unknown KV cache type {name!r}; choose one of {', '.join(KV_TYPES)}"
        ) from None


def flash_attn_id(value: str | bool) -> int:
    if isinstance(value, bool):
        return 1 if value else 0
    try:
        return FLASH_ATTN[str(value).strip().lower()]
    except KeyError:
        raise ConfigError(
            f"flash_attn must be auto, enabled or disabled (or true/false), got {value!r}"
        ) from None


class Backbone:
    """One llama.cpp model + context (see the module docstring)."""

    def __init__(self, params: BackboneParams) -> None:
        self.params = params
        self._validate_params(params)
        path = Path(params.model_path).expanduser()
        if not path.is_file():
            raise ModelFileError(path, "a GGUF model file", "file not found")
        self._lib = _llama.load_bridge()
        self._stack = contextlib.ExitStack()
        self._handle: int | None = None
        self._closed = False

        n_threads = params.n_threads if params.n_threads > 0 else physical_cores()
        cp = _llama.SttParams()
        self._lib.stt_params_default(ctypes.byref(cp))
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_seq_max = params.n_seq_max
        cp.n_threads = n_threads
        cp.n_threads_batch = params.n_threads_batch if params.n_threads_batch > 0 else n_threads
        cp.n_gpu_layers = params.n_gpu_layers
        cp.type_k = kv_type_id(params.type_k)
        cp.type_v = kv_type_id(params.type_v)
        cp.flash_attn = flash_attn_id(params.flash_attn)
        cp.kv_unified = int(params.kv_unified)
        cp.embeddings = 1
        cp.poll = -1 if params.thread_poll is None else params.thread_poll
        cp.use_mmap = int(params.use_mmap)
        cp.pin_threads = int(params.pin_threads)

        status = ctypes.c_int32(0)
        err = ctypes.create_string_buffer(2048)
        handle = self._lib.stt_create(
            str(path).encode(), ctypes.byref(cp), ctypes.byref(status), err, len(err)
        )
        if not handle:
            msg = err.value.decode("utf-8", "replace")
            if "unable to allocate" in msg or "failed to allocate" in msg:
                raise DeviceMemoryError(_too_big(path, params, msg))
            if status.value == STT_E_MODEL:
                raise ModelFileError(path, "a GGUF model llama.cpp can load", msg)
            raise BackboneError("create", status.value, msg)
        self._handle = int(handle)
        self._h = ctypes.c_void_p(self._handle)
        self._stack.callback(self._free)

        lib, h = self._lib, self._h
        self.n_embd: int = lib.stt_n_embd(h)
        self.n_vocab: int = lib.stt_n_vocab(h)
        self.n_ctx: int = lib.stt_n_ctx(h)
        self.n_ctx_seq: int = lib.stt_n_ctx_seq(h)
        self.n_seq_max: int = lib.stt_n_seq_max(h)
        self.n_batch: int = lib.stt_n_batch(h)
        self.n_threads: int = lib.stt_n_threads(h)
        self.n_threads_max: int = lib.stt_n_threads_max(h)  # the most set_threads takes
        self._n_cols: int = int(self.n_vocab)
        self._bound: tuple[int | None, ...] | None = None
        self._bound_arrays: tuple[npt.NDArray[Any] | None, ...] = ()
        self._bound_rows = 0
        self._bound_out_rows = 0
        self._bound_strides = (0, 0)
        self._bound_cols = 0
        self._lent = ctypes.c_void_p()
        self._lent_ref = ctypes.byref(self._lent)
        self.lent_logits = 0
        """Where the last ``decode_bound(..., lend=True)`` left its logits rows: llama.cpp's
        own buffer (valid until the next decode), or 0 when they were copied to the bound
        ``logits_out`` (or not lent)."""
        raw = lib.stt_placement(h)
        self.placement: Placement = parse_placement(
            raw.decode("utf-8", "replace") if raw else "", _llama.loaded_backend(), _llama.devices()
        )
        log.info(
            "backbone %s: n_embd=%d n_vocab=%d n_ctx=%d (per sequence %d) n_seq_max=%d n_batch=%d "
            "threads=%d flash_attn=%s kv=%s/%s gpu_layers=%d thread_poll=%s [%s; %s]",
            path.name, self.n_embd, self.n_vocab, self.n_ctx, self.n_ctx_seq, self.n_seq_max,
            self.n_batch, self.n_threads, params.flash_attn, params.type_k, params.type_v,
            params.n_gpu_layers, params.thread_poll, _llama.bridge_version(lib), self.placement.line(),
        )  # fmt: skip

    @staticmethod
    def _validate_params(p: BackboneParams) -> None:
        if p.n_ctx < 1:
            raise ConfigError(f"n_ctx must be >= 1, got {p.n_ctx}")
        if p.n_batch < 1:
            raise ConfigError(f"n_batch must be >= 1, got {p.n_batch}")
        if not 1 <= p.n_seq_max <= 256:
            raise ConfigError(f"n_seq_max must be in [1, 256], got {p.n_seq_max}")
        if p.n_ubatch < 0 or p.n_threads < 0 or p.n_threads_batch < 0:
            raise ConfigError("n_ubatch, n_threads and n_threads_batch must be >= 0")
        if p.thread_poll is not None and not 0 <= p.thread_poll <= 100:
            raise ConfigError(f"thread_poll must be None or in [0, 100], got {p.thread_poll}")
        kv_type_id(p.type_k)
        kv_type_id(p.type_v)
        flash_attn_id(p.flash_attn)

    # -- lifetime ---------------------------------------------------------------------------

    def _free(self) -> None:
        handle, self._handle = self._handle, None
        self._bound = None
        self._bound_arrays = ()
        if handle is not None:
            self._lib.stt_free(ctypes.c_void_p(handle))

    def close(self) -> None:
        """Free the llama.cpp context and model. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stack.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Backbone:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # last resort only; owners call close()
        if getattr(self, "_handle", None) is not None and not getattr(self, "_closed", True):
            self.close()

    def _check_open(self, op: str) -> ctypes.c_void_p:
        if self._handle is None:
            raise BackboneError(op, STT_E_INVALID, "the backbone is closed")
        return self._h

    def _raise(self, op: str, code: int) -> None:
        raw = self._lib.stt_last_error(self._h)
        msg = raw.decode("utf-8", "replace") if raw else ""
        raise BackboneError(op, code, msg or _llama.STATUS_NAMES.get(code, ""))

    # -- decoding ----------------------------------------------------------------------------

    @property
    def n_logit_columns(self) -> int:
        """Columns per logits_out row: the selection set by set_logit_columns, else n_vocab."""
        return self._n_cols

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        """The llama.cpp threads of a one-row decode and of a multi-row one (default: the
        same), each 1 to ``n_threads_max``; in force from the next decode on."""
        nb = n_threads if n_threads_batch is None else n_threads_batch
        rc = self._lib.stt_set_n_threads(self._check_open("set_threads"), n_threads, nb)
        if rc != 0:
            raise ConfigError(f"threads must be 1 to {self.n_threads_max}, got {n_threads} and {nb}")

    def pin_caller(self, on: bool = True) -> int | None:
        """Pin the calling thread, the one that decodes, to the CPU the pinned threadpool left
        for it (``pin_threads``); that CPU, or None when not pinned. ``on=False``: give the
        thread back the CPUs it had (None)."""
        cpu = int(self._lib.stt_pin_caller(self._check_open("pin_caller"), int(on)))
        return cpu if cpu >= 0 else None

    @property
    def cpu_decodes(self) -> bool:
        """Whether the layers run on the CPU (its threads do a decode's work)."""
        return not self.placement.on_gpu

    @property
    def threads(self) -> tuple[int, int]:
        """The threads of a one-row decode and of a multi-row one, as llama.cpp has them."""
        h = self._check_open("threads")
        return int(self._lib.stt_n_threads(h)), int(self._lib.stt_n_threads_batch(h))

    def set_tick_pool(self, pool: int | None) -> None:
        """Cut the copy of a decode's outputs across the tick's threads: a ``stt_pool *``
        (``kernels.TickPool.handle``), or None for the caller's thread alone. The caller
        detaches it before the pool stops."""
        self._lib.stt_set_pool(self._check_open("set_tick_pool"), pool)

    def set_logit_columns(self, cols: npt.ArrayLike | None) -> None:
        """Output-layer columns decode() copies into logits_out (None = all n_vocab)."""
        h = self._check_open("set_logit_columns")
        if cols is None:
            arr = None
            n = 0
        else:
            arr = np.ascontiguousarray(np.asarray(cols).reshape(-1))
            if arr.dtype.kind not in "iu":
                raise BackboneError(
                    "set_logit_columns", STT_E_INVALID, f"columns must be integers, got {arr.dtype}"
                )
            arr = arr.astype(np.int32)
            n = int(arr.size)
            if n == 0:
                arr = None
        rc = self._lib.stt_set_logit_columns(h, None if arr is None else arr.ctypes.data, n)
        if rc < 0:
            self._raise("set_logit_columns", rc)
        self._n_cols = n if n > 0 else self.n_vocab

    def decode(
        self,
        embd: npt.NDArray[Any],
        pos: npt.NDArray[Any],
        seq: npt.NDArray[Any],
        output: npt.NDArray[Any],
        hidden_out: npt.NDArray[Any] | None = None,
        logits_out: npt.NDArray[Any] | None = None,
    ) -> int:
        """Decode rows; returns the number of output rows (see the module docstring).

        embd (n, n_embd) float32 C-contiguous; pos/seq (n,) int32; output (n,) int8 or bool.
        hidden_out (>= n_out, n_embd) float32 and logits_out (>= n_out, n_logit_columns)
        float32, C-contiguous and writable, receive the output rows in batch order.
        hidden_out None: llama.cpp's embeddings mode is off for this call.
        """
        h = self._check_open("decode")
        n = self._check_rows(embd, pos, seq, output)
        n_out = int(np.count_nonzero(output))
        self._check_out("hidden_out", hidden_out, n_out, self.n_embd)
        self._check_out("logits_out", logits_out, n_out, self._n_cols)
        rc = self._lib.stt_decode_ex(
            h,
            n,
            embd.ctypes.data,
            pos.ctypes.data,
            seq.ctypes.data,
            output.ctypes.data,
            None if hidden_out is None else hidden_out.ctypes.data,
            None if logits_out is None else logits_out.ctypes.data,
            _out_rows(hidden_out, logits_out),
        )
        if rc < 0:
            self._raise("decode", rc)
        return int(rc)

    def bind(
        self,
        embd: npt.NDArray[Any],
        pos: npt.NDArray[Any],
        seq: npt.NDArray[Any],
        output: npt.NDArray[Any],
        hidden_out: npt.NDArray[Any] | None,
        logits_out: npt.NDArray[Any] | None,
    ) -> None:
        """Register persistent buffers for decode_bound().

        The caller fills rows [0, n_rows) of embd/pos/seq/output in place each tick.
        hidden_out (R, n_embd) and logits_out (R, n_logit_columns) may have fewer rows than
        embd: the bridge refuses a decode whose output rows would not fit (nothing is
        written out of bounds). Keep the arrays alive and unmoved (the backbone holds
        references); call bind() again after changing the logit columns.
        """
        self._check_open("bind")
        rows = self._check_rows(embd, pos, seq, output)
        self._check_out("hidden_out", hidden_out, 1, self.n_embd)
        self._check_out("logits_out", logits_out, 1, self._n_cols)
        if (
            hidden_out is not None
            and logits_out is not None
            and hidden_out.shape[0] != logits_out.shape[0]
        ):
            raise BackboneError(
                "bind", STT_E_INVALID,
                f"hidden_out has {hidden_out.shape[0]} rows but logits_out has {logits_out.shape[0]}",
            )  # fmt: skip
        self._bound_arrays = (embd, pos, seq, output, hidden_out, logits_out)
        self._bound = tuple(_llama.ptr(a) for a in self._bound_arrays)
        self._bound_rows = rows
        self._bound_out_rows = _out_rows(hidden_out, logits_out)
        self._bound_strides = (
            0 if hidden_out is None else hidden_out.strides[0],
            0 if logits_out is None else logits_out.strides[0],
        )
        self._bound_cols = 0 if logits_out is None else int(logits_out.shape[1])

    def decode_bound(self, n_rows: int, want_hidden: bool = True, out_offset: int = 0, lend: bool = False) -> int:
        """Decode rows [0, n_rows) of the bound buffers; returns the number of output rows.

        The output rows land in the bound hidden_out / logits_out from row out_offset on.
        want_hidden=False skips the hidden states (llama.cpp's embeddings mode off).
        lend=True (out_offset 0): the logits rows stay where llama.cpp put them when they
        lie as the bound logits_out would hold them; :attr:`lent_logits` then says where
        (else 0, and they were copied as usual).
        """
        self.lent_logits = 0
        b = self._bound
        if b is None or self._handle is None:
            raise BackboneError(
                "decode_bound",
                STT_E_INVALID,
                "no buffers bound (call bind() first)"
                if self._handle is not None
                else "the backbone is closed",
            )
        if not 0 < n_rows <= self._bound_rows:
            raise BackboneError(
                "decode_bound",
                STT_E_INVALID,
                f"n_rows = {n_rows}, must be in [1, {self._bound_rows}] (bound rows)",
            )
        if self._bound_cols and self._n_cols != self._bound_cols:
            raise BackboneError(
                "decode_bound", STT_E_INVALID,
                f"{self._n_cols} logit columns selected but the bound logits_out has {self._bound_cols}; bind() again",
            )  # fmt: skip
        hidden = b[4] if want_hidden else None
        logits = b[5]
        if out_offset:
            if not 0 <= out_offset <= self._bound_out_rows:
                raise BackboneError(
                    "decode_bound", STT_E_INVALID,
                    f"out_offset = {out_offset}, must be in [0, {self._bound_out_rows}] (bound output rows)",
                )  # fmt: skip
            hs, ls = self._bound_strides
            hidden = _offset(hidden, out_offset * hs)
            logits = _offset(logits, out_offset * ls)
        room = self._bound_out_rows - out_offset
        if lend and not out_offset:
            rc: int = self._lib.stt_decode_lend(self._h, n_rows, b[0], b[1], b[2], b[3], hidden, logits, room, self._lent_ref)
            self.lent_logits = self._lent.value or 0
        else:
            rc = self._lib.stt_decode_ex(self._h, n_rows, b[0], b[1], b[2], b[3], hidden, logits, room)
        if rc < 0:
            self._raise("decode_bound", rc)
        return rc

    def copy_logits_row(self, i: int, out: npt.NDArray[Any]) -> None:
        """Full logits row (n_vocab floats) of output i of the last decode into out."""
        h = self._check_open("copy_logits_row")
        if not (
            isinstance(out, np.ndarray)
            and out.dtype == np.float32
            and out.flags.c_contiguous
            and out.flags.writeable
            and out.size >= self.n_vocab
        ):
            raise BackboneError(
                "copy_logits_row", STT_E_INVALID,
                f"out must be a writable C-contiguous float32 array of >= n_vocab = {self.n_vocab} elements, got "
                + _describe(out),
            )  # fmt: skip
        rc = self._lib.stt_copy_logits_row(h, int(i), out.ctypes.data)
        if rc < 0:
            self._raise("copy_logits_row", rc)

    # -- KV cache ------------------------------------------------------------------------------

    def seq_rm(self, seq: int, start: int = 0) -> None:
        """Remove the cells of sequence seq at positions >= start from the KV cache (frees
        them); every cell by default."""
        rc = self._lib.stt_seq_rm(self._check_open("seq_rm"), int(seq), int(start))
        if rc < 0:
            self._raise("seq_rm", rc)

    def seq_pos_max(self, seq: int) -> int:
        """Largest position sequence seq holds; -1 when it holds nothing."""
        out = ctypes.c_int32(0)
        rc = self._lib.stt_seq_pos_max(self._check_open("seq_pos_max"), int(seq), ctypes.byref(out))
        if rc < 0:
            self._raise("seq_pos_max", rc)
        return int(out.value)

    def seq_state(self, seq: int) -> npt.NDArray[np.uint8]:
        """Snapshot of sequence seq's KV cells (positions, K, V) as bytes."""
        h = self._check_open("seq_state")
        size = ctypes.c_uint64(0)
        rc = self._lib.stt_seq_state_size(h, int(seq), ctypes.byref(size))
        if rc < 0:
            self._raise("seq_state", rc)
        buf = np.empty(max(int(size.value), 1), dtype=np.uint8)
        written = ctypes.c_uint64(0)
        rc = self._lib.stt_seq_state_get(h, int(seq), buf.ctypes.data, buf.nbytes, ctypes.byref(written))
        if rc < 0:
            self._raise("seq_state", rc)
        return buf[: int(written.value)]

    def load_seq_state(self, seq: int, state: npt.NDArray[np.uint8]) -> None:
        """Load a :meth:`seq_state` snapshot into the empty sequence seq."""
        s = np.ascontiguousarray(state, dtype=np.uint8)
        rc = self._lib.stt_seq_state_set(self._check_open("load_seq_state"), int(seq), s.ctypes.data, s.nbytes)
        if rc < 0:
            self._raise("load_seq_state", rc)

    # -- validation helpers --------------------------------------------------------------------

    def _check_rows(
        self,
        embd: npt.NDArray[Any],
        pos: npt.NDArray[Any],
        seq: npt.NDArray[Any],
        output: npt.NDArray[Any],
    ) -> int:
        def bad(msg: str) -> BackboneError:
            return BackboneError("decode", STT_E_INVALID, msg)

        if not isinstance(embd, np.ndarray) or embd.dtype != np.float32 or embd.ndim != 2:
            raise bad(
                f"embd must be a 2-D float32 array (n, n_embd={self.n_embd}), got {_describe(embd)}"
            )
        n, width = embd.shape
        if width != self.n_embd:
            raise bad(f"embd rows have {width} values, the model's n_embd is {self.n_embd}")
        if not 1 <= n <= self.n_batch:
            raise bad(f"{n} rows, must be in [1, n_batch = {self.n_batch}]")
        if not embd.flags.c_contiguous:
            raise bad("embd must be C-contiguous (np.ascontiguousarray)")
        for name, a, dtypes in (
            ("pos", pos, (np.int32,)),
            ("seq", seq, (np.int32,)),
            ("output", output, (np.int8, np.bool_)),
        ):
            if not isinstance(a, np.ndarray) or a.dtype not in dtypes or a.ndim != 1:
                want = " or ".join(np.dtype(d).name for d in dtypes)
                raise bad(f"{name} must be a 1-D {want} array, got {_describe(a)}")
            if a.shape[0] != n:
                raise bad(f"{name} has {a.shape[0]} entries, embd has {n} rows")
            if not a.flags.c_contiguous:
                raise bad(f"{name} must be contiguous")
        return int(n)

    def _check_out(self, name: str, a: npt.NDArray[Any] | None, rows: int, cols: int) -> None:
        if a is None:
            return
        if (
            not isinstance(a, np.ndarray)
            or a.dtype != np.float32
            or a.ndim != 2
            or not a.flags.c_contiguous
            or not a.flags.writeable
        ):
            raise BackboneError(
                "decode",
                STT_E_INVALID,
                f"{name} must be a writable C-contiguous 2-D float32 array, got {_describe(a)}",
            )
        if a.shape[0] < rows or a.shape[1] != cols:
            raise BackboneError(
                "decode",
                STT_E_INVALID,
                f"{name} has shape {a.shape}, needs at least ({rows}, {cols}) rows and exactly {cols} columns",
            )


def _too_big(path: Path, params: BackboneParams, msg: str) -> str:
    """One line for a model (or KV cache) larger than the memory it was to go to."""
    gpus = [d for d in _llama.devices() if d["type"] != "cpu"]
    where = ", ".join(f"{d['name']} ({d['description']}) {int(d['free']) / 2**20:.0f} MiB free" for d in gpus)
    advice = "offload fewer layers (n_gpu_layers), shrink n_ctx or max_streams" if gpus else "shrink n_ctx or max_streams"
    return (
        f"{path.name} with n_ctx {params.n_ctx} does not fit in the {'device' if gpus else 'host'}'s memory "
        f"({where + '; ' if where else ''}{path.stat().st_size / 2**20:.0f} MiB of weights): llama.cpp: "
        f"{' '.join(msg.split())}; {advice}, or use a smaller quantization"
    )


def _offset(p: int | None, nbytes: int) -> int | None:
    return None if p is None else p + nbytes


def _out_rows(hidden_out: npt.NDArray[Any] | None, logits_out: npt.NDArray[Any] | None) -> int:
    """Rows the given output buffers can take (the smaller one; huge when there is none)."""
    rows = [a.shape[0] for a in (hidden_out, logits_out) if a is not None]
    return int(min(rows)) if rows else 2**31 - 1


def _describe(a: object) -> str:
    if isinstance(a, np.ndarray):
        flags = "" if a.flags.c_contiguous else ", not contiguous"
        return f"{a.dtype} array of shape {a.shape}{flags}"
    return type(a).__name__
