"""Runtime: the audio codec backends (MOSS-Audio-Tokenizer), codes <-> 24 kHz waveform.

The engine only sees the two protocols below; ``load_decoder`` /
``load_encoder`` pick a backend from ``EngineConfig.audio_backend`` and import
it lazily, so ``import streamtts.codec`` never pulls in ONNX Runtime or
TensorRT (a process that only uses one backend does not need the other).

Shapes are in the engine's layout (frames first, codebooks last); the
backends transpose to the codec's (levels, B, T) layout themselves. A model has
``n_vq`` codebooks (its config.json: 32 for MOSS-TTS, 16 for TTSD, VoiceGenerator and
SoundEffect); the codec has 32 levels and decodes the first ``n_quantizers = n_vq``,
so every backend is made for the model's n_vq (the loaders read it from the model's
config.json unless given).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from ..errors import CodecError, ConfigError, ModelFileError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import EngineConfig
    from .slot_decoder import SlotDecoder

__all__ = [
    "AudioDecoder",
    "AudioEncoder",
    "find_streaming_decoder",
    "load_decoder",
    "load_encoder",
    "load_streaming_decoder",
    "model_n_vq",
]

log = logging.getLogger(__name__)


@runtime_checkable
class AudioDecoder(Protocol):
    """Codes -> waveform. Stateless: streaming is windows with left context."""

    max_batch: int

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(B, T, n_vq) int64 codes in [0, 1024) -> (B, T*1920) float32 samples at 24 kHz."""
        ...


@runtime_checkable
class AudioEncoder(Protocol):
    """Waveform -> codes (reference voices)."""

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """(N,) float32 24 kHz mono, N % 1920 == 0 -> (N/1920, n_vq) int64 codes."""
        ...


def model_n_vq(cfg: EngineConfig) -> int:
    """The model's codebook count: ``n_vq`` of its config.json (found as the engine finds
    it), 32 (MOSS-TTS) without one."""
    from ..config import find_model_config
    from ..core.tokens import load_token_ids

    return load_token_ids(find_model_config(cfg)).n_vq


def _unsupported(backend: str) -> ConfigError:
    return ConfigError(
        f"audio_backend {backend!r} is not supported by streamtts; use 'onnx' or 'trt'"
    )


def load_decoder(cfg: EngineConfig, n_vq: int | None = None) -> AudioDecoder:
    """The decoder of ``cfg.audio_backend`` (onnx | trt) for ``n_vq`` codebooks (default:
    the model's, :func:`model_n_vq`)."""
    backend = cfg.audio_backend
    n_vq = model_n_vq(cfg) if n_vq is None else n_vq
    if backend == "onnx":
        if cfg.use_gpu_audio:
            # onnxruntime-gpu: the CUDA provider with I/O binding (codec/onnx_cuda.py)
            from .onnx_cuda import OnnxBoundDecoder, cuda_provider_available

            if cuda_provider_available():
                try:
                    return OnnxBoundDecoder.from_config(cfg, n_vq)
                except CodecError as exc:  # provider listed but its CUDA libraries did not load
                    log.warning("%s; decoding the codec on the CPU", exc)
        from .onnx import OnnxDecoder

        return OnnxDecoder.from_config(cfg, n_vq)
    if backend == "trt":
        from .trt import load_trt_decoder

        return load_trt_decoder(cfg, n_vq)
    raise _unsupported(backend)


def load_encoder(cfg: EngineConfig, n_vq: int | None = None) -> AudioEncoder:
    """The encoder of ``cfg.audio_backend`` (onnx | trt), returning the first ``n_vq``
    levels (default: the model's n_vq, :func:`model_n_vq`)."""
    backend = cfg.audio_backend
    n_vq = model_n_vq(cfg) if n_vq is None else n_vq
    if backend == "onnx":
        from .onnx import OnnxEncoder

        return OnnxEncoder.from_config(cfg, n_vq)
    if backend == "trt":
        from .trt import load_trt_encoder

        return load_trt_encoder(cfg, n_vq)
    raise _unsupported(backend)


