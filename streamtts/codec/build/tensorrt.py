"""``streamtts build-engine``: TensorRT engines from the codec's ONNX files.

The official script builds one profile for batch 1 and up to 40 s. A streaming
server decodes short windows (new frames plus ``context_frames`` of left
context) for several streams at once, so this builder makes one optimisation
profile per batch bucket (1, 2-4, 5-16, 17-32 by default), each tuned for the
steady-state window ``context + chunk`` frames. TF32 is the default precision
(the recommended one; fp16 may add artefacts, contract section 7).

Engines are tied to the GPU model and TensorRT version that built them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...constants import N_VQ
from ...errors import CodecError, ModelFileError
from ..trt_plan import (
    IOTensor,
    Kind,
    ProfileShape,
    plan_buffers,
    reference_profiles,
    stateful_profiles,
    streaming_profiles,
)

log = logging.getLogger(__name__)

Precision = Literal["tf32", "fp32", "fp16"]


@dataclass(frozen=True)
class BuildOptions:
    max_batch: int = 32
    batch_buckets: tuple[int, ...] | None = None
    context_frames: int = 125
    chunk_frames: int = 8
    max_frames: int | None = None
    precision: Precision = "tf32"
    workspace_bytes: int = 4 << 30
    max_reference_seconds: float = 40.0  # encoder engines only
    n_vq: int = N_VQ  # the model's codebooks: n_quantizers, and the codes' levels if dynamic

    def profiles(self, kind: Kind = "decoder") -> list[ProfileShape]:
        if kind == "encoder":
            return reference_profiles(self.max_reference_seconds)
        return streaming_profiles(
            self.max_batch,
            self.context_frames,
            self.chunk_frames,
            self.max_frames,
            self.batch_buckets,
        )


# The published I/O types (contract section 7), for planning before an engine exists.
_ASSUMED_IO: dict[Kind, list[IOTensor]] = {
    "decoder": [
        IOTensor("audio_codes", True, "int64", (32, -1, -1)),
        IOTensor("n_quantizers", True, "int64", ()),
        IOTensor("audio", False, "float32", (-1, 1, -1)),
        IOTensor("audio_lengths", False, "int64", (-1,)),
    ],
    "encoder": [
        IOTensor("input_values", True, "float32", (-1, 1, -1)),
        IOTensor("n_quantizers", True, "int64", ()),
        IOTensor("audio_codes", False, "int64", (32, -1, -1)),
        IOTensor("audio_codes_lengths", False, "int64", (-1,)),
    ],
}


def describe_plan(opts: BuildOptions, kind: Kind = "decoder") -> str:
    """Human-readable profiles and run-time buffer sizes for these options."""
    profiles = opts.profiles(kind)
    plan = plan_buffers(kind, _ASSUMED_IO[kind], profiles, opts.n_vq)
    lines = [f"TensorRT {kind} engine, {opts.precision}, {len(profiles)} profile(s):"]
    for i, p in enumerate(profiles):
        lines.append(
            f"  profile {i}: batch {p.batch[0]}..{p.batch[2]} (opt {p.batch[1]}), frames {p.frames[0]}..{p.frames[2]} (opt {p.frames[1]})"
        )
    lines.append(
        f"  run-time buffers (allocated once): {plan.device_bytes / 1e6:.1f} MB device, "
        f"{plan.host_bytes / 1e6:.1f} MB pinned host"
    )
    return "\n".join(lines)


def _network_flags(trt: Any) -> int:
    # TensorRT 8/9 need EXPLICIT_BATCH; 10 made it the default and 11 removed the flag.
    flag = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    return 0 if flag is None else 1 << int(flag)


def _set_precision(trt: Any, config: Any, precision: Precision) -> None:
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if precision == "tf32":
        if tf32 is not None:
            config.set_flag(tf32)
    elif precision == "fp32":
        if tf32 is not None:
            config.clear_flag(tf32)
    else:
        fp16 = getattr(trt.BuilderFlag, "FP16", None)
        if fp16 is None:
            raise CodecError(
                "this TensorRT has no FP16 builder flag (strongly typed networks only): "
                "use --precision tf32, or an fp16 ONNX export"
            )
        config.set_flag(fp16)


def build_engine(
    onnx_path: str | os.PathLike[str], out: str | os.PathLike[str], opts: BuildOptions, kind: Kind
) -> Path:
    """Parse the ONNX, add the profiles, build and write the serialized engine."""
    from ..trt import import_tensorrt

    src = Path(onnx_path)
    if not src.is_file():
        raise ModelFileError(src, f"the codec's {kind}.onnx", "file not found")
    trt = import_tensorrt()
    t0 = time.monotonic()
    net = _Parsed(trt, src, kind)
    builder, network = net.builder, net.network
    if network.num_inputs != 2:
        raise ModelFileError(
            src, f"the codec {kind} (2 inputs)", f"it has {network.num_inputs} inputs"
        )
    config = net.config(opts)
    main, nq = network.get_input(0), network.get_input(1)
    codes = main if kind == "decoder" else network.get_output(0)
    levels = int(codes.shape[0]) if int(codes.shape[0]) > 0 else opts.n_vq
    if levels < opts.n_vq:
        raise ModelFileError(
            src, f"a codec {kind} of at least {opts.n_vq} levels (n_vq)", f"it has {levels}"
        )
    for p in opts.profiles(kind):
        prof = builder.create_optimization_profile()
        prof.set_shape(main.name, *p.input_shapes(kind, levels))
        # n_quantizers is always n_vq: a fixed shape, and fixed values if TensorRT made it a
        # shape tensor (an input whose value decides shapes, read on the host)
        nq_shape = tuple(1 if d < 0 else d for d in nq.shape)
        if any(d < 0 for d in nq.shape):
            prof.set_shape(nq.name, nq_shape, nq_shape, nq_shape)
        if nq.is_shape_tensor:
            n = int(math.prod(nq_shape))
            prof.set_shape_input(nq.name, [opts.n_vq] * n, [opts.n_vq] * n, [opts.n_vq] * n)
        config.add_optimization_profile(prof)
    log.info("building the TensorRT %s engine from %s (this takes minutes)", kind, src)
    dst = Path(out)
    _write_atomic(dst, net.build(config))
    log.info("wrote %s (%.0f MB) in %.0f s", dst, dst.stat().st_size / 1e6, time.monotonic() - t0)
    return dst


class _Parsed:
    """An ONNX file parsed into a TensorRT network (the parser owns the weights until the
    build, so it lives as long as this object)."""

    def __init__(self, trt: Any, src: Path, what: str) -> None:
        self.trt, self.src = trt, src
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.builder = trt.Builder(self.logger)
        self.network = self.builder.create_network(_network_flags(trt))
        self.parser = trt.OnnxParser(self.network, self.logger)
        # parse_from_file also resolves external weight files next to it
        if not self.parser.parse_from_file(str(src)):
            p = self.parser
            errors = "; ".join(str(p.get_error(i)) for i in range(p.num_errors))
            raise ModelFileError(src, f"an ONNX {what} TensorRT can parse", errors or "parse failed")

    def config(self, opts: BuildOptions) -> Any:
        config = self.builder.create_builder_config()
        config.set_memory_pool_limit(self.trt.MemoryPoolType.WORKSPACE, opts.workspace_bytes)
        _set_precision(self.trt, config, opts.precision)
        return config

    def build(self, config: Any) -> bytes:
        blob = self.builder.build_serialized_network(self.network, config)
        if blob is None:
            raise CodecError(
                f"TensorRT could not build an engine from {self.src} (see the TensorRT log above)"
            )
        return bytes(memoryview(blob))


def _write_atomic(dst: Path, data: bytes) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, dst)


def build_decoder_engine(
    onnx_path: str | os.PathLike[str], out: str | os.PathLike[str], opts: BuildOptions
) -> Path:
    return build_engine(onnx_path, out, opts, "decoder")


def describe_streaming_plan(opts: BuildOptions, slots: int, max_frames: int) -> str:
    """The stateful decoder engine's profiles (the state per slot depends on the ONNX)."""
    profiles = stateful_profiles(opts.max_batch, opts.chunk_frames, max_frames, opts.batch_buckets)
    lines = [
        f"TensorRT streaming decoder engine, {opts.precision}, {slots} stream slots, "
        f"{len(profiles)} profile(s):"
    ]
    for i, p in enumerate(profiles):
        lines.append(
            f"  profile {i}: batch {p.batch[0]}..{p.batch[2]} (opt {p.batch[1]}), "
            f"new frames {p.frames[0]}..{p.frames[2]} (opt {p.frames[1]})"
        )
    return "\n".join(lines)


