"""Audio codec backends (MOSS-Audio-Tokenizer): codes <-> 24 kHz waveform.

The engine only sees the two protocols below; ``load_decoder`` /
``load_encoder`` pick a backend from ``EngineConfig.audio_backend`` and import
it lazily, so ``import streamtts.codec`` never pulls in ONNX Runtime or
TensorRT (a process that only uses one backend does not need the other).

Shapes are in the engine's layout (frames first, codebooks last); the
backends transpose to the codec's (32, B, T) layout themselves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from ..errors import CodecError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import EngineConfig

__all__ = ["AudioDecoder", "AudioEncoder", "load_decoder", "load_encoder"]

log = logging.getLogger(__name__)


@runtime_checkable
class AudioDecoder(Protocol):
    """Codes -> waveform. Stateless: streaming is windows with left context."""

    max_batch: int

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(B, T, 32) int64 codes in [0, 1024) -> (B, T*1920) float32 samples at 24 kHz."""
        ...


@runtime_checkable
class AudioEncoder(Protocol):
    """Waveform -> codes (reference voices)."""

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """(N,) float32 24 kHz mono, N % 1920 == 0 -> (N/1920, 32) int64 codes."""
        ...


def _unsupported(backend: str) -> ConfigError:
    return ConfigError(
        f"audio_backend {backend!r} is not supported by streamtts; use 'onnx' or 'trt'"
    )


def load_decoder(cfg: EngineConfig) -> AudioDecoder:
    """The decoder of ``cfg.audio_backend`` (onnx | trt)."""
    backend = cfg.audio_backend
    if backend == "onnx":
        if cfg.use_gpu_audio:
            # onnxruntime-gpu: the CUDA provider with I/O binding (codec/onnx_cuda.py)
            from .onnx_cuda import OnnxBoundDecoder, cuda_provider_available

            if cuda_provider_available():
                try:
                    return OnnxBoundDecoder.from_config(cfg)
                except CodecError as exc:  # provider listed but its CUDA libraries did not load
                    log.warning("%s; decoding the codec on the CPU", exc)
        from .onnx import OnnxDecoder

        return OnnxDecoder.from_config(cfg)
    if backend == "trt":
        from .trt import load_trt_decoder

        return load_trt_decoder(cfg)
    raise _unsupported(backend)


def load_encoder(cfg: EngineConfig) -> AudioEncoder:
    """The encoder of ``cfg.audio_backend`` (onnx | trt)."""
    backend = cfg.audio_backend
    if backend == "onnx":
        from .onnx import OnnxEncoder

        return OnnxEncoder.from_config(cfg)
    if backend == "trt":
        from .trt import load_trt_encoder

        return load_trt_encoder(cfg)
    raise _unsupported(backend)