def _streaming_device(cfg: EngineConfig) -> str:
    """Where the streaming graph runs: beside the stateless decoder (ONNX Runtime's CUDA
    provider with use_gpu_audio when it is installed, else the CPU)."""
    if cfg.audio_backend != "onnx" or not cfg.use_gpu_audio:
        return "cpu"
    from .onnx_cuda import cuda_provider_available

    return "cuda" if cuda_provider_available() else "cpu"


STREAMING_NAME = "decoder_streaming.onnx"
STREAMING_ENGINE_NAME = "decoder_streaming.engine"  # streamtts build-engine --kind streaming
_OFF = {"off", "false", "no", "0", "none"}


def find_streaming_decoder(cfg: EngineConfig) -> tuple[Path | None, bool]:
    """The streaming decoder to use and whether the config named it (else: found beside
    ``audio_decoder_onnx``, or with ``audio_backend: trt`` its engine beside
    ``audio_decoder_trt``); ``(None, False)`` for the windowed path."""
    value = str(cfg.codec_streaming or "").strip()
    if value.lower() in _OFF:
        return None, False
    if value:
        path = Path(value)
        if not path.is_file():
            raise ModelFileError(
                path,
                "a streaming codec decoder (streamtts codec build)",
                "set by 'codec_streaming', not found",
            )
        return path, True
    if cfg.audio_backend == "onnx" and cfg.audio_decoder_onnx:
        near = Path(cfg.audio_decoder_onnx).with_name(STREAMING_NAME)
        if near.is_file():
            return near, False
    if cfg.audio_backend == "trt" and cfg.audio_decoder_trt:
        near = Path(cfg.audio_decoder_trt).with_name(STREAMING_ENGINE_NAME)
        if near.is_file():
            return near, False
    return None, False


def load_streaming_decoder(
    cfg: EngineConfig, n_slots: int, n_vq: int | None = None
) -> SlotDecoder | None:
    """The stateful decoder when one is configured or found, else None (windowed path).

    One found beside ``decoder.onnx`` that is stale (built from other weights than the
    checkpoint it names), built for another n_vq than the model's (default:
    :func:`model_n_vq`) or unreadable is passed over with a warning, as a stale fused
    GGUF is; one the config names must load.
    """
    path, named = find_streaming_decoder(cfg)
    if path is None:
        return None
    n_vq = model_n_vq(cfg) if n_vq is None else n_vq
    if cfg.audio_backend == "trt" or path.suffix == ".engine":
        return _load_trt_streaming(cfg, path, named, n_slots, n_vq)
    if cfg.audio_backend != "onnx":
        raise ConfigError(
            f"codec_streaming needs audio_backend 'onnx' (ONNX Runtime), not {cfg.audio_backend!r}"
        )
    from .streaming import StreamingDecoder

    device = _streaming_device(cfg)
    try:
        dec = StreamingDecoder(
            path,
            n_slots=n_slots,
            threads=cfg.codec_threads,
            check_recorded_weights=True,
            device=device,
        )
        dec.check_n_vq(n_vq)
        if device != "cpu":
            dec.self_check()  # the in-place state updates, on this device and runtime
    except (ModelFileError, CodecError) as exc:
        if named:
            raise
        log.warning("not using %s: %s; decoding in windows instead", path, exc)
        return None
    return dec


def _load_trt_streaming(
    cfg: EngineConfig, path: Path, named: bool, n_slots: int, n_vq: int
) -> SlotDecoder | None:
    """The TensorRT engine of the streaming graph (``audio_backend: trt``)."""
    if cfg.audio_backend != "trt" or path.suffix != ".engine":
        raise ConfigError(
            f"codec_streaming {path}: a TensorRT engine (.engine) goes with audio_backend 'trt', "
            "an ONNX graph (.onnx) with audio_backend 'onnx'"
        )
    from .trt_streaming import load_trt_streaming_decoder

    try:
        dec = load_trt_streaming_decoder(path, n_slots)
        dec.check_n_vq(n_vq)
        return dec
    except (ModelFileError, CodecError) as exc:
        if named:
            raise
        log.warning("not using %s: %s; decoding in windows instead", path, exc)
        return None
