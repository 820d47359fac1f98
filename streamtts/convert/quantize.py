"""Quantize a GGUF with llama.cpp's own ``llama_model_quantize`` (what ``llama-quantize`` runs).

Never a quantizer of ours: the published files came out of llama.cpp's, and its per-tensor
type choices (``Q4_K_M`` keeps some tensors at Q6_K, falls back to Q5_0/Q8_0 for rows that
are not a multiple of 256, ...) are part of the result.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError, NativeLibraryError

log = logging.getLogger(__name__)

# --quant names -> enum llama_ftype (include/llama.h). F32, F16 and BF16 are written by the
# converter itself (DIRECT); the others by llama.cpp's quantizer from the F16 file.
FTYPES: dict[str, int] = {
    "F32": 0,
    "F16": 1,
    "BF16": 32,
    "Q8_0": 7,
    "Q6_K": 18,
    "Q5_K_M": 17,
    "Q5_K_S": 16,
    "Q5_1": 9,
    "Q5_0": 8,
    "Q4_K_M": 15,
    "Q4_K_S": 14,
    "Q4_1": 3,
    "Q4_0": 2,
    "Q3_K_L": 13,
    "Q3_K_M": 12,
    "Q3_K_S": 11,
    "Q2_K": 10,
}
DIRECT = ("F32", "F16", "BF16")

# Approximate bits per weight of the whole file (the official README's sizes for the 8B,
# rounded up), for the disk-space check before anything is written.
_BPW = {
    "F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_K_M": 5.8,
    "Q5_K_S": 5.6, "Q5_1": 6.0, "Q5_0": 5.5, "Q4_K_M": 5.0, "Q4_K_S": 4.7, "Q4_1": 5.0, "Q4_0": 4.5, "Q3_K_L": 4.3,
    "Q3_K_M": 4.0, "Q3_K_S": 3.6, "Q2_K": 3.4,
}  # fmt: skip
# llama.cpp keeps rows whose length is not a multiple of the K-quant block (256) in a
# legacy type; Q8_0 (8.5 bits) is the largest it picks.
_FALLBACK_BPW = 8.5

# Bytes of tensor rows llama.cpp keeps in memory at once (its default is 8 GiB).
MAX_BUF_BYTES = 64 << 20


def parse_quant(name: str) -> str:
    """A --quant value, upper-cased and checked (ConfigError listing the choices)."""
    q = name.strip().upper()
    if q not in FTYPES:
        raise ConfigError(
            f"unknown --quant {name!r}: choose from {', '.join(FTYPES)} "
            "(published: Q4_K_M, Q5_K_M, Q6_K, Q8_0; F32 for exact float32 weights)"
        )
    return q


def estimate_bytes(quant: str, n_params_2d: int, n_params_1d: int, row_len: int) -> int:
    """Upper-end estimate of a quantized GGUF's size (tensor data; 1-D tensors stay F32)."""
    bpw = _BPW[quant]
    if quant.startswith("Q") and "_K" in quant and row_len % 256:
        bpw = _FALLBACK_BPW
    return int(n_params_2d * bpw / 8) + 4 * n_params_1d


def quantize(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    quant: str,
    *,
    n_threads: int = 0,
    poll: Callable[[], None] | None = None,
) -> None:
    """``llama_model_quantize(src, dst, quant)``; raises NativeLibraryError with llama.cpp's
    own message when it fails. ``poll`` is called every 0.2 s while it runs (progress);
    the call itself runs in a thread (ctypes releases the GIL)."""
    from ..model import _llama

    if quant in DIRECT:
        raise ConfigError(f"{quant} is written by the converter itself, not a quantization")
    lib = _llama.load_llama()
    params = lib.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = int(n_threads)
    params.max_buf_size = MAX_BUF_BYTES
    result: list[int] = []

    def run() -> None:
        result.append(int(lib.llama_model_quantize(
            str(src).encode(), str(dst).encode(), ctypes.byref(params)
        )))  # fmt: skip

    t0 = time.perf_counter()
    worker = threading.Thread(target=run, name=f"llama-quantize-{quant}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        if poll is not None:
            poll()
    if not result or result[0] != 0:
        detail = _llama.llama_last_error() or "no message"
        raise NativeLibraryError(
            f"llama_model_quantize({Path(src).name} -> {quant}) failed with code "
            f"{result[0] if result else '?'}: {detail}"
        )
    log.info("quantized %s to %s in %.1f s", Path(src).name, quant, time.perf_counter() - t0)
