"""ONNX Runtime backend of the codec (MOSS-Audio-Tokenizer-ONNX).

Input and output names are read from the session and outputs are used by
position (contract section 7), so any export with the published I/O works.
The session's signature is checked once at load (counts, dtypes, ranks) so a
wrong file fails with a message naming it instead of a shape error on the
first request.

Threads: the codec runs on its own thread next to llama.cpp's pool. ONNX
Runtime's intra-op workers spin while waiting by default, which steals cores
from the backbone on small machines, so spinning is turned off; the number of
intra-op threads is ``codec_threads`` (0 = ONNX Runtime's default).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..constants import AUDIO_VOCAB, FRAME_SAMPLES, N_VQ
from ..errors import CodecError, ConfigError, ModelFileError
from .sessions import shared_session

if TYPE_CHECKING:  # pragma: no cover
    from ..config import EngineConfig

log = logging.getLogger(__name__)

MAX_BATCH = 32  # the published decoder's batch limit

_DECODER_EXPECTED = (
    "an ONNX codec decoder with inputs (audio_codes int64 (levels, B, T), n_quantizers int64 "
    "scalar) and outputs (audio float32 (B, 1, T*1920), audio_lengths int64 (B,)), levels >= "
    "the model's n_vq"
)
_ENCODER_EXPECTED = (
    "an ONNX codec encoder with inputs (input_values float32 (B, 1, N), n_quantizers int64 scalar) "
    "and outputs (audio_codes int64 (levels, B, N/1920), code_lengths int64 (B,)), levels >= "
    "the model's n_vq"
)

# (what, ONNX type, allowed ranks, {axis: required size}) per port, in order.
_Port = tuple[str, str, tuple[int, ...], dict[int, int]]
_DECODER_INPUTS: tuple[_Port, ...] = (
    ("codes", "tensor(int64)", (3,), {}),
    ("n_quantizers", "tensor(int64)", (0, 1), {}),
)
_DECODER_OUTPUTS: tuple[_Port, ...] = (
    ("audio", "tensor(float)", (3,), {1: 1}),
    ("audio lengths", "tensor(int64)", (1,), {}),
)
_ENCODER_INPUTS: tuple[_Port, ...] = (
    ("waveform", "tensor(float)", (3,), {1: 1}),
    ("n_quantizers", "tensor(int64)", (0, 1), {}),
)
_ENCODER_OUTPUTS: tuple[_Port, ...] = (
    ("codes", "tensor(int64)", (3,), {}),
    ("code lengths", "tensor(int64)", (1,), {}),
)


def _import_ort() -> Any:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise CodecError(
            "the ONNX codec backend needs ONNX Runtime: pip install onnxruntime "
            "(or onnxruntime-gpu for a CUDA codec)"
        ) from exc
    return ort


def _check_ports(
    path: Path, expected: str, kind: str, got: Sequence[Any], want: Sequence[_Port]
) -> None:
    if len(got) != len(want):
        names = ", ".join(f"{p.name} {p.type}" for p in got) or "none"
        raise ModelFileError(
            path, expected, f"it has {len(got)} {kind}s ({names}), expected {len(want)}"
        )
    for i, (port, (what, typ, ranks, fixed)) in enumerate(zip(got, want, strict=True)):
        shape = port.shape if port.shape is not None else []
        where = f"{kind} {i} ({port.name!r}, the {what})"
        if port.type != typ:
            raise ModelFileError(path, expected, f"{where} is {port.type}, expected {typ}")
        if len(shape) not in ranks:
            want_rank = " or ".join(str(r) for r in ranks)
            raise ModelFileError(
                path, expected, f"{where} has rank {len(shape)} {shape}, expected rank {want_rank}"
            )
        for axis, size in fixed.items():
            dim = shape[axis]
            if isinstance(dim, int) and dim not in (size, -1, 0):
                raise ModelFileError(
                    path, expected, f"{where} has size {dim} on axis {axis}, expected {size}"
                )


class _OnnxSession:
    """One ONNX Runtime session with a checked codec signature."""

    def __init__(
        self,
        path: str | Path,
        *,
        what: str,
        key: str,
        expected: str,
        inputs: tuple[_Port, ...],
        outputs: tuple[_Port, ...],
        use_gpu: bool,
        threads: int,
        n_vq: int,
    ) -> None:
        if not str(path):
            raise ConfigError(f"{key} is not set: point it at the codec's {what}.onnx")
        self.path = Path(path)
        if not self.path.exists():
            raise ModelFileError(self.path, expected, f"file not found ({key})")
        if not self.path.is_file():
            raise ModelFileError(self.path, expected, "not a file")
        ort = _import_ort()
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: ORT's warnings are noise for users
        opts.inter_op_num_threads = 1
        if threads > 0:
            opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers: list[Any] = ["CPUExecutionProvider"]
        if use_gpu:
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
            else:
                log.info(
                    "codec %s: use_gpu_audio is set but ONNX Runtime has no CUDA provider; using CPU",
                    what,
                )
        try:  # one session per graph in the process (codec/sessions.py)
            self.session = shared_session(
                self.path, (threads, repr(providers)),
                lambda: ort.InferenceSession(str(self.path), sess_options=opts, providers=providers),
            )  # fmt: skip
        except Exception as exc:  # ORT raises its own exception types for bad files
            raise ModelFileError(
                self.path, expected, f"ONNX Runtime cannot load it: {exc}"
            ) from exc
        got_in, got_out = self.session.get_inputs(), self.session.get_outputs()
        _check_ports(self.path, expected, "input", got_in, inputs)
        _check_ports(self.path, expected, "output", got_out, outputs)
        self.input_names = [p.name for p in got_in]
        self.output_names = [p.name for p in got_out]
        codes_port = got_in[0] if inputs[0][0] == "codes" else got_out[0]  # decoder | encoder
        self.levels = codec_levels(self.path, expected, codes_port.shape[0], n_vq)
        nq_rank = len(got_in[1].shape or [])
        # the codec uses its first n_quantizers levels (a 16-codebook model: the first 16)
        self.n_quantizers = np.array([n_vq] if nq_rank == 1 else n_vq, dtype=np.int64)
        self.n_vq = n_vq
        self.provider = self.session.get_providers()[0]
        log.info(
            "codec %s: %s on ONNX Runtime %s (%s)",
            what,
            self.path.name,
            ort.__version__,
            self.provider,
        )

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        result: list[np.ndarray] = self.session.run(
            self.output_names, {self.input_names[0]: x, self.input_names[1]: self.n_quantizers}
        )
        return result


def codec_levels(path: Path, expected: str, dim: Any, n_vq: int) -> int:
    """The codebook levels a codec graph's codes tensor has: its fixed size (at least
    ``n_vq``: the published codec has 32, a 16-codebook model uses the first 16), or
    ``n_vq`` when the graph leaves that axis dynamic."""
    if isinstance(n_vq, bool) or not isinstance(n_vq, int) or n_vq < 1:
        raise ConfigError(f"n_vq must be a positive integer, got {n_vq!r}")
    if not isinstance(dim, int) or dim <= 0:
        return n_vq
    if dim < n_vq:
        raise ModelFileError(
            path,
            expected,
            f"its codes have {dim} codebook levels, the model has n_vq {n_vq}",
        )
    return dim


def to_levels(codes: np.ndarray, levels: int, out: np.ndarray | None = None) -> np.ndarray:
    """(B, T, n_vq) codes -> the codec's (levels, B, T) layout; levels beyond n_vq are 0
    (any valid code: the graph ignores levels >= n_quantizers = n_vq). ``out``: a
    (levels, B, T) buffer to fill instead of a new array."""
    b, t, n_vq = codes.shape
    x = out if out is not None else np.empty((levels, b, t), dtype=np.int64)
    x[:n_vq] = codes.transpose(2, 0, 1)
    x[n_vq:] = 0
    return x


def check_codes(codes: np.ndarray, n_vq: int = N_VQ) -> np.ndarray:
    """Validate (B, T, n_vq) codes; returns them as int64 (no copy when they already are)."""
    if not isinstance(codes, np.ndarray):
        raise CodecError(f"codes must be a numpy array, got {type(codes).__name__}")
    if codes.ndim != 3 or codes.shape[2] != n_vq:
        raise CodecError(f"codes must have shape (B, T, {n_vq}), got {codes.shape}")
    if not np.issubdtype(codes.dtype, np.integer):
        raise CodecError(f"codes must be integers, got dtype {codes.dtype}")
    if codes.size:
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi >= AUDIO_VOCAB:
            b, t, k = (int(v) for v in np.argwhere((codes < 0) | (codes >= AUDIO_VOCAB))[0])
            value = int(codes[b, t, k])
            hint = (
                " (1024 is the pad code: pad frames must not reach the decoder)"
                if value == AUDIO_VOCAB
                else ""
            )
            raise CodecError(
                f"code {value} at item {b}, frame {t}, codebook {k} is outside [0, {AUDIO_VOCAB}){hint}"
            )
    return codes.astype(np.int64, copy=False)


def decoder_session(
    path: str | Path, *, use_gpu: bool, threads: int, n_vq: int = N_VQ
) -> _OnnxSession:
    """An ONNX Runtime session on a decoder.onnx checked against the codec contract, set to
    decode ``n_vq`` codebooks (``n_quantizers = n_vq``)."""
    return _OnnxSession(
        path, what="decoder", key="audio_decoder_onnx", expected=_DECODER_EXPECTED,
        inputs=_DECODER_INPUTS, outputs=_DECODER_OUTPUTS, use_gpu=use_gpu, threads=threads,
        n_vq=n_vq,
    )  # fmt: skip


RECEPTIVE_FRAMES_KEY = "streamtts.receptive_frames"
"""ONNX metadata key: frames of codes one output frame depends on (itself included), for a
decoder whose reach is bounded (the demo codec's 4). The windowed path then keeps no more
left context than that: farther frames cannot change a sample, they only cost."""


def receptive_frames(session: Any) -> int | None:
    """The decoder's declared receptive field (``RECEPTIVE_FRAMES_KEY``), None when unbounded
    or not declared (the published decoder: its attention reaches back without a bound)."""
    meta = session.get_modelmeta().custom_metadata_map
    try:
        n = int(meta.get(RECEPTIVE_FRAMES_KEY, ""))
    except ValueError:
        return None
    return n if n >= 1 else None


class OnnxDecoder:
    """:class:`~streamtts.codec.AudioDecoder` on ONNX Runtime, for ``n_vq`` codebooks."""

    max_batch: int = MAX_BATCH

    def __init__(
        self, path: str | Path, *, use_gpu: bool = False, threads: int = 0, n_vq: int = N_VQ
    ) -> None:
        self._s = decoder_session(path, use_gpu=use_gpu, threads=threads, n_vq=n_vq)
        self.n_vq = n_vq
        self.path = self._s.path
        self.provider = self._s.provider
        self.receptive_frames = receptive_frames(self._s.session)

    @classmethod
    def from_config(cls, cfg: EngineConfig, n_vq: int = N_VQ) -> OnnxDecoder:
        return cls(
            cfg.audio_decoder_onnx, use_gpu=cfg.use_gpu_audio, threads=cfg.codec_threads, n_vq=n_vq
        )

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(B, T, n_vq) int64 -> (B, T*1920) float32; batches over ``max_batch`` are split."""
        codes = check_codes(codes, self.n_vq)
        b, t, _ = codes.shape
        if b == 0 or t == 0:
            return np.zeros((b, t * FRAME_SAMPLES), dtype=np.float32)
        if b <= self.max_batch:
            return self._decode_batch(codes)
        parts = [
            self._decode_batch(codes[i : i + self.max_batch]) for i in range(0, b, self.max_batch)
        ]
        return np.concatenate(parts, axis=0)

    def _decode_batch(self, codes: np.ndarray) -> np.ndarray:
        b, t, _ = codes.shape
        x = to_levels(codes, self._s.levels)  # (levels, B, T): the codec's layout
        try:
            audio, lengths = self._s.run(x)[:2]
        except Exception as exc:
            raise CodecError(f"codec decoder failed on {b} x {t} frames: {exc}") from exc
        n = t * FRAME_SAMPLES
        if audio.ndim != 3 or audio.shape[0] != b or audio.shape[2] < n:
            raise CodecError(
                f"codec decoder returned audio of shape {audio.shape} for {b} x {t} frames"
            )
        lengths = np.asarray(lengths).reshape(-1)
        if lengths.shape[0] != b or np.any(lengths != n):
            raise CodecError(
                f"codec decoder returned lengths {lengths.tolist()} for {t} frames, expected {n} each"
            )
        out = audio[:, 0, :n]  # trim to the returned lengths
        return np.ascontiguousarray(out, dtype=np.float32)


class OnnxEncoder:
    """:class:`~streamtts.codec.AudioEncoder` on ONNX Runtime: the first ``n_vq`` levels of
    the codec's codes (the published encoder returns 32)."""

    def __init__(
        self, path: str | Path, *, use_gpu: bool = False, threads: int = 0, n_vq: int = N_VQ
    ) -> None:
        self._s = _OnnxSession(
            path, what="encoder", key="audio_encoder_onnx", expected=_ENCODER_EXPECTED,
            inputs=_ENCODER_INPUTS, outputs=_ENCODER_OUTPUTS, use_gpu=use_gpu, threads=threads,
            n_vq=n_vq,
        )  # fmt: skip
        self.n_vq = n_vq
        self.path = self._s.path
        self.provider = self._s.provider

    @classmethod
    def from_config(cls, cfg: EngineConfig, n_vq: int = N_VQ) -> OnnxEncoder:
        return cls(
            cfg.audio_encoder_onnx, use_gpu=cfg.use_gpu_audio, threads=cfg.codec_threads, n_vq=n_vq
        )

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """(N,) float32 24 kHz, N a positive multiple of 1920 -> (N/1920, n_vq) int64."""
        if not isinstance(wav, np.ndarray) or wav.ndim != 1:
            shape = getattr(wav, "shape", type(wav).__name__)
            raise CodecError(f"the encoder takes a 1-D waveform, got {shape}")
        n = wav.shape[0]
        if n == 0 or n % FRAME_SAMPLES:
            raise CodecError(
                f"the encoder takes a positive multiple of {FRAME_SAMPLES} samples, got {n}"
            )
        x = wav.astype(np.float32, copy=False)
        if not np.all(np.isfinite(x)):
            raise CodecError("the waveform to encode has non-finite samples")
        try:
            codes, lengths = self._s.run(x.reshape(1, 1, n))[:2]
        except Exception as exc:
            raise CodecError(f"codec encoder failed on {n} samples: {exc}") from exc
        if codes.ndim != 3 or codes.shape[0] < self.n_vq or codes.shape[1] != 1:
            raise CodecError(
                f"codec encoder returned codes of shape {codes.shape}, expected "
                f"(levels >= {self.n_vq}, 1, T)"
            )
        length = int(np.asarray(lengths).reshape(-1)[0])
        if not 0 < length <= codes.shape[2]:
            raise CodecError(f"codec encoder returned length {length} for {codes.shape[2]} frames")
        out = np.ascontiguousarray(codes[: self.n_vq, 0, :length].T, dtype=np.int64)
        if out.min() < 0 or out.max() >= AUDIO_VOCAB:
            raise CodecError(f"codec encoder returned codes outside [0, {AUDIO_VOCAB})")
        return out
