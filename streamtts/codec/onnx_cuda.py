"""ONNX Runtime codec decoder with I/O binding: the CUDA middle option.

``OnnxDecoder.decode`` hands NumPy arrays to ``session.run``, which allocates
the inputs and outputs anew on every call and, on the CUDA execution provider,
copies them through temporary buffers. Here the inputs and outputs are bound
to host buffers allocated once (grown only if a call ever exceeds them), and
``n_quantizers`` lives on the device, bound once. ORT then copies the codes to
its device arena and the samples straight back into our buffer.

``load_decoder`` picks this class when ``use_gpu_audio`` is set and ONNX
Runtime has the CUDA provider (``pip install onnxruntime-gpu``). The binding
logic is device-agnostic, so it is tested on CPU with ``device="cpu"``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..constants import FRAME_SAMPLES, N_VQ
from ..errors import CodecError
from .onnx import (
    MAX_BATCH,
    _import_ort,
    check_codes,
    decoder_session,
    to_levels,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..config import EngineConfig

log = logging.getLogger(__name__)


def cuda_provider_available() -> bool:
    try:
        ort = _import_ort()
    except CodecError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


class OnnxBoundDecoder:
    """:class:`~streamtts.codec.AudioDecoder` on ONNX Runtime with I/O binding."""

    max_batch: int = MAX_BATCH

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cuda",
        device_id: int = 0,
        threads: int = 0,
        max_frames: int = 133,
        n_vq: int = N_VQ,
    ) -> None:
        if device not in ("cuda", "cpu"):
            raise CodecError(f"device must be cuda or cpu, got {device!r}")
        self._s = decoder_session(path, use_gpu=device == "cuda", threads=threads, n_vq=n_vq)
        self.n_vq, self._levels = n_vq, self._s.levels
        if device == "cuda" and self._s.provider != "CUDAExecutionProvider":
            raise CodecError(
                f"ONNX Runtime did not load the CUDA provider for {path} (got {self._s.provider}); "
                "install onnxruntime-gpu matching your CUDA, or set use_gpu_audio: false"
            )
        ort = _import_ort()
        self.path = self._s.path
        self.provider = self._s.provider
        self.device = device
        self.device_id = device_id
        self._names_in = self._s.input_names
        self._names_out = self._s.output_names
        self._io = self._s.session.io_binding()
        # n_quantizers never changes: on the device once, bound once (bindings persist).
        self._nq = ort.OrtValue.ortvalue_from_numpy(self._s.n_quantizers, device, device_id)
        self._io.bind_ortvalue_input(self._names_in[1], self._nq)
        self._lock = threading.Lock()
        self._cap_b = 0
        self._cap_t = 0
        self.allocations = 0  # buffer (re)allocations so far: 1 in steady state
        self._reserve(self.max_batch, max_frames)

    @classmethod
    def from_config(cls, cfg: EngineConfig, n_vq: int = N_VQ) -> OnnxBoundDecoder:
        frames = cfg.decode_context_frames + max(cfg.chunk_frames)
        return cls(
            cfg.audio_decoder_onnx, device="cuda", threads=cfg.codec_threads, max_frames=frames,
            n_vq=n_vq,
        )  # fmt: skip

    def _reserve(self, b: int, t: int) -> None:
        """Host buffers for calls up to (b, t): allocated at load, grown only past it."""
        if b <= self._cap_b and t <= self._cap_t:
            return
        self._cap_b, self._cap_t = max(b, self._cap_b), max(t, self._cap_t)
        self._codes = np.zeros(self._levels * self._cap_b * self._cap_t, dtype=np.int64)
        self._audio = np.zeros(self._cap_b * self._cap_t * FRAME_SAMPLES, dtype=np.float32)
        self._lengths = np.zeros(self._cap_b, dtype=np.int64)
        self.allocations += 1
        if self.allocations > 1:
            log.info("codec buffers grown to batch %d x %d frames", self._cap_b, self._cap_t)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(B, T, n_vq) int64 -> (B, T*1920) float32; batches over ``max_batch`` are split."""
        codes = check_codes(codes, self.n_vq)
        b, t, _ = codes.shape
        if b == 0 or t == 0:
            return np.zeros((b, t * FRAME_SAMPLES), dtype=np.float32)
        if b > self.max_batch:
            parts = [
                self.decode(codes[i : i + self.max_batch]) for i in range(0, b, self.max_batch)
            ]
            return np.concatenate(parts, axis=0)
        with self._lock:
            return self._decode_batch(codes)

    def _decode_batch(self, codes: np.ndarray) -> np.ndarray:
        b, t, _ = codes.shape
        self._reserve(b, t)
        n = t * FRAME_SAMPLES
        lv = self._levels
        x = to_levels(codes, lv, self._codes[: lv * b * t].reshape(lv, b, t))  # (levels, B, T)
        audio = self._audio[: b * n].reshape(b, 1, n)
        lengths = self._lengths[:b]
        io = self._io
        io.bind_input(self._names_in[0], "cpu", 0, np.int64, x.shape, x.ctypes.data)
        io.bind_output(self._names_out[0], "cpu", 0, np.float32, audio.shape, audio.ctypes.data)
        io.bind_output(self._names_out[1], "cpu", 0, np.int64, lengths.shape, lengths.ctypes.data)
        try:
            self._s.session.run_with_iobinding(io)
        except Exception as exc:
            raise CodecError(f"codec decoder failed on {b} x {t} frames: {exc}") from exc
        if np.any(lengths != n):
            raise CodecError(
                f"codec decoder returned lengths {lengths.tolist()} for {t} frames, expected {n} each"
            )
        return np.array(audio[:, 0, :], dtype=np.float32)  # a copy: the buffer is reused

    def buffers(self) -> tuple[Any, ...]:
        """Addresses of the bound host buffers (tests check they stay put)."""
        return (self._codes.ctypes.data, self._audio.ctypes.data, self._lengths.ctypes.data)
