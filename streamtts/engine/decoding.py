"""Batched codec decoding on its own thread.

Two ways to turn a stream's frames into audio, one per kind of decoder:

* **Streaming** (``decoder_streaming.onnx``, :class:`~streamtts.codec.slot_decoder.SlotDecoder`: ONNX Runtime or TensorRT):
  each stream owns a decoder slot (its attention state) from its first frames to its end;
  every call decodes only the new frames of every ready stream, and the result equals the
  offline decode of the whole utterance. A slot is acquired at a stream's first chunk and
  released at its end, cancel or error.
* **Windowed** (the stateless ``decoder.onnx``): a window is the new frames plus up to
  ``context_frames`` earlier frames of left context; only the new frames' samples are kept.
  Not exact (the real decoder's stacked attention reaches further back than a window) and
  each new frame costs the whole window.

Windows of several streams go through one codec call (right-padded: the decoder is causal,
so padding after a row cannot change its samples). Terminal events (end of stream, errors)
travel through the same queue so a consumer sees its chunks in order, then the end.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..codec import AudioDecoder
from ..codec.slot_decoder import SlotDecoder
from ..constants import FRAME_SAMPLES
from ..errors import CodecError
from ..request import AudioChunk, ChunkSink, Outbox
from .priority import lower_priority
from .turns import CoreTurns

log = logging.getLogger(__name__)

# A finished stream's last samples fade out (raised cosine to exactly 0): the codec's waveform
# stops wherever the last frame leaves it, and a player that stops there clicks. 5 ms is
# inaudible as a fade. This is the only end fade: segmented speech (segmented.py) fades each
# segment in and relies on this one for its end.
END_FADE_SAMPLES = 120
_END_RAMP = (0.5 + 0.5 * np.cos(np.pi * (np.arange(END_FADE_SAMPLES) + 1) / END_FADE_SAMPLES)).astype(np.float32)


def fade_out_end(samples: np.ndarray) -> None:
    """Fade the last ``END_FADE_SAMPLES`` of a stream's last chunk in place."""
    k = min(END_FADE_SAMPLES, samples.shape[0])
    if k:
        samples[samples.shape[0] - k :] *= _END_RAMP[END_FADE_SAMPLES - k :]

@dataclass(slots=True)
class DecodeJob:
    rid: int
    sink: ChunkSink
    codes: np.ndarray  # (n, n_vq) int64 new frames (may be empty for a pure end/error event)
    first_frame: int
    step: int
    is_last: bool = False
    tick: int = 0  # engine tick that completed the last frame
    error: BaseException | None = None  # deliver this instead of audio, then close
    drop: bool = False  # stream cancelled: forget its state, deliver nothing
    warm: int = 0  # leading frames of `codes` that only warm the codec (a continuation's prefix)
    rows: np.ndarray | None = None  # the raw generated rows (StreamOptions.rows)

    @property
    def has_audio(self) -> bool:
        return self.codes.shape[0] > 0 and self.error is None and not self.drop


def _add(pending: list[DecodeJob], item: DecodeJob | list[DecodeJob]) -> None:
    if isinstance(item, list):
        pending.extend(item)
    else:
        pending.append(item)


class _Codec(Protocol):
    """How a batch of streams' new frames becomes their new samples."""

    max_batch: int
    kind: str

    def room(self) -> int | None:
        """How many new streams it can start now (None: no limit)."""
        ...

    def knows(self, rid: int) -> bool:
        """Whether ``rid`` already holds state here."""
        ...

    def decode(self, jobs: list[DecodeJob]) -> list[np.ndarray]: ...

    def forget(self, rid: int) -> None: ...

    def warm_up(self) -> None: ...


class _Context:
    """Last ``cap`` frames of one stream (left context for its next window)."""

    __slots__ = ("buf", "n")

    def __init__(self, cap: int, n_vq: int) -> None:
        self.buf = np.zeros((cap, n_vq), dtype=np.int64)
        self.n = 0

    def push(self, codes: np.ndarray) -> None:
        cap = self.buf.shape[0]
        if cap == 0:
            return
        m = codes.shape[0]
        if m >= cap:
            self.buf[:] = codes[m - cap :]
            self.n = cap
            return
        keep = min(self.n, cap - m)
        self.buf[:keep] = self.buf[self.n - keep : self.n]
        self.buf[keep : keep + m] = codes
        self.n = keep + m


