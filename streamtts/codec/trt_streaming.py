"""The exact streaming codec on TensorRT: an engine of ``decoder_streaming.onnx``.

``streamtts build-engine --kind streaming`` builds it (:func:`~streamtts.codec.build.tensorrt.
build_streaming_engine`): one optimisation profile per batch bucket, 1..max frames per
call, and the slot tables fixed at ``--slots`` streams. Beside the engine it writes
``<engine>.json``: the ONNX's build metadata (builder version, weights stamp, ring layout)
and the slot count, which the engine itself cannot carry.

At load (:class:`TrtStreamingDecoder`): the runtime allocates, once, pinned host and device
buffers for codes, positions, slots, lengths and audio sized for the largest call, and per
stage one device table holding every slot's rings (no host copy), bound as both the input
``state_s`` and the output ``state_out_s``: the graph's ScatterND writes the new keys and
values into it in place (its indices wait for the stage's output, so every read comes
first). The tables are zeroed on the device at load and a slot's rows at release
(``cudaMemsetAsync`` on the codec's stream). A load-time self-check (chunked = whole)
verifies the in-place update on the actual GPU and TensorRT version; a failing engine is
not used.

Per call: the codes and three small vectors go up, the samples come down, one stream
synchronize; everything else stays on the device. The logic runs on CPU in the tests on a
stand-in runtime that executes the same ONNX graph with ONNX Runtime bound to the same
addresses; the TensorRT calls themselves (:class:`~streamtts.codec.trt.CudaTrtRuntime`)
need a GPU.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import CodecError, ModelFileError
from .slot_decoder import STATEFUL_INPUTS, SlotDecoder, check_build_meta
from .stamp import BUILDER_VERSION, KEY_STAMP
from .trt import TrtRuntime
from .trt_plan import BufferPlan, choose_profile, limits, plan_stateful_buffers

__all__ = ["SIDECAR_SUFFIX", "StatefulTrtRuntime", "TrtStreamingDecoder", "read_sidecar"]

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".json"  # decoder_streaming.engine -> decoder_streaming.engine.json
KEY_SLOTS = "streamtts.codec.slot_decoder"
_EXPECTED = (
    "a TensorRT engine of decoder_streaming.onnx built by `streamtts build-engine --kind "
    f"streaming` (builder version {BUILDER_VERSION}), with its .json beside it"
)


class StatefulTrtRuntime(TrtRuntime, Protocol):
    """A :class:`TrtRuntime` that can also zero part of a device buffer."""

    def memset(self, name: str, offset: int, nbytes: int) -> None: ...


def sidecar_path(engine: str | Path) -> Path:
    p = Path(engine)
    return p.with_name(p.name + SIDECAR_SUFFIX)


def read_sidecar(engine: str | Path) -> dict[str, str]:
    """The build metadata written beside an engine (a clear error when it is missing)."""
    path = sidecar_path(engine)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelFileError(
            Path(engine), _EXPECTED, f"{path.name} is missing beside it: rebuild the engine"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelFileError(path, _EXPECTED, f"unreadable: {exc}") from exc
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelFileError(path, _EXPECTED, "not a JSON object of strings")
    return meta


class TrtStreamingDecoder(SlotDecoder):
    """:class:`~streamtts.codec.slot_decoder.SlotDecoder` on a TensorRT engine (see the module)."""

    def __init__(
        self,
        rt: StatefulTrtRuntime,
        meta: dict[str, str],
        *,
        path: str | Path = "",
        weights: str | Path | None = None,
    ) -> None:
        self.rt = rt
        self.path = Path(path)
        self.device = "cuda"
        self.stages, self.frame_samples, self.sampling_rate, self.n_vq = check_build_meta(
            self.path, meta, weights, _EXPECTED
        )
        self.stamp = meta.get(KEY_STAMP, "")
        try:
            n_slots = int(meta[KEY_SLOTS])
        except (KeyError, ValueError) as exc:
            raise ModelFileError(self.path, _EXPECTED, f"no slot count in its .json ({exc})") from exc
        self.profiles = list(rt.profiles)
        b_max, t_max = limits(self.profiles)
        self._init_slots(n_slots, max_batch=b_max, max_frames=t_max)
        tables = [n_slots * st.nbytes for st in self.stages]
        try:
            self.plan: BufferPlan = plan_stateful_buffers(rt.io, self.profiles, tables, self.n_vq)
        except ValueError as exc:
            raise ModelFileError(self.path, _EXPECTED, str(exc)) from exc
        self._io = {t.name: t for t in rt.io}
        rt.allocate(self.plan)
        for i, (st, size) in enumerate(zip(self.stages, tables, strict=True)):
            rt.memset(f"state_{i}", 0, size)  # cudaMalloc does not zero
            for p in range(len(self.profiles)):
                rt.set_shape(p, f"state_{i}", (n_slots, *st.shape))
        rt.synchronize()
        log.info(
            "TensorRT streaming codec %s: %d slots x %.1f MB state on the GPU, %d profile(s), "
            "buffers %.1f MB device + %.1f MB pinned host",
            self.path.name, n_slots, self.state_bytes_per_slot / 1e6, len(self.profiles),
            self.plan.device_bytes / 1e6, self.plan.host_bytes / 1e6,
        )  # fmt: skip

    def _view(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A typed view of the first bytes of a pinned host buffer (no copy)."""
        dtype = np.dtype(self._io[name].dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        return self.rt.host(name)[:n].view(dtype).reshape(shape)

    def _clear(self, slot: int) -> None:
        for i, st in enumerate(self.stages):
            self.rt.memset(f"state_{i}", slot * st.nbytes, st.nbytes)

    def _decode_part(self, slots: np.ndarray, codes: np.ndarray, lens: np.ndarray) -> np.ndarray:
        b, t, _ = codes.shape
        p = choose_profile(self.profiles, b, t)
        if p < 0:  # pragma: no cover - decode() splits to max_batch x max_chunk
            raise CodecError(f"no TensorRT profile accepts batch {b} x {t} frames")
        rt, plan = self.rt, self.plan
        values: dict[str, Any] = {
            "codes": codes.transpose(2, 0, 1),
            "positions": self._pos[slots],
            "slots": slots,
            "lengths": lens,
        }
        for name in STATEFUL_INPUTS:
            shape = (self.n_vq, b, t) if name == "codes" else (b,)
            np.copyto(self._view(name, shape), values[name], casting="unsafe")
            rt.upload(name, plan.transfer_bytes_of(name, b, t))
            rt.set_shape(p, name, shape)
        n = t * self.frame_samples
        got = tuple(rt.output_shape(p, "audio"))
        if got != (b, n):
            raise CodecError(
                f"TensorRT engine {self.path}: output 'audio' has shape {got} for {b} x {t} "
                f"frames, expected {(b, n)}"
            )
        rt.execute(p)
        rt.download("audio", plan.transfer_bytes_of("audio", b, t))
        rt.synchronize()
        return np.array(self._view("audio", (b, n)), dtype=np.float32)  # the buffer is reused

    def close(self) -> None:
        self.rt.close()


def load_trt_streaming_decoder(
    engine: str | Path, n_slots: int, *, weights: str | Path | None = None
) -> TrtStreamingDecoder:
    """The engine at ``engine`` on the GPU, checked: its build metadata, at least
    ``n_slots`` slots, and the self-check."""
    from .trt import CudaTrtRuntime

    meta = read_sidecar(engine)
    rt = CudaTrtRuntime(engine, "streaming")
    try:
        dec = TrtStreamingDecoder(rt, meta, path=engine, weights=weights)
        if dec.n_slots < n_slots:
            raise CodecError(
                f"{engine} holds {dec.n_slots} stream slots, the engine needs {n_slots} "
                f"(max_streams): rebuild it with `streamtts build-engine --kind streaming "
                f"--slots {n_slots}`"
            )
        dec.self_check()
    except BaseException:
        rt.close()
        raise
    return dec