def streaming_onnx_meta(onnx_path: Path) -> dict[str, str]:
    """The build metadata of ``decoder_streaming.onnx`` (read without its weights)."""
    from .graph import import_onnx

    onnx = import_onnx()
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises several kinds
        raise ModelFileError(onnx_path, "decoder_streaming.onnx", f"unreadable: {exc}") from exc
    return {p.key: p.value for p in model.metadata_props}


def build_streaming_engine(
    onnx_path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    opts: BuildOptions,
    slots: int,
    max_frames: int = 16,
) -> Path:
    """An engine of ``decoder_streaming.onnx`` with ``slots`` stream slots, and its .json."""
    from ..slot_decoder import STATEFUL_INPUTS, check_build_meta, ring_chunk_limit
    from ..trt import import_tensorrt
    from ..trt_streaming import sidecar_path

    src = Path(onnx_path)
    expected = "decoder_streaming.onnx (streamtts codec build)"
    if not src.is_file():
        raise ModelFileError(src, expected, "file not found")
    if slots < 1:
        raise CodecError(f"--slots must be >= 1, got {slots}")
    meta = streaming_onnx_meta(src)
    stages, _, _, n_vq = check_build_meta(src, meta, None, expected)
    t_max = max(1, min(max_frames, ring_chunk_limit(stages)))
    trt = import_tensorrt()
    t0 = time.monotonic()
    net = _Parsed(trt, src, "streaming decoder")
    builder, network = net.builder, net.network
    inputs = sorted(network.get_input(i).name for i in range(network.num_inputs))
    want = [*STATEFUL_INPUTS, *(f"state_{i}" for i in range(len(stages)))]
    if inputs != sorted(want):
        raise ModelFileError(src, f"the streaming decoder (inputs {want})", f"inputs {inputs}")
    config = net.config(opts)
    for p in stateful_profiles(opts.max_batch, opts.chunk_frames, t_max, opts.batch_buckets):
        prof = builder.create_optimization_profile()
        (b0, b1, b2), (f0, f1, f2) = p.batch, p.frames
        prof.set_shape("codes", (n_vq, b0, f0), (n_vq, b1, f1), (n_vq, b2, f2))
        for name in STATEFUL_INPUTS[1:]:  # (B,) each
            prof.set_shape(name, (b0,), (b1,), (b2,))
        for i, st in enumerate(stages):  # the slot tables: fixed
            shape = (slots, *st.shape)
            prof.set_shape(f"state_{i}", shape, shape, shape)
        config.add_optimization_profile(prof)
    log.info("building the TensorRT streaming decoder engine from %s (this takes minutes)", src)
    dst = Path(out)
    _write_atomic(dst, net.build(config))
    _write_atomic(sidecar_path(dst), _sidecar(meta, slots, src))
    log.info("wrote %s (%.0f MB) in %.0f s", dst, dst.stat().st_size / 1e6, time.monotonic() - t0)
    return dst


def _sidecar(meta: dict[str, str], slots: int, src: Path) -> bytes:
    from ..trt_streaming import KEY_SLOTS

    out = dict(meta)
    out[KEY_SLOTS] = str(slots)
    out["streamtts.codec.onnx"] = src.name
    return (json.dumps(out, indent=2, sort_keys=True) + "\n").encode()
