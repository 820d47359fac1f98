"""Windowed, batched codec decoding on its own thread.

The codec has no state inputs, so a stream is decoded in windows: the new
frames plus up to ``context_frames`` earlier frames of left context; only the
new frames' samples are kept. Windows of several streams are decoded in one
codec call, right-padded to a common length: the decoder is causal, so padding
after a window cannot change its samples.

Terminal events (end of stream, errors) also travel through this thread's
queue so a stream's consumer sees its chunks in order, then the end.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..codec import AudioDecoder
from ..constants import FRAME_SAMPLES
from ..errors import CodecError
from ..request import AudioChunk
from .sink import StreamSink

log = logging.getLogger(__name__)

# A finished stream's last samples fade out (raised cosine to exactly 0): the codec's waveform
# stops wherever the last frame leaves it, and a player that stops there clicks. 5 ms is
# inaudible as a fade (the same as the server's segment joins).
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
    sink: StreamSink
    codes: np.ndarray  # (n, n_vq) int64 new frames (may be empty for a pure end/error event)
    first_frame: int
    step: int
    is_last: bool = False
    tick: int = 0  # engine tick that completed the last frame
    error: BaseException | None = None  # deliver this instead of audio, then close
    drop: bool = False  # stream cancelled: forget its context, deliver nothing


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


class DecodeWorker:
    def __init__(self, decoder: AudioDecoder, n_vq: int, context_frames: int, max_batch: int | None = None) -> None:
        self.decoder = decoder
        self.n_vq = n_vq
        self.context_frames = context_frames
        self.max_batch = max(1, min(max_batch or decoder.max_batch, decoder.max_batch))
        self._jobs: queue.SimpleQueue[DecodeJob | None] = queue.SimpleQueue()
        self._contexts: dict[int, _Context] = {}
        self._held: list[DecodeJob] = []  # jobs deferred behind an earlier job of the same stream
        self._thread = threading.Thread(target=self._run, name="streamtts-decode", daemon=True)
        self.busy_s = 0.0
        self.calls = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: DecodeJob) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    # -- thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._process(batch)
            except Exception as exc:  # never let the thread die: fail these streams
                log.exception("decode thread failed")
                for job in batch:
                    self._contexts.pop(job.rid, None)
                    err = CodecError(f"audio decoding failed: {exc}")
                    err.__cause__ = exc
                    job.sink.fail(err)

    def _next_batch(self) -> list[DecodeJob] | None:
        pending = self._held
        self._held = []
        if not pending:
            job = self._jobs.get()
            if job is None:
                return None
            pending.append(job)
        while True:  # take everything queued now
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._jobs.put(None)  # finish this batch, then stop
                break
            pending.append(job)
        batch: list[DecodeJob] = []
        seen: set[int] = set()
        audio_jobs = 0
        for job in pending:
            is_audio = job.codes.shape[0] > 0 and job.error is None and not job.drop
            if job.rid in seen or (is_audio and audio_jobs >= self.max_batch):
                self._held.append(job)  # keep per-stream order; one window per stream per call
                continue
            seen.add(job.rid)
            audio_jobs += is_audio
            batch.append(job)
        return batch

    def _process(self, batch: list[DecodeJob]) -> None:
        audio = [j for j in batch if j.codes.shape[0] and j.error is None and not j.drop]
        if audio:
            self._decode(audio)
        for job in batch:
            if job.drop:
                self._contexts.pop(job.rid, None)
            elif job.error is not None:
                self._contexts.pop(job.rid, None)
                job.sink.fail(job.error)
            elif job.is_last:
                self._contexts.pop(job.rid, None)
                if job.codes.shape[0] == 0:
                    job.sink.finish()

    def _decode(self, jobs: list[DecodeJob]) -> None:
        windows = []
        for job in jobs:
            ctx = self._contexts.get(job.rid)
            if ctx is None:
                ctx = self._contexts[job.rid] = _Context(self.context_frames, self.n_vq)
            left = ctx.buf[: ctx.n]
            windows.append((left.shape[0], np.concatenate([left, job.codes]) if left.shape[0] else job.codes))
        t_max = max(w.shape[0] for _, w in windows)
        codes = np.zeros((len(jobs), t_max, self.n_vq), dtype=np.int64)
        for i, (_, w) in enumerate(windows):
            codes[i, : w.shape[0]] = w
        t0 = time.monotonic()
        pcm = self.decoder.decode(codes)
        dt = time.monotonic() - t0
        self.busy_s += dt
        self.calls += 1
        share = dt / len(jobs)
        for i, job in enumerate(jobs):
            n_left = windows[i][0]
            n_new = job.codes.shape[0]
            samples = pcm[i, n_left * FRAME_SAMPLES : (n_left + n_new) * FRAME_SAMPLES].copy()
            if job.is_last:
                fade_out_end(samples)
            self._contexts[job.rid].push(job.codes)
            stats = job.sink.stats
            stats.decode_s += share
            stats.decode_windows += 1
            job.sink.put_chunk(
                AudioChunk(
                    pcm=samples,
                    frames=range(job.first_frame, job.first_frame + n_new),
                    codes=job.codes,
                    step=job.step,
                    tick=job.tick,
                    is_last=job.is_last,
                )
            )
            if job.is_last:
                job.sink.finish()