class WindowedCodec:
    """A stateless decoder fed windows of left context + new frames."""

    kind = "windowed"

    def __init__(self, decoder: AudioDecoder, n_vq: int, context_frames: int) -> None:
        self.decoder = decoder
        self.n_vq = n_vq
        self.context_frames = context_frames
        self.max_batch = decoder.max_batch
        self._contexts: dict[int, _Context] = {}

    def room(self) -> int | None:
        return None

    def knows(self, rid: int) -> bool:
        return rid in self._contexts

    def decode(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        lefts = []
        for job in jobs:
            ctx = self._contexts.get(job.rid)
            if ctx is None:
                ctx = self._contexts[job.rid] = _Context(self.context_frames, self.n_vq)
            lefts.append(ctx.buf[: ctx.n])
        t_max = max(left.shape[0] + j.codes.shape[0] for left, j in zip(lefts, jobs, strict=True))
        codes = np.zeros((len(jobs), t_max, self.n_vq), dtype=np.int64)
        for i, (left, job) in enumerate(zip(lefts, jobs, strict=True)):
            codes[i, : left.shape[0]] = left
            codes[i, left.shape[0] : left.shape[0] + job.codes.shape[0]] = job.codes
        pcm = self.decoder.decode(codes)
        out = []
        for i, (left, job) in enumerate(zip(lefts, jobs, strict=True)):
            a = left.shape[0] * FRAME_SAMPLES
            out.append(pcm[i, a : a + job.codes.shape[0] * FRAME_SAMPLES].copy())
            self._contexts[job.rid].push(job.codes)
        return out

    def forget(self, rid: int) -> None:
        self._contexts.pop(rid, None)

    def warm_up(self) -> None:
        """Decode one silent frame: the runtime's first call pays its one-off costs."""
        self.decoder.decode(np.zeros((1, 1, self.n_vq), dtype=np.int64))


class StreamingCodec:
    """The stateful decoder: one slot per stream, only new frames decoded."""

    kind = "streaming"

    def __init__(self, decoder: SlotDecoder, n_vq: int) -> None:
        self.decoder = decoder
        self.n_vq = n_vq
        self.max_batch = decoder.max_batch
        self._slots: dict[int, int] = {}  # rid -> decoder slot

    def room(self) -> int | None:
        return self.decoder.n_slots - len(self._slots)

    def knows(self, rid: int) -> bool:
        return rid in self._slots

    def decode(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        for job in jobs:
            if job.rid not in self._slots:
                self._slots[job.rid] = self.decoder.acquire()
        lengths = np.array([j.codes.shape[0] for j in jobs], dtype=np.int64)
        t_max = int(lengths.max())
        codes = np.zeros((len(jobs), t_max, self.n_vq), dtype=np.int64)
        for i, job in enumerate(jobs):
            codes[i, : job.codes.shape[0]] = job.codes
        slots = np.array([self._slots[j.rid] for j in jobs], dtype=np.int64)
        pcm = self.decoder.decode(slots, codes, lengths)
        return [pcm[i, : n * FRAME_SAMPLES].copy() for i, n in enumerate(lengths.tolist())]

    def forget(self, rid: int) -> None:
        slot = self._slots.pop(rid, None)
        if slot is not None:
            self.decoder.release(slot)

    @property
    def active(self) -> int:
        return len(self._slots)

    def warm_up(self) -> None:
        """Decode one silent frame in a slot given back at once (the runtime's first
        call pays its one-off costs)."""
        slot = self.decoder.acquire()
        try:
            self.decoder.decode(
                np.array([slot], dtype=np.int64), np.zeros((1, 1, self.n_vq), dtype=np.int64), np.ones(1, dtype=np.int64)
            )
        finally:
            self.decoder.release(slot)


class DecodeWorker:
    def __init__(
        self,
        codec: _Codec,
        max_batch: int | None = None,
        *,
        nice: int = 0,
        codec_threads: frozenset[int] = frozenset(),
        turns: CoreTurns | None = None,
    ) -> None:
        self.codec = codec
        self.turns = turns if turns is not None else CoreTurns(False)
        self.nice = nice  # codec_nice: this thread and the codec's own (codec_threads)
        self._codec_threads = codec_threads
        self.max_batch = max(1, min(max_batch or codec.max_batch, codec.max_batch))
        # a job, a tick's jobs at once (one wake-up of this thread, not one a stream), or None: stop
        self._jobs: queue.SimpleQueue[DecodeJob | list[DecodeJob] | None] = queue.SimpleQueue()
        self._held: list[DecodeJob] = []  # jobs deferred behind an earlier job of the same stream
        self._thread = threading.Thread(target=self._run, name="streamtts-decode", daemon=True)
        self.busy_s = 0.0
        self.calls = 0

    def start(self) -> None:
        self._thread.start()

    def warm_up(self) -> None:
        """The codec's first call, before any stream's (call before :meth:`start`)."""
        with self.turns.codec():
            self.codec.warm_up()

    def submit(self, job: DecodeJob) -> None:
        self._jobs.put(job)

    def submit_many(self, jobs: list[DecodeJob]) -> None:
        """Several streams' jobs in one hand-over (the list becomes the worker's)."""
        self._jobs.put(jobs)

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    # -- thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        if self.nice > 0:
            n = lower_priority({threading.get_native_id(), *self._codec_threads}, self.nice)
            log.debug("codec threads at nice %d: %d", self.nice, n)
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._process(batch)
            except Exception as exc:  # never let the thread die: fail these streams
                log.exception("decode thread failed")
                for job in batch:
                    self.codec.forget(job.rid)
                    err = CodecError(f"audio decoding failed: {exc}")
                    err.__cause__ = exc
                    job.sink.fail(err)

    def _next_batch(self) -> list[DecodeJob] | None:
        """Everything queued now that can go in one call; None when the worker is closed."""
        pending = self._held
        self._held = []
        stop = False
        while True:
            if not pending:
                item = self._jobs.get()
                if item is None:
                    return None
                _add(pending, item)
            while True:  # take everything queued now
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                _add(pending, item)
            batch = self._select(pending)
            if stop:
                if not batch:
                    return None  # closing: what still waits for a slot is dropped
                self._jobs.put(None)  # finish this batch, then stop
                return batch
            if batch:
                return batch
            # every job waits for a codec slot: block until the job that frees one arrives
            item = self._jobs.get()
            if item is None:
                return None
            pending = self._held
            _add(pending, item)
            self._held = []

    def _select(self, pending: list[DecodeJob]) -> list[DecodeJob]:
        batch: list[DecodeJob] = []
        seen: set[int] = set()
        audio_jobs = 0
        room = self.codec.room()
        for job in pending:
            # one job per stream per call, in order: once a stream's job waits, its later ones do
            if job.rid in seen:
                self._held.append(job)
                continue
            seen.add(job.rid)
            audio = job.has_audio
            new = audio and room is not None and not self.codec.knows(job.rid)
            # at most max_batch rows; a new stream the codec has no slot for waits (a stream
            # ending in this call frees its slot after it)
            if (audio and audio_jobs >= self.max_batch) or (new and room is not None and room <= 0):
                self._held.append(job)
                continue
            if new and room is not None:
                room -= 1
            audio_jobs += audio
            batch.append(job)
        return batch

    def _process(self, batch: list[DecodeJob]) -> None:
        audio = [j for j in batch if j.has_audio]
        if audio:
            self._decode(audio)
        for job in batch:
            if job.drop:
                self.codec.forget(job.rid)
            elif job.error is not None:
                self.codec.forget(job.rid)
                job.sink.fail(job.error)
            elif job.is_last and not job.has_audio:  # a last chunk with audio: _decode did it
                self.codec.forget(job.rid)
                if job.rows is not None and job.rows.size:  # the last rows still go out
                    job.sink.put_chunk(
                        AudioChunk(
                            pcm=np.zeros(0, np.float32), frames=range(job.first_frame, job.first_frame),
                            codes=job.codes[:0], step=job.step, tick=job.tick, is_last=True, rows=job.rows,
                        )
                    )
                job.sink.finish()

    def _decode(self, jobs: list[DecodeJob]) -> None:
        with self.turns.codec():
            t0 = time.monotonic()
            pcm = self.codec.decode(jobs)
            dt = time.monotonic() - t0
        self.busy_s += dt
        self.calls += 1
        outbox = Outbox()  # the call's chunks go to the event loop at once
        try:
            self._deliver(jobs, pcm, dt / len(jobs), outbox)
        finally:  # what was made goes out before any error that fails these streams
            outbox.flush()

    def _deliver(self, jobs: list[DecodeJob], pcm: list[np.ndarray], share: float, outbox: Outbox) -> None:
        for job, samples in zip(jobs, pcm, strict=True):
            w = job.warm
            if w:  # the prefix's frames: decoded for the codec's state, not sent
                samples = samples[w * FRAME_SAMPLES :]
            n_new = job.codes.shape[0] - w
            if job.is_last:
                fade_out_end(samples)
            stats = job.sink.stats
            stats.decode_s += share
            stats.decode_windows += 1
            job.sink.put_chunk(
                AudioChunk(
                    pcm=samples,
                    frames=range(job.first_frame, job.first_frame + n_new),
                    codes=job.codes[w:],
                    rows=job.rows,
                    step=job.step,
                    tick=job.tick,
                    is_last=job.is_last,
                ),
                outbox,
            )
            if job.is_last:
                self.codec.forget(job.rid)  # before the consumer learns the stream is over
                job.sink.finish(outbox)
