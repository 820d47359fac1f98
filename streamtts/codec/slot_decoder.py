"""Stream slots of a stateful streaming codec decoder, whatever runs the graph.

:class:`SlotDecoder` holds what every runtime of ``decoder_streaming.onnx`` shares: the
build metadata it checks at load (:func:`check_build_meta`), the per-slot bookkeeping
(position, active, rings dirty), argument checks, the split of a call into graph calls
(at most ``max_batch`` rows and ``max_chunk`` frames each: one call writes a ring entry at
most once) and the load-time self-check. A runtime subclass implements two methods:
``_decode_part`` (one graph call, updating the state in place) and ``_clear`` (zero one
slot's state). :class:`~streamtts.codec.streaming.StreamingDecoder` runs the graph on ONNX
Runtime (CPU or CUDA); :class:`~streamtts.codec.trt_streaming.TrtStreamingDecoder` on a
TensorRT engine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CodecError, ModelFileError
from .onnx import check_codes
from .stamp import BUILDER_VERSION, KEY_BUILDER, KEY_KIND, KEY_LAYOUT, KEY_STAMP, weights_stamp

__all__ = [
    "STATEFUL_INPUTS",
    "SlotDecoder",
    "StageState",
    "check_build_meta",
    "rebuild_hint",
    "ring_chunk_limit",
]

log = logging.getLogger(__name__)

#: The streaming graph's inputs before its per-stage ``state_s`` tables.
STATEFUL_INPUTS = ("codes", "positions", "slots", "lengths")


def rebuild_hint(weights: str | None) -> str:
    return f"rebuild it: streamtts codec build --weights {weights or 'WEIGHTS_DIR'}"


@dataclass(frozen=True)
class StageState:
    """The ring of one transformer stage (one slot's share: ``shape``)."""

    layers: int
    heads: int
    head_dim: int
    capacity: int
    context: int
    tokens_per_frame: int

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.heads, self.capacity, self.head_dim)

    @property
    def nbytes(self) -> int:
        return 4 * int(np.prod(self.shape))


