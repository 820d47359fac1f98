"""Exact streaming codec decoding: ONNX Runtime on ``decoder_streaming.onnx`` with per-slot state.

A *slot* holds one stream's decoder state: per stage, a ring of the last ``context`` keys
and values of every layer, and the number of frames decoded so far. ``decode(slots,
codes)`` decodes the next frames of several streams in one call and returns exactly
those frames' samples; the result equals decoding each stream's whole code sequence
offline (the official semantics), up to float32 rounding, for any chunking. Unlike
windowed decoding, no frame is decoded twice and nothing is lost beyond a window.

State layout (allocated once, ``n_slots`` streams): per stage s a float32 table
``(n_slots, layers, 2, heads, capacity, head_dim)`` (``[:, :, 0]`` keys after RoPE, with
each head's dimensions de-interleaved; ``[:, :, 1]`` values), capacity = the stage's
attention context in tokens; the key of position q lives at entry ``q % capacity``.

The tables live where the graph runs (``device``): host memory on the CPU, device memory
on CUDA. Each call binds a table both as the input ``state_s`` and as the output
``state_out_s`` (ONNX Runtime I/O binding); the graph gathers the rows of the ``slots`` it
decodes and writes the new keys and values into them with ScatterND, in place. Nothing
but the codes (in) and the samples (out) crosses between host and device, and the CPU
runs this very code path with ``device="cpu"``.

A released slot is zeroed on the CPU (cheap insurance: empty entries enter the products
with weight 0, so a non-finite leftover would poison them). On CUDA the table is zeroed
once at load and a released slot keeps its finite keys, masked with weight exactly 0:
every value the graph writes is a key or value it computed from codes.

Threads: as :mod:`streamtts.codec.onnx`, no spinning; ``threads`` intra-op threads.
Not thread-safe: one decode thread owns a decoder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CodecError, ConfigError, ModelFileError
from .onnx import _import_ort
from .sessions import shared_session
from .slot_decoder import STATEFUL_INPUTS, SlotDecoder, StageState, check_build_meta, rebuild_hint
from .stamp import BUILDER_VERSION, KEY_STAMP, KEY_WEIGHTS

__all__ = ["StageState", "StreamingDecoder"]

log = logging.getLogger(__name__)

_EXPECTED = (
    "a streaming codec decoder built by `streamtts codec build` "
    f"(builder version {BUILDER_VERSION}: inputs codes, positions, slots, lengths, state_*)"
)


class StreamingDecoder(SlotDecoder):
    """Stateful codec decoder over ``n_slots`` stream slots.

    ``weights`` (the checkpoint folder the model was built from) is optional; when given,
    a model built from other weights is refused with a message saying how to rebuild.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        n_slots: int = 8,
        weights: str | Path | None = None,
        threads: int = 0,
        check_recorded_weights: bool = False,
        device: str = "cpu",
        device_id: int = 0,
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be cpu or cuda, got {device!r}")
        if not str(path):
            raise ConfigError("no streaming decoder path: build one with `streamtts codec build`")
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ConfigError(f"n_slots must be a positive integer, got {n_slots!r}")
        self.path = Path(path)
        if not self.path.is_file():
            problem = "file not found" if not self.path.exists() else "not a file"
            raise ModelFileError(self.path, _EXPECTED, f"{problem}; {rebuild_hint(None)}")
        ort = _import_ort()
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.inter_op_num_threads = 1
        if threads > 0:
            opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers: list[Any] = ["CPUExecutionProvider"]
        if device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise CodecError(
                    "the streaming codec on the GPU needs ONNX Runtime's CUDA provider: "
                    "pip install onnxruntime-gpu (matching your CUDA), or run it on the CPU"
                )
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), *providers]
        try:  # one session per graph in the process (codec/sessions.py)
            self._sess = shared_session(
                self.path, (threads, repr(providers)),
                lambda: ort.InferenceSession(str(self.path), sess_options=opts, providers=providers),
            )  # fmt: skip
        except Exception as exc:
            raise ModelFileError(
                self.path, _EXPECTED, f"ONNX Runtime cannot load it: {exc}"
            ) from exc
        self.device, self.device_id = device, device_id
        meta = dict(self._sess.get_modelmeta().custom_metadata_map)
        recorded = meta.get(KEY_WEIGHTS, "")
        if weights is None and check_recorded_weights and recorded and Path(recorded).is_dir():
            weights = recorded  # the checkpoint it was built from is still here: is it the same?
        self.weights_dir = str(weights) if weights is not None else recorded
        self.stages, self.frame_samples, self.sampling_rate, self.n_vq = check_build_meta(
            self.path, meta, weights, _EXPECTED
        )
        self._check_ports()
        self.stamp = meta[KEY_STAMP]
        self._init_slots(n_slots, max_batch=n_slots)
        # allocated once, zeroed (np.zeros maps zero pages: a device table costs no host RAM)
        self._host: list[np.ndarray] = []  # the CPU tables (views of the bound buffers)
        self._tables: list[Any] = []  # the OrtValues bound as state_s and state_out_s
        for st in self.stages:
            zeros = np.zeros((n_slots, *st.shape), dtype=np.float32)
            if device == "cpu":
                self._host.append(zeros)  # OrtValue wraps it: the same memory
            try:
                self._tables.append(ort.OrtValue.ortvalue_from_numpy(zeros, device, device_id))
            except Exception as exc:  # e.g. out of device memory
                raise CodecError(
                    f"cannot hold the streaming codec state on {device}: {n_slots} slots x "
                    f"{self.state_bytes_per_slot / 2**20:.0f} MiB ({exc}); lower max_streams"
                ) from exc
            del zeros
        self._io = self._sess.io_binding()
        for i, table in enumerate(self._tables):  # bindings persist between calls
            self._io.bind_ortvalue_input(f"state_{i}", table)
            self._io.bind_ortvalue_output(f"state_out_{i}", table)
        log.info(
            "streaming codec decoder %s: %d slots x %.1f MB state (%s)",
            self.path.name,
            n_slots,
            self.state_bytes_per_slot / 1e6,
            ", ".join(f"ctx {s.context}" for s in self.stages),
        )

    def _check_ports(self) -> None:
        ins = {p.name: p for p in self._sess.get_inputs()}
        n = len(self.stages)
        want = [*STATEFUL_INPUTS, *(f"state_{i}" for i in range(n))]
        if sorted(ins) != sorted(want):
            raise ModelFileError(
                self.path, _EXPECTED, f"its inputs are {sorted(ins)}, expected {want}"
            )
        for i, st in enumerate(self.stages):
            dims = list(ins[f"state_{i}"].shape)[1:]
            if dims != list(st.shape):
                raise ModelFileError(
                    self.path,
                    _EXPECTED,
                    f"input state_{i} has shape {dims}, its metadata says {list(st.shape)}",
                )
        outs = [p.name for p in self._sess.get_outputs()]
        if outs != ["audio"] + [f"state_out_{i}" for i in range(n)]:
            raise ModelFileError(self.path, _EXPECTED, f"its outputs are {outs}")

    # -- the runtime's part (slots.SlotDecoder does the rest) ------------------------------
    def _clear(self, slot: int) -> None:
        for table in self._host:  # on the device: see the module docstring
            table[slot] = 0.0

    def ring(self, stage: int, slot: int) -> np.ndarray:
        """A copy of one slot's ring table of ``stage`` (host or device), for inspection."""
        table = self._host[stage] if self._host else self._tables[stage].numpy()
        return np.array(table[self._slot(slot)])

    def _decode_part(self, slots: np.ndarray, codes: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """One graph call (T <= max_chunk); the rings are updated in place."""
        b, t, _ = codes.shape
        io = self._io
        # bound by address: the arrays must outlive the run (hence the names)
        x = np.ascontiguousarray(codes.transpose(2, 0, 1))  # (n_vq, B, T)
        pos = self._pos[slots]
        io.bind_cpu_input("codes", x)
        io.bind_cpu_input("positions", pos)
        io.bind_cpu_input("slots", slots)
        io.bind_cpu_input("lengths", lens)
        audio = np.empty((b, t * self.frame_samples), dtype=np.float32)
        io.bind_output("audio", "cpu", 0, np.float32, audio.shape, audio.ctypes.data)
        try:
            self._sess.run_with_iobinding(io)
        except Exception as exc:
            raise CodecError(f"streaming codec decoder failed on {b} x {t} frames: {exc}") from exc
        return audio
