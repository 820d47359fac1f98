"""TensorRT codec backend (``audio_backend: trt``): engines built from the codec's ONNX.

Works with the engines of the official ``build_engine.sh`` (one profile, batch
1, up to 40 s) and with ``streamtts build-engine`` (one profile per batch
bucket, sized for streaming windows, TF32). Input/output names are read from
the engine and used by position, as for ONNX.

How a call runs (the per-call path allocates no device or pinned memory):

- at load: one CUDA stream of our own (non-blocking, so it never serializes
  with llama.cpp's streams), one execution context per profile sharing one
  scratch allocation, and device + pinned host buffers sized by
  :func:`trt_plan.plan_buffers` for the largest call any profile accepts; every
  tensor address is bound once; ``n_quantizers`` is written once;
- per call: codes go into the pinned buffer in the engine's layout, an async
  H2D copy, ``execute_async_v3``, async D2H copies of the samples and lengths,
  one stream synchronize (the GIL is released meanwhile, so the engine thread
  keeps stepping the backbone: the codec overlaps the backbone step).

The CUDA/TensorRT side sits behind the small :class:`TrtRuntime` protocol;
:class:`CudaTrtRuntime` implements it with ``tensorrt`` and ``cuda-python``. The
logic above it (profile choice, splitting, layouts, checks) is plain NumPy and
is tested on CPU with a stand-in runtime.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ..constants import AUDIO_VOCAB, FRAME_SAMPLES, N_VQ, SAMPLE_RATE
from ..errors import CodecError, ConfigError, ModelFileError
from .onnx import check_codes, codec_levels, to_levels
from .trt_plan import (
    BufferPlan,
    IOTensor,
    Kind,
    ProfileShape,
    choose_profile,
    codec_roles,
    limits,
    main_input_shape,
    main_output_shape,
    n_quantizers_shape,
    plan_buffers,
    profile_from_input,
    split_batch,
    split_frames,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..config import EngineConfig

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install tensorrt cuda-python (TensorRT 10 or newer, matching your CUDA driver; "
    "the wheels come from NVIDIA's index pypi.nvidia.com), or use audio_backend: onnx"
)


class TrtRuntime(Protocol):
    """What the codec logic needs from a TensorRT engine on a CUDA stream."""

    kind: Kind
    io: list[IOTensor]
    profiles: list[ProfileShape]

    def allocate(self, plan: BufferPlan) -> None:
        """Allocate every device / pinned buffer of the plan and bind the addresses (once)."""

    def host(self, name: str) -> np.ndarray:
        """The pinned host buffer of I/O tensor ``name`` as flat uint8 (stable across calls)."""

    def upload(self, name: str, nbytes: int) -> None:
        """Async copy of the first nbytes of the host buffer to the device buffer."""

    def set_shape(self, profile: int, name: str, shape: tuple[int, ...]) -> None: ...

    def output_shape(self, profile: int, name: str) -> tuple[int, ...]: ...

    def execute(self, profile: int) -> None:
        """Enqueue the engine with the context of ``profile`` on the codec stream."""

    def download(self, name: str, nbytes: int) -> None:
        """Async copy of the first nbytes of the device buffer to the host buffer."""

    def synchronize(self) -> None: ...

    def close(self) -> None: ...


class _TrtCodec:
    """Shared call path of the decoder and the encoder."""

    def __init__(self, rt: TrtRuntime, kind: Kind, path: str = "", n_vq: int = N_VQ) -> None:
        self.rt = rt
        self.kind = kind
        self.path = path
        self.n_vq = n_vq
        self.roles = codec_roles(rt.io)
        self.profiles = list(rt.profiles)
        self.plan = plan_buffers(kind, rt.io, self.profiles, n_vq)
        self.levels = codec_levels(Path(path), f"a TensorRT codec {kind}", self.plan.levels, n_vq)
        self.max_batch, self.max_frames = limits(self.profiles)
        self._lock = threading.Lock()  # one call at a time: the buffers are shared
        rt.allocate(self.plan)
        nq = self.roles["n_quantizers"]
        spec = self.plan.by_role("n_quantizers")
        self._view(nq.name, nq.dtype, (spec.elements(),))[:] = n_vq  # its first n_vq levels
        if spec.device:
            rt.upload(nq.name, spec.nbytes)
        shape = n_quantizers_shape(nq)
        if shape is not None:
            for p in range(len(self.profiles)):
                rt.set_shape(p, nq.name, shape)
        rt.synchronize()
        log.info(
            "TensorRT codec %s: %s, %d profile(s) %s, buffers %.1f MB device + %.1f MB pinned host",
            kind, Path(path).name if path else "(engine)", len(self.profiles),
            [(p.batch, p.frames) for p in self.profiles],
            self.plan.device_bytes / 1e6, self.plan.host_bytes / 1e6,
        )  # fmt: skip

    def _view(self, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        """A typed view of the first bytes of a pinned buffer (no copy)."""
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.rt.host(name)[:n].view(np.dtype(dtype)).reshape(shape)

    def _run(self, x: np.ndarray, b: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """One engine call on the main input ``x`` (already in the engine's layout).

        Returns (main output, lengths) as views of the pinned buffers: valid
        until the next call, so callers copy what they keep.
        """
        p = choose_profile(self.profiles, b, t)
        if p < 0:  # pragma: no cover - callers split first
            raise CodecError(f"no TensorRT profile accepts batch {b} x {t} frames")
        ri, ro, rl = self.roles["main_in"], self.roles["main_out"], self.roles["lengths"]
        in_shape = main_input_shape(self.kind, b, t, self.levels)
        out_shape = main_output_shape(self.kind, b, t, self.levels)
        plan = self.plan
        if self.kind == "decoder":  # (B, T, n_vq) codes into the (levels, B, T) buffer
            to_levels(x, self.levels, self._view(ri.name, ri.dtype, in_shape))
        else:
            np.copyto(self._view(ri.name, ri.dtype, in_shape), x, casting="unsafe")
        rt = self.rt
        rt.upload(ri.name, plan.transfer_bytes("main_in", b, t))
        rt.set_shape(p, ri.name, in_shape)
        got = rt.output_shape(p, ro.name)
        if tuple(got) != out_shape:
            raise CodecError(
                f"TensorRT engine {self.path}: output {ro.name!r} has shape {tuple(got)} for input "
                f"{in_shape}, expected {out_shape}"
            )
        rt.execute(p)
        rt.download(ro.name, plan.transfer_bytes("main_out", b, t))
        rt.download(rl.name, plan.transfer_bytes("lengths", b, t))
        rt.synchronize()
        return self._view(ro.name, ro.dtype, out_shape), self._view(rl.name, rl.dtype, (b,))

    def close(self) -> None:
        self.rt.close()


class TrtDecoder(_TrtCodec):
    """:class:`~streamtts.codec.AudioDecoder` on TensorRT."""

    def __init__(
        self, rt: TrtRuntime, *, path: str = "", split_context: int = 125, n_vq: int = N_VQ
    ) -> None:
        super().__init__(rt, "decoder", path, n_vq)
        # Left context for the pieces of a window longer than the engine takes.
        self.split_context = split_context

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(B, T, n_vq) int64 -> (B, T*1920) float32."""
        codes = check_codes(codes, self.n_vq)
        b, t, _ = codes.shape
        if b == 0 or t == 0:
            return np.zeros((b, t * FRAME_SAMPLES), dtype=np.float32)
        if t > self.max_frames:
            out = np.empty((b, t * FRAME_SAMPLES), dtype=np.float32)
            for s, k, e in split_frames(t, self.max_frames, self.split_context):
                part = self.decode(codes[:, s:e])
                out[:, k * FRAME_SAMPLES : e * FRAME_SAMPLES] = part[:, (k - s) * FRAME_SAMPLES :]
            return out
        pieces = split_batch(b, t, self.profiles)
        if len(pieces) > 1:
            return np.concatenate([self.decode(codes[lo:hi]) for lo, hi in pieces], axis=0)
        with self._lock:
            audio, lengths = self._run(codes, b, t)
            n = t * FRAME_SAMPLES
            if np.any(lengths != n):
                raise CodecError(
                    f"TensorRT decoder returned lengths {lengths.tolist()} for {t} frames, expected {n}"
                )
            return np.array(audio[:, 0, :n], dtype=np.float32)  # a copy: the buffer is reused


class TrtEncoder(_TrtCodec):
    """:class:`~streamtts.codec.AudioEncoder` on TensorRT (reference clips)."""

    def __init__(self, rt: TrtRuntime, *, path: str = "", n_vq: int = N_VQ) -> None:
        super().__init__(rt, "encoder", path, n_vq)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """(N,) float32 24 kHz, N a positive multiple of 1920 -> (N/1920, n_vq) int64: the
        first n_vq of the engine's levels."""
        if not isinstance(wav, np.ndarray) or wav.ndim != 1:
            raise CodecError(
                f"the encoder takes a 1-D waveform, got {getattr(wav, 'shape', type(wav).__name__)}"
            )
        n = wav.shape[0]
        if n == 0 or n % FRAME_SAMPLES:
            raise CodecError(
                f"the encoder takes a positive multiple of {FRAME_SAMPLES} samples, got {n}"
            )
        t = n // FRAME_SAMPLES
        if t > self.max_frames:
            raise CodecError(
                f"reference clip of {n / SAMPLE_RATE:.1f} s is longer than the TensorRT encoder accepts "
                f"({self.max_frames * FRAME_SAMPLES / SAMPLE_RATE:.1f} s): trim it or rebuild the engine"
            )
        with self._lock:
            codes, lengths = self._run(wav.reshape(1, 1, n), 1, t)
            length = int(lengths[0])
            if not 0 < length <= t:
                raise CodecError(f"TensorRT encoder returned length {length} for {t} frames")
            out = np.array(codes[: self.n_vq, 0, :length].T, dtype=np.int64)
        if out.min() < 0 or out.max() >= AUDIO_VOCAB:
            raise CodecError(f"TensorRT encoder returned codes outside [0, {AUDIO_VOCAB})")
        return out


# -- the real runtime: tensorrt + cuda-python ------------------------------------------------


def import_tensorrt() -> Any:
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise CodecError(
            "the TensorRT codec backend (and `streamtts build-engine`) runs on an NVIDIA GPU "
            f"and needs the tensorrt package: {INSTALL_HINT} ({exc})"
        ) from exc
    return trt


def import_cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError as exc:
            raise CodecError(
                f"the TensorRT codec backend needs cuda-python for its CUDA stream and buffers: {INSTALL_HINT}"
            ) from exc
    return cudart


class _Cuda:
    """The few CUDA runtime calls we make, with errors turned into CodecError."""

    def __init__(self, cudart: Any) -> None:
        self.rt = cudart

    def check(self, what: str, result: Any) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            raise CodecError(f"CUDA {what} failed: {name}")
        if isinstance(result, tuple):
            return result[1] if len(result) == 2 else result[1:]
        return None


class CudaTrtRuntime:
    """:class:`TrtRuntime` on a deserialized TensorRT engine and a CUDA stream of its own.

    ``kind`` "streaming" is the stateful decoder's engine (``decoder_streaming.onnx``: main
    input ``codes``); it is a decoder otherwise (``self.kind``)."""

    def __init__(
        self, engine_path: str | Path, kind: Kind | Literal["streaming"], device: int = 0
    ) -> None:
        self.path = Path(engine_path)
        if not self.path.is_file():
            raise ModelFileError(
                self.path, f"a TensorRT {kind} engine (streamtts build-engine)", "file not found"
            )
        self.stateful = kind == "streaming"
        kind = "decoder" if kind == "streaming" else kind
        self.trt = trt = import_tensorrt()
        self.cuda = _Cuda(import_cudart())
        self.kind: Kind = kind
        self.device = device
        self._thread: int | None = None
        self._set_device()
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
        if engine is None:
            raise ModelFileError(
                self.path, f"a TensorRT {kind} engine for this GPU and TensorRT {trt.__version__}",
                "TensorRT could not deserialize it (engines are tied to the GPU and TensorRT version "
                "that built them: rebuild with `streamtts build-engine`)",
            )  # fmt: skip
        self.engine = engine
        self.io = [self._io(engine.get_tensor_name(i)) for i in range(engine.num_io_tensors)]
        main = "codes" if self.stateful else codec_roles(self.io)["main_in"].name
        self.profiles = [
            profile_from_input(kind, *engine.get_tensor_profile_shape(main, p))
            for p in range(engine.num_optimization_profiles)
        ]
        cu = self.cuda
        self.stream = cu.check(
            "cudaStreamCreateWithFlags",
            cu.rt.cudaStreamCreateWithFlags(cu.rt.cudaStreamNonBlocking),
        )
        self._contexts = self._make_contexts()
        self._dev: dict[str, int] = {}
        self._owned: list[int] = []  # device allocations (aliased buffers share one)
        self._host: dict[str, np.ndarray] = {}
        self._host_ptr: dict[str, int] = {}

    def _set_device(self) -> None:
        """CUDA's current device is per thread: set it once on each thread that calls us."""
        tid = threading.get_ident()
        if self._thread != tid:
            self.cuda.check("cudaSetDevice", self.cuda.rt.cudaSetDevice(self.device))
            self._thread = tid

    def _io(self, name: str) -> IOTensor:
        trt, e = self.trt, self.engine
        return IOTensor(
            name=name,
            is_input=e.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
            dtype=np.dtype(trt.nptype(e.get_tensor_dtype(name))).name,
            shape=tuple(int(d) for d in e.get_tensor_shape(name)),
            shape_tensor=bool(e.is_shape_inference_io(name)),
        )

    def _make_contexts(self) -> list[Any]:
        """One context per profile, all sharing one scratch allocation (calls are serialized)."""
        trt, e, cu = self.trt, self.engine, self.cuda
        n = e.num_optimization_profiles
        strategy: Any = getattr(trt, "ExecutionContextAllocationStrategy", None)
        shared = strategy is not None and hasattr(e, "get_device_memory_size_for_profile_v2")
        self._scratch = 0
        if shared:
            size = max(int(e.get_device_memory_size_for_profile_v2(p)) for p in range(n))
            self._scratch = int(cu.check("cudaMalloc", cu.rt.cudaMalloc(max(size, 1))))
        contexts = []
        for p in range(n):
            ctx = (
                e.create_execution_context(strategy.USER_MANAGED)
                if shared
                else e.create_execution_context()
            )
            if ctx is None:
                raise CodecError(f"TensorRT could not create an execution context for {self.path}")
            if shared:
                ctx.set_device_memory(
                    self._scratch, int(e.get_device_memory_size_for_profile_v2(p))
                )
            if not ctx.set_optimization_profile_async(p, int(self.stream)):
                raise CodecError(f"TensorRT could not select profile {p} of {self.path}")
            contexts.append(ctx)
        self.synchronize()
        return contexts

    def allocate(self, plan: BufferPlan) -> None:
        cu = self.cuda
        for spec in plan.buffers:
            if spec.host:
                ptr = int(cu.check("cudaMallocHost", cu.rt.cudaMallocHost(spec.nbytes)))
                self._host_ptr[spec.name] = ptr
                buf = (ctypes.c_uint8 * spec.nbytes).from_address(ptr)
                self._host[spec.name] = np.ctypeslib.as_array(buf)
            if spec.device and not spec.alias_of:
                ptr = int(cu.check("cudaMalloc", cu.rt.cudaMalloc(spec.nbytes)))
                self._dev[spec.name] = ptr
                self._owned.append(ptr)
        for spec in plan.buffers:
            if spec.alias_of:  # an output written in place into an input's memory
                self._dev[spec.name] = self._dev[spec.alias_of]
        for ctx in self._contexts:
            for spec in plan.buffers:
                # shape tensors are read from host memory; everything else from the device
                addr = self._dev[spec.name] if spec.device else self._host_ptr[spec.name]
                if not ctx.set_tensor_address(spec.name, addr):
                    raise CodecError(f"TensorRT refused the address of {spec.name!r} ({self.path})")

    def host(self, name: str) -> np.ndarray:
        return self._host[name]

    def upload(self, name: str, nbytes: int) -> None:
        self._set_device()
        cu = self.cuda
        kind = cu.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        cu.check(
            "cudaMemcpyAsync",
            cu.rt.cudaMemcpyAsync(self._dev[name], self._host_ptr[name], nbytes, kind, self.stream),
        )

    def download(self, name: str, nbytes: int) -> None:
        cu = self.cuda
        kind = cu.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        cu.check(
            "cudaMemcpyAsync",
            cu.rt.cudaMemcpyAsync(self._host_ptr[name], self._dev[name], nbytes, kind, self.stream),
        )

    def memset(self, name: str, offset: int, nbytes: int) -> None:
        """Zero bytes [offset, offset + nbytes) of a device buffer, on the codec stream."""
        self._set_device()
        cu = self.cuda
        cu.check(
            "cudaMemsetAsync",
            cu.rt.cudaMemsetAsync(self._dev[name] + offset, 0, nbytes, self.stream),
        )

    def set_shape(self, profile: int, name: str, shape: tuple[int, ...]) -> None:
        if not self._contexts[profile].set_input_shape(name, shape):
            raise CodecError(
                f"TensorRT rejected shape {shape} for {name!r} (profile {profile} of {self.path})"
            )

    def output_shape(self, profile: int, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._contexts[profile].get_tensor_shape(name))

    def execute(self, profile: int) -> None:
        if not self._contexts[profile].execute_async_v3(int(self.stream)):
            raise CodecError(f"TensorRT execute failed ({self.path}, profile {profile})")

    def synchronize(self) -> None:
        # cuda-python releases the GIL in this call: other threads run meanwhile
        self.cuda.check("cudaStreamSynchronize", self.cuda.rt.cudaStreamSynchronize(self.stream))

    def close(self) -> None:
        cu = self.cuda
        self._contexts = []
        for ptr in self._owned:
            cu.rt.cudaFree(ptr)
        for ptr in self._host_ptr.values():
            cu.rt.cudaFreeHost(ptr)
        if self._scratch:
            cu.rt.cudaFree(self._scratch)
        self._dev, self._owned, self._host, self._host_ptr, self._scratch = {}, [], {}, {}, 0


def _engine_path(value: str, key: str) -> str:
    if not value:
        raise ConfigError(
            f"audio_backend is trt but {key} is not set: build an engine with "
            "`streamtts build-engine --config <cfg>` and point the key at it"
        )
    return value


def load_trt_decoder(cfg: EngineConfig, n_vq: int = N_VQ) -> TrtDecoder:
    path = _engine_path(cfg.audio_decoder_trt, "audio_decoder_trt")
    rt = CudaTrtRuntime(path, "decoder")
    return TrtDecoder(rt, path=path, split_context=cfg.decode_context_frames, n_vq=n_vq)


def load_trt_encoder(cfg: EngineConfig, n_vq: int = N_VQ) -> TrtEncoder:
    path = _engine_path(cfg.audio_encoder_trt, "audio_encoder_trt")
    return TrtEncoder(CudaTrtRuntime(path, "encoder"), path=path, n_vq=n_vq)