def ring_chunk_limit(stages: list[StageState]) -> int:
    """The most frames one graph call may take: no ring entry is written twice."""
    return min(s.capacity // s.tokens_per_frame for s in stages)


def check_build_meta(
    path: Path, meta: dict[str, str], weights: str | Path | None, expected: str
) -> tuple[list[StageState], int, int, int]:
    """The stages, frame samples, sampling rate and codebook count (n_vq: the codes it
    takes, ``streamtts codec build --n-vq``) a streaming build records; a clear
    :class:`ModelFileError` for another kind of file, another builder version, a build from
    other weights (when ``weights`` is given) or unreadable metadata."""
    w = str(weights) if weights is not None else None
    kind = meta.get(KEY_KIND)
    if kind is None:
        raise ModelFileError(
            path, expected, "it has no streamtts build metadata (is it the official decoder.onnx?)"
        )
    if kind != "streaming":
        raise ModelFileError(path, expected, f"it is the {kind} graph, not the streaming one")
    built = meta.get(KEY_BUILDER, "?")
    if built != str(BUILDER_VERSION):
        raise ModelFileError(
            path,
            expected,
            f"it was built by builder version {built}; this streamtts reads version "
            f"{BUILDER_VERSION}: {rebuild_hint(w)}",
        )
    if weights is not None:
        now = weights_stamp(weights)
        if meta.get(KEY_STAMP) != now:
            raise ModelFileError(
                path,
                f"a streaming decoder built from the weights in {weights}",
                f"it is stale: built from other weights (stamp {meta.get(KEY_STAMP, '?')[:12]}, "
                f"the weights now {now[:12]}): {rebuild_hint(w)}",
            )
    try:
        layout = json.loads(meta[KEY_LAYOUT])
        stages = [
            StageState(
                layers=int(s["layers"]),
                heads=int(s["heads"]),
                head_dim=int(s["head_dim"]),
                capacity=int(s["capacity"]),
                context=int(s["context"]),
                tokens_per_frame=int(s["tokens_per_frame"]),
            )
            for s in layout["stages"]
        ]
        frame_samples = int(layout["frame_samples"])
        sampling_rate = int(layout["sampling_rate"])
        n_vq = int(layout["n_q"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(path, expected, f"its layout metadata is unreadable: {exc}") from exc
    return stages, frame_samples, sampling_rate, n_vq


class SlotDecoder:
    """Per-stream slots over a stateful decoder (see the module docstring).

    Not thread-safe: one decode thread owns a decoder.
    """

    path: Path
    device: str  # where the state lives: "cpu" or "cuda"
    stages: list[StageState]
    frame_samples: int
    sampling_rate: int
    stamp: str
    n_vq: int  # codebooks per frame of the codes it takes (the graph has no n_quantizers)

    def _init_slots(self, n_slots: int, max_batch: int, max_frames: int | None = None) -> None:
        self.n_slots = n_slots
        self.max_batch = max(1, min(max_batch, n_slots))
        self.state_bytes_per_slot = sum(s.nbytes for s in self.stages)
        # the most frames one graph call may take (ring_chunk_limit, and what the runtime
        # accepts); decode() splits longer calls
        chunk = ring_chunk_limit(self.stages)
        self.max_chunk = max(1, min(chunk, max_frames or chunk))
        self._pos = np.zeros(n_slots, dtype=np.int64)
        self._active = np.zeros(n_slots, dtype=bool)
        self._dirty = np.zeros(n_slots, dtype=bool)  # rings hold a finished stream's keys

    # -- what a runtime implements -------------------------------------------------------------
    def _decode_part(self, slots: np.ndarray, codes: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """One graph call (B <= max_batch, T <= max_chunk) -> (B, T*frame_samples); the
        state of ``slots`` is updated in place."""
        raise NotImplementedError

    def _clear(self, slot: int) -> None:
        """Zero the state of ``slot``."""
        raise NotImplementedError

    def check_n_vq(self, n_vq: int) -> None:
        """The model has ``n_vq`` codebooks: a graph built for another count cannot decode it
        (the streaming graph sums every level it was built with)."""
        if n_vq != self.n_vq:
            raise ModelFileError(
                self.path,
                f"a streaming decoder for {n_vq} codebooks (the model's n_vq)",
                f"it was built for {self.n_vq}: rebuild it with `streamtts codec build "
                f"--n-vq {n_vq}`",
            )

    # -- slots ---------------------------------------------------------------------------------
    def _slot(self, slot: int) -> int:
        if (
            isinstance(slot, bool)
            or not isinstance(slot, (int, np.integer))
            or not 0 <= slot < self.n_slots
        ):
            raise CodecError(f"slot {slot!r} is not one of 0..{self.n_slots - 1}")
        return int(slot)

    def acquire(self) -> int:
        """A free slot, reset for a new stream."""
        free = np.flatnonzero(~self._active)
        if free.size == 0:
            raise CodecError(f"all {self.n_slots} codec stream slots are in use")
        slot = int(free[0])
        self.reset(slot)
        return slot

    def reset(self, slot: int) -> None:
        """Start a new stream in ``slot`` (position 0, empty rings)."""
        s = self._slot(slot)
        if self._dirty[s]:
            self._zero(s)
        self._pos[s] = 0
        self._active[s] = True
        self._dirty[s] = True

    def release(self, slot: int) -> None:
        """The stream in ``slot`` is over; the slot can be acquired again.

        The rings are zeroed here (a published-size slot is 170 MB), so the next stream's
        first decode, which its time to first audio waits for, does not pay for it."""
        s = self._slot(slot)
        self._active[s] = False
        self._pos[s] = 0
        if self._dirty[s]:
            self._zero(s)

    def _zero(self, s: int) -> None:
        self._clear(s)
        self._dirty[s] = False

    def position(self, slot: int) -> int:
        """Frames decoded so far by the stream in ``slot``."""
        return int(self._pos[self._slot(slot)])

    @property
    def active_slots(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self._active)]

    def self_check(self, frames: int = 6, tolerance: float = 1e-2) -> float:
        """Decode ``frames`` pseudo-random frames in one call and again in chunks of 1, 2, 3
        (in a free slot, released after); they must agree. This checks what the tests can
        only check on the CPU: that this device and runtime update the state in place and
        only after the stage read it. Returns the largest difference relative to the
        signal's RMS; raises :class:`CodecError` above ``tolerance`` (loose: GPUs may round
        matrix products differently for different shapes)."""
        frames = min(frames, self.max_chunk)
        codes = np.random.default_rng(0).integers(0, 1024, size=(1, frames, self.n_vq), dtype=np.int64)
        slot = self.acquire()
        try:
            whole = self.decode([slot], codes)[0]
            self.reset(slot)
            parts, t, n = [], 0, 1
            while t < frames:
                parts.append(self.decode([slot], codes[:, t : t + n])[0])
                t, n = t + n, n + 1
            chunked = np.concatenate(parts)
        finally:
            self.release(slot)
        rms = float(np.sqrt(np.mean(whole.astype(np.float64) ** 2))) or 1.0
        err = float(np.abs(whole - chunked).max()) / rms
        if not err <= tolerance:  # NaN fails too
            raise CodecError(
                f"streaming codec self-check failed on {self.device}: chunked decoding differs "
                f"from one call by {err:.3g} x RMS (> {tolerance:g}); this runtime does not "
                "update the state in place as the graph needs"
            )
        log.info(
            "streaming codec self-check on %s: chunked = whole within %.2g x RMS", self.device, err
        )
        return err

    # -- decoding ------------------------------------------------------------------------------
    def decode(
        self,
        slots: Sequence[int] | np.ndarray,
        codes: np.ndarray,
        lengths: Sequence[int] | np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode the next frames of the streams in ``slots``.

        ``codes`` (B, T, n_vq) integers in [0, 1024): row b continues the stream of
        ``slots[b]``. ``lengths`` (B,), each 0..T, lets rows carry fewer frames (the rest of
        the row is padding and is ignored); default T for every row. Returns (B, T*1920)
        float32: row b's first ``lengths[b]*1920`` samples are its new audio, the rest zeros.
        """
        codes = check_codes(codes, self.n_vq)
        b, t, _ = codes.shape
        slot_arr = self._check_slots(slots, b)
        lens = self._check_lengths(lengths, b, t)
        fs = self.frame_samples
        if b == 0 or t == 0:
            return np.zeros((b, t * fs), dtype=np.float32)
        rows = []
        for lo in range(0, b, self.max_batch):
            hi = min(lo + self.max_batch, b)
            parts = []
            for start in range(0, t, self.max_chunk):
                n = min(self.max_chunk, t - start)
                part_lens = np.clip(lens[lo:hi] - start, 0, n)
                part = self._decode_part(slot_arr[lo:hi], codes[lo:hi, start : start + n], part_lens)
                self._pos[slot_arr[lo:hi]] += part_lens
                parts.append(part)
            rows.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1))
        audio = rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)
        short = lens < t
        if short.any():  # padding frames of shorter rows: not audio
            keep = np.arange(t * fs)[None, :] < (lens * fs)[:, None]
            audio = np.where(keep, audio, np.float32(0.0))
        return audio

    def _check_slots(self, slots: Sequence[int] | np.ndarray, b: int) -> np.ndarray:
        arr = np.asarray(slots)
        if arr.ndim != 1 or arr.shape[0] != b or (b and not np.issubdtype(arr.dtype, np.integer)):
            raise CodecError(f"slots must be {b} integers (one per row of codes), got {slots!r}")
        arr = arr.astype(np.int64)
        if b == 0:
            return arr
        if arr.min() < 0 or arr.max() >= self.n_slots:
            raise CodecError(f"slots {arr.tolist()} are not all in 0..{self.n_slots - 1}")
        if np.unique(arr).size != b:
            raise CodecError(f"slots {arr.tolist()} repeat a slot: one row per stream per call")
        idle = arr[~self._active[arr]]
        if idle.size:
            raise CodecError(
                f"slot {int(idle[0])} has no stream: call acquire() or reset({int(idle[0])}) first"
            )
        return arr

    @staticmethod
    def _check_lengths(lengths: Sequence[int] | np.ndarray | None, b: int, t: int) -> np.ndarray:
        if lengths is None:
            return np.full(b, t, dtype=np.int64)
        arr = np.asarray(lengths)
        if arr.shape != (b,) or (b and not np.issubdtype(arr.dtype, np.integer)):
            raise CodecError(
                f"lengths must be {b} integers (one per row of codes), got {lengths!r}"
            )
        arr = arr.astype(np.int64)
        if b and (arr.min() < 0 or arr.max() > t):
            raise CodecError(f"lengths {arr.tolist()} are not all in 0..{t} (frames per row)")
        return arr
