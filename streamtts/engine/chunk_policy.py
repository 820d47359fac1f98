"""When a stream's frames go out, and why a stream ends: the engine's output policy.

Beside the scheduler's slack rule (scheduler.py decides who steps), this decides what a step's
frames become. Every tick each stepped stream may complete a frame; the frames wait in the
slot table until the stream's chunk is due -- at its chunk target (``chunk_frames``: the
first chunk, then the ramp; a stream may have its own, :meth:`ChunkPolicy.chunks_for`) or,
once its first chunk went out, earlier, when a real-time listener started at that chunk
would run dry waiting for the rest -- or until the stream ends: it sampled the end of
speech (``stop``), its last frame is complete (``audio_end``), it reached ``max_new_tokens``,
or its context is full (``context_full``). It reads the slot table and the delay states and
makes decode jobs; it calls no backbone and starts no thread, so it is tested with made-up
streams (tests/engine/test_chunk_policy.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..constants import FRAME_S
from ..core.delay_state import DelayStates
from ..request import PreparedRequest
from .decoding import DecodeJob
from .slot_table import SlotTable

__all__ = ["REFERENCE_BUFFER_S", "ChunkPolicy", "first_chunk_frames"]

# The playback buffer the configured first chunk is chosen for: C100's, 100 ms
# (docs/perf.md, "The first chunk"). A client that says it holds more gets a smaller one.
REFERENCE_BUFFER_S = 0.1


def first_chunk_frames(chunk_frames: Sequence[int], playback_buffer_s: float) -> tuple[int, ...]:
    """The chunk sizes for a client that plays from its first audio plus ``playback_buffer_s``
    (0: it did not say): the first chunk one frame smaller for every whole frame (80 ms) its
    buffer holds beyond :data:`REFERENCE_BUFFER_S`, at least one frame; the ramp unchanged.

    Why: at the start a listener has the first chunk and its buffer to play while the next
    chunk is generated; the first chunk is sized so that, with a 100 ms buffer, that covers
    the wait at capacity. Audio the client buffers anyway covers it as well, and every frame
    less in the first chunk is a tick less before the first audio."""
    sizes = tuple(int(c) for c in chunk_frames)
    extra = int(math.floor((playback_buffer_s - REFERENCE_BUFFER_S) / FRAME_S + 1e-9))
    if extra <= 0:
        return sizes
    return (max(1, sizes[0] - extra), *sizes[1:])


class ChunkPolicy:
    """The output side of a tick: :meth:`route` hands finished frames on and ends streams.

    ``submit``: hands the tick's chunks to the decode thread at once; ``free``: empties a
    finished stream's slot and hands it its last chunk (the engine's ``free``).
    """

    def __init__(
        self,
        chunk_frames: Sequence[int],
        slots: SlotTable,
        states: DelayStates,
        n_ctx_seq: int,
        submit: Callable[[list[DecodeJob]], None],
        free: Callable[[int, DecodeJob], None],
    ) -> None:
        self.slots = slots
        self.states = states
        self.n_vq = states.ids.n_vq
        self.n_ctx_seq = n_ctx_seq
        self.chunk_frames = tuple(int(c) for c in chunk_frames)  # a stream's own: chunks_for
        self.tick_s = 0.0  # moving average of the tick time
        self.decode_margin_s = 0.05  # time allowed for a decode window to reach the listener
        self._submit = submit
        self._free = free
        self._no_rows = np.zeros((0, 1 + self.n_vq), dtype=np.int64)
        # session -> when its listener has heard the audio its segments sent so far, and the
        # admission order of the latest segment that counted
        self._session_due: dict[int, tuple[float, int]] = {}
        self._admitted = 0

    def chunks_for(self, req: PreparedRequest) -> tuple[int, ...]:
        """The chunk sizes of ``req``'s stream: its own (a benchmark's) or the config's, the
        first made smaller for a client's larger playback buffer (:func:`first_chunk_frames`)."""
        return first_chunk_frames(req.chunk_frames or self.chunk_frames, req.playback_buffer_s)

    def started(self, slot: int, now: float) -> None:
        """The stream just admitted in ``slot``: its admission order, and its ``audio_due``
        before its first chunk: -inf (its listener waits for audio), but for a session's next
        segment, whose listener has the earlier segments' audio in hand, when that runs out
        (if later than ``now``). The scheduler does not step such a segment beside a new
        stream making its first frame while that is more than ``step_slack_s`` away: on the
        tiny demo model under twice its load, next segments were three in four of the streams
        making their first frames, and each one a new stream's ticks stepped made them longer."""
        s = self.slots.streams[slot]
        assert s is not None
        self._admitted += 1
        s.order = self._admitted
        due = self._heard(s.req, s.order)
        self.slots.audio_due[slot] = due if due > now else -math.inf

    def _heard(self, req: PreparedRequest, order: int) -> float:
        """When ``req``'s listener has heard the audio of its session's segments admitted
        before it (-inf: none, or it is not a session's next segment). Later segments'
        audio comes after its own, so once one of them has counted it is not used."""
        if not (req.priority and req.session):
            return -math.inf
        due, by = self._session_due.get(req.session, (-math.inf, 0))
        return due if by < order else -math.inf

    def end_session(self, session: int) -> None:
        """Session ``session`` starts no more streams: forget when its listener runs dry."""
        self._session_due.pop(session, None)

    def observe_tick(self, seconds: float) -> None:
        """One more tick took ``seconds`` (the lateness rule's estimate of the next)."""
        self.tick_s += 0.1 * (seconds - self.tick_s)

    def route(self, run: np.ndarray, frames: np.ndarray, ready: np.ndarray, index: np.ndarray, now: float, tick: int) -> None:
        """Hand finished frames to the decode thread and close finished streams.

        All the step's frames go into the slot table at once; Python looks only at the
        streams that send a chunk or end this tick."""
        tab = self.slots
        done = self.finished(run)
        got = np.flatnonzero(ready)
        if got.size == run.size:  # the usual tick: every stream completed a frame
            tab.add_pending(run, frames, index)
            send = done | self.due(run, now)
        else:
            tab.add_pending(run[got], frames[got], index[got])
            send = done.copy()
            send[got] |= self.due(run[got], now)
        out: list[DecodeJob] = []  # the tick's chunks, handed to the decode thread at once
        try:
            for i in np.flatnonzero(send).tolist():
                slot = int(run[i])
                if done[i]:
                    s = tab.streams[slot]
                    assert s is not None
                    s.req.stats.finish_reason = self.finish_reason(slot)
                    self._emit(slot, now, tick, out, last=True)  # frees the slot before the last chunk goes out
                else:
                    self._emit(slot, now, tick, out, last=False)
        finally:
            if out:
                self._submit(out)

    def finished(self, run: np.ndarray) -> np.ndarray:
        """Which of ``run`` (each just stepped) end now (:meth:`finish_reason` says why)."""
        st = self.states
        tab = self.slots
        done: np.ndarray = (
            st.is_stopping[run]
            | (st.delayed_length[run] == self.n_vq)  # last frame complete; next row is <|audio_end|>
            | (tab.steps[run] >= tab.max_new[run])
            | (tab.kv_pos[run] >= self.n_ctx_seq)
        )
        return done

    def due(self, slots: np.ndarray, now: float) -> np.ndarray:
        """Which of ``slots`` (each just given a frame) send their new frames now? At the
        chunk target, or before a listener would run dry.

        A real-time listener started at the first chunk has ``slack`` seconds of
        audio left; waiting for a full chunk costs the remaining frames' ticks plus
        a decode, so send early when that would exhaust the slack. Before the first chunk
        no listener plays: the first chunk waits for its target (its size is the policy's
        choice: first audio sooner against a listener started with more in hand).
        """
        tab = self.slots
        new = tab.pend_n[slots] - tab.warm[slots]
        chunks = tab.chunks
        target = chunks[slots, np.minimum(tab.chunk_index[slots], chunks.shape[1] - 1)]
        missing = target - new
        sent = tab.frames_sent[slots]
        slack = tab.t_first_emit[slots] + sent * FRAME_S - now
        late = (sent > 0) & (slack < missing * self.tick_s + self.decode_margin_s)
        due: np.ndarray = (new > 0) & ((missing <= 0) | late)
        return due

    def finish_reason(self, slot: int) -> str:
        if self.states.is_stopping[slot]:
            return "stop"
        if self.states.delayed_length[slot] == self.n_vq:
            return "audio_end"
        if self.slots.steps[slot] >= self.slots.max_new[slot]:
            return "max_new_tokens"
        return "context_full"

    def _emit(self, slot: int, now: float, tick: int, out: list[DecodeJob], last: bool) -> None:
        """The slot's pending frames as a job: appended to ``out``, or (``last``) handed over
        at once by freeing the slot (a stream has one job a tick, so the order holds)."""
        tab = self.slots
        s = tab.streams[slot]
        assert s is not None
        warm = int(tab.warm[slot])
        n = int(tab.pend_n[slot]) - warm  # new frames (the warm-up ones lead)
        if n == 0 and not last:
            return
        codes = tab.take_pending(slot)
        if s.lead is not None:  # a continuation's first chunk: the prefix's known frames lead
            codes = np.concatenate([s.lead, codes])
            warm += s.lead.shape[0]
            s.lead = None
        s.req.stats.steps = int(tab.steps[slot])
        s.req.stats.step_s = float(tab.step_s[slot])
        if tab.frames_sent[slot] == 0 and n:  # a session's next segment plays after the earlier ones
            tab.t_first_emit[slot] = max(now, self._heard(s.req, s.order))
        if s.req.session and n:
            heard = float(tab.t_first_emit[slot] + (tab.frames_sent[slot] + n) * FRAME_S)
            due, by = self._session_due.get(s.req.session, (-math.inf, 0))
            self._session_due[s.req.session] = (max(due, heard), max(by, s.order))
        s.req.stats.frames += n
        rows = None
        if tab.keep_rows[slot]:
            rows = np.stack(s.rows) if s.rows else self._no_rows
            s.rows = []
        job = DecodeJob(
            s.req.rid, s.req.sink, codes, int(tab.pending_first[slot]), int(tab.steps[slot]) - 1,
            is_last=last, tick=tick, warm=warm, rows=rows,
        )
        if last:  # the slot and its KV cells are free before its listener hears the end
            self._free(slot, job)
            return
        out.append(job)
        tab.frames_sent[slot] += n
        tab.audio_due[slot] = tab.t_first_emit[slot] + tab.frames_sent[slot] * FRAME_S
        tab.chunk_index[slot] += 1
