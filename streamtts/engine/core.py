"""The engine loop: one thread, ``schedule -> execute -> update`` every tick.

Each tick advances every running stream by one step in a single backbone
call (one embedding row per stream, its own sequence id and position), runs
the audio heads for all of them in one matmul, samples and advances the delay
state machines vectorised over the batch, and routes the frames that became
complete to the decode thread. A joining stream's prompt is prefilled in
chunks between ticks so it never freezes the others.

Only this thread touches the backbone. The asyncio side talks to it through a
command queue (submit / abort) and receives audio through each stream's sink.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import EngineConfig
from ..constants import FRAME_S
from ..core.frames import FrameAssembler
from ..core.state import DelayStates
from ..core.tokens import TokenIds
from ..errors import EngineClosedError, GenerationError, QueueTimeoutError
from ..model.weights import AudioHeads, Embedder
from ..request import PreparedRequest
from .decoding import DecodeJob, DecodeWorker
from .prefix_cache import PrefixCache

log = logging.getLogger(__name__)

_NEG_INF = np.float32(-np.inf)


class BackboneLike(Protocol):
    """What the loop needs from a backbone (the real one, or the zero-cost stand-in)."""

    n_embd: int
    n_ctx_seq: int

    def bind(
        self,
        embd: np.ndarray,
        pos: np.ndarray,
        seq: np.ndarray,
        output: np.ndarray,
        hidden_out: np.ndarray | None,
        logits_out: np.ndarray | None,
    ) -> None: ...

    def decode_bound(self, n_rows: int, want_hidden: bool = True, out_offset: int = 0) -> int: ...

    def seq_rm(self, seq: int) -> None: ...

    def seq_state(self, seq: int) -> np.ndarray: ...

    def load_seq_state(self, seq: int, state: np.ndarray) -> None: ...


@dataclass
class StepProfile:
    """Cumulative wall time per stage of the step path (seconds)."""

    ticks: int = 0
    rows: int = 0
    embed: float = 0.0
    backbone: float = 0.0
    heads: float = 0.0
    sampling: float = 0.0
    other: float = 0.0
    prefill: float = 0.0
    prefill_rows: int = 0

    def per_step_ms(self) -> dict[str, float]:
        n = max(self.ticks, 1)
        return {k: 1000.0 * getattr(self, k) / n for k in ("embed", "backbone", "heads", "sampling", "other")}


@dataclass(eq=False)
class _Slot:
    req: PreparedRequest
    fed: int = 0  # prompt rows already in the KV cache
    running: bool = False  # prefill done, stepping
    paused: bool = False  # backpressure
    frames_sent: int = 0  # frames handed to the decode thread
    pending: list[np.ndarray] = field(default_factory=list)
    pending_first: int = 0
    chunk_index: int = 0
    t_first_emit: float = 0.0


class EngineCore:
    def __init__(
        self,
        cfg: EngineConfig,
        ids: TokenIds,
        backbone: BackboneLike,
        embedder: Embedder | None,
        heads: AudioHeads | None,
        decoder: DecodeWorker,
        *,
        fused_heads: bool = False,
    ) -> None:
        self.cfg = cfg
        self.ids = ids
        self.backbone = backbone
        self.embedder = embedder
        self.heads = heads
        self.decoder = decoder
        self.fused = fused_heads
        cap = cfg.max_streams
        self.capacity = cap
        k = ids.n_vq
        a = ids.audio_rows
        h = backbone.n_embd
        self.n_ctx_seq = backbone.n_ctx_seq
        self.states = DelayStates(cap, ids)
        self.assembler = FrameAssembler(cap, k, ids.audio_pad_code)
        rows_max = max(cfg.n_batch, cap)
        self.max_prefill = max(1, min(cfg.prefill_chunk, cfg.n_batch))
        # Persistent buffers bound once to the backbone (the hot path allocates nothing).
        self.embd = np.zeros((rows_max, h), dtype=np.float32)
        self.pos = np.zeros(rows_max, dtype=np.int32)
        self.seq = np.zeros(rows_max, dtype=np.int32)
        self.outf = np.zeros(rows_max, dtype=np.int8)
        n_cols = 2 + (k * a if fused_heads else 0)
        # Output rows: one per running stream plus one per prompt completed this tick.
        self.logits = np.zeros((2 * cap, n_cols), dtype=np.float32)
        self.hidden = None if fused_heads else np.zeros((2 * cap, h), dtype=np.float32)
        self.audio_buf = np.zeros((2 * cap, k * a), dtype=np.float32)
        backbone.bind(self.embd, self.pos, self.seq, self.outf, self.hidden, self.logits)
        self.next_rows = np.zeros((cap, 1 + k), dtype=np.int64)
        self._rows = np.zeros((cap, 1 + k), dtype=np.int64)
        self._out = np.zeros((2 * cap, 1 + k), dtype=np.int64)
        self.kv_pos = np.zeros(cap, dtype=np.int32)
        self.steps = np.zeros(cap, dtype=np.int64)
        self.max_new = np.zeros(cap, dtype=np.int64)
        self.fixed = np.full(cap, -1, dtype=np.int64)
        # when a real-time listener of each slot would run dry (-inf before its first audio)
        self.audio_due = np.full(cap, -np.inf, dtype=np.float64)
        self._empty = np.zeros((0, k), dtype=np.int64)
        self.slots: list[_Slot | None] = [None] * cap
        self.waiting: deque[PreparedRequest] = deque()
        self._commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="streamtts-engine", daemon=True)
        self._stopping = False
        self._run_cache: np.ndarray | None = None
        self._joining: list[int] = []  # slots still prefilling, in admission order
        self._arange = np.arange(rows_max, dtype=np.int32)
        self.prefix_cache = PrefixCache(cfg.prefix_cache_mib << 20)
        self.profile = StepProfile()
        self.ticks = 0  # engine ticks so far (prefill-only ticks included)
        self.chunk_frames = list(cfg.chunk_frames)
        self.tick_s = 0.0  # moving average of the tick time (for the chunk policy)
        self.decode_margin_s = 0.05  # time allowed for a decode window to reach the listener

    # -- front-end API (any thread) -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, req: PreparedRequest) -> None:
        if self._stopping:
            raise EngineClosedError("engine is closed")
        self._commands.put(("submit", req))

    def abort(self, rid: int) -> None:
        self._commands.put(("abort", rid))

    def stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._commands.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join()

    @property
    def active_streams(self) -> int:
        return sum(s is not None for s in self.slots)

    @property
    def queued_streams(self) -> int:
        return len(self.waiting)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                idle = self.active_streams == 0
                if not self._drain_commands(block=idle):
                    break
                self._expire_waiting()
                self._admit()
                if self.active_streams:
                    self._tick()
        except BaseException:  # pragma: no cover - a bug; make it loud and fail every stream
            log.exception("engine loop crashed")
            self._fail_all(GenerationError("engine loop crashed; see the log"))
            raise
        finally:
            self._fail_all(EngineClosedError("engine closed"))

    def _drain_commands(self, block: bool) -> bool:
        while True:
            try:
                if block:
                    timeout = 0.5 if self.waiting else None
                    cmd, arg = self._commands.get(timeout=timeout)
                    block = False
                else:
                    cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                return True
            if cmd == "submit":
                assert isinstance(arg, PreparedRequest)
                self.waiting.append(arg)
            elif cmd == "abort":
                self._abort(int(arg))  # type: ignore[call-overload]
            elif cmd == "stop":
                return False

    def _expire_waiting(self) -> None:
        now = time.monotonic()
        limit = self.cfg.queue_timeout_s
        while self.waiting and now - self.waiting[0].stats.t_submit > limit:
            req = self.waiting.popleft()
            err = QueueTimeoutError(f"no stream slot became free within {limit:g} s (all {self.capacity} busy)")
            self.decoder.submit(DecodeJob(req.rid, req.sink, self._empty, 0, 0, error=err))

    def _admit(self) -> None:
        while self.waiting and None in self.slots:
            req = self.waiting.popleft()
            if req.sink.cancelled:
                continue
            slot = self.slots.index(None)
            self.slots[slot] = _Slot(req)
            req.stats.t_admitted = time.monotonic()
            req.stats.prompt_rows = req.prompt.shape[0]
            self.states.reset(slot, req.prompt, req.sampling, req.seed)
            self.assembler.reset(slot)
            self.kv_pos[slot] = 0
            self.steps[slot] = 0
            self.max_new[slot] = req.max_new_tokens
            self.fixed[slot] = -1 if req.fixed_frames is None else req.fixed_frames
            self.audio_due[slot] = -np.inf
            self._joining.append(slot)
            self._run_cache = None

    def _abort(self, rid: int) -> None:
        for i, s in enumerate(self.slots):
            if s is not None and s.req.rid == rid:
                s.req.stats.finish_reason = "cancelled"
                self._free(i, DecodeJob(rid, s.req.sink, self._empty, 0, 0, drop=True))
                return
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                return

    def _free(self, slot: int, final: DecodeJob) -> None:
        s = self.slots[slot]
        self._vacate(slot)
        if s is not None:
            self.decoder.submit(final)

    def _vacate(self, slot: int) -> None:
        """Empty a slot: its KV cells, prefix claims and place in the prefill queue."""
        self.slots[slot] = None
        self._run_cache = None
        if slot in self._joining:
            self._joining.remove(slot)
        self.prefix_cache.release(slot)
        try:
            self.backbone.seq_rm(slot)
        except Exception:  # pragma: no cover - the slot is unusable then; keep the engine up
            log.exception("could not free KV cache of slot %d", slot)

    def _fail_all(self, err: BaseException) -> None:
        for i, s in enumerate(self.slots):
            if s is not None:
                self._free(i, DecodeJob(s.req.rid, s.req.sink, self._empty, 0, 0, error=err))
        while self.waiting:
            req = self.waiting.popleft()
            self.decoder.submit(DecodeJob(req.rid, req.sink, self._empty, 0, 0, error=err))

    # -- one tick ---------------------------------------------------------------------------
    def _tick(self) -> None:
        """Step every running stream, prefill a chunk of joining prompts, then sample all."""
        self.ticks += 1
        t0 = time.perf_counter()
        run = self._running()
        b = run.size
        if b and not self._decode_run(run):
            run, b = _NO_SLOTS, 0
        fin = self._prefill(out_offset=b)
        slots = run if fin.size == 0 else np.concatenate([run, fin])
        if not slots.size:
            return
        try:
            self._sample(slots, t0)
        except Exception as exc:
            log.exception("sampling failed for %d streams", slots.size)
            self._fail_slots(slots, "generation step failed", exc)

    def _running(self) -> np.ndarray:
        """Slots to step this tick: prefilled, not paused by backpressure; while some
        stream waits for its first audio, not those more than ``step_slack_s`` ahead of
        a real-time listener (each row costs tick time the newcomer waits for); and,
        when more run than ``max_batch_rows``, those closest to running dry first."""
        changed = False
        hi, lo = self.cfg.max_buffered_s, self.cfg.resume_buffered_s
        for s in self.slots:
            if s is None or not s.running:
                continue
            b = s.req.sink.buffered_s()
            if s.paused and b < lo:
                s.paused, changed = False, True
            elif not s.paused and b > hi:
                s.paused, changed = True, True
        if changed or self._run_cache is None:
            self._run_cache = np.array(
                [i for i, s in enumerate(self.slots) if s is not None and s.running and not s.paused],
                dtype=np.int64,
            )
        run = self._run_cache
        if run.size < 2:
            return run
        # audio delivered minus time elapsed (-inf: no audio yet)
        slack = self.audio_due[run] - time.monotonic()
        ahead = self.cfg.step_slack_s
        if ahead > 0 and np.isneginf(slack).any():
            keep = slack < ahead
            run, slack = run[keep], slack[keep]
        limit = self.cfg.max_batch_rows
        if 0 < limit < run.size:  # the ones closest to running dry
            run = np.sort(run[np.argpartition(slack, limit - 1)[:limit]])
        return run

    def _fail_slots(self, slots: np.ndarray, what: str, exc: BaseException) -> None:
        for slot in slots.tolist():
            s = self.slots[slot]
            if s is not None:
                err = GenerationError(f"{what}: {exc}")
                err.__cause__ = exc
                s.req.stats.finish_reason = "error"
                self._free(slot, DecodeJob(s.req.rid, s.req.sink, self._empty, 0, 0, error=err))

    def _decode_run(self, run: np.ndarray) -> bool:
        """One backbone call with one row per running stream; outputs land in rows [0, B)."""
        prof = self.profile
        b = run.size
        t0 = time.perf_counter()
        rows = self._rows[:b]
        np.take(self.next_rows, run, axis=0, out=rows)
        if self.embedder is not None:
            self.embedder(rows, out=self.embd[:b])
        self.pos[:b] = self.kv_pos[run]
        self.seq[:b] = run
        self.outf[:b] = 1
        t1 = time.perf_counter()
        try:
            self.backbone.decode_bound(b, not self.fused, 0)
        except Exception as exc:
            log.exception("backbone step failed for %d streams", b)
            self._fail_slots(run, "backbone step failed", exc)
            return False
        self.kv_pos[run] += 1
        prof.embed += t1 - t0
        prof.backbone += time.perf_counter() - t1
        return True

    def _prefill(self, out_offset: int) -> np.ndarray:
        """Feed joining prompts, oldest first, up to ``prefill_chunk`` rows per tick.

        Each prompt is fed in a fixed partition that depends on the prompt alone:
        its cacheable prefix (if any), then the rest, each in ``prefill_chunk`` pieces,
        one llama_decode per piece holding that sequence only. llama.cpp's CPU flash
        attention rounds differently for different row counts, and it splits a batch
        of unequal sequences into equal pieces, so sharing calls or budget-sized
        pieces would make a stream's output depend on who joined with it. Without a
        prefix and with prompts up to ``n_batch`` rows this is the official one-call
        prefill. A prompt's last row is output (its first step) at row
        ``out_offset + k``. Returns the slots whose prompt completed.
        """
        budget = self.max_prefill
        fin: list[int] = []
        for slot in list(self._joining):
            s = self.slots[slot]
            if s is None:
                continue
            req = s.req
            total = req.prompt.shape[0]
            if s.fed == 0 and req.prefix_rows and self.prefix_cache.enabled:
                got = self.prefix_cache.lookup(req.prefix_key, slot, req.prefix_rows)
                if isinstance(got, str) and got == "wait":
                    continue  # another stream is computing this prefix; load it when stored
                if not isinstance(got, str) and not self._load_prefix(slot, s, got):
                    continue
            while budget and self.slots[slot] is s and s.fed < total:
                end = req.prefix_rows if s.fed < req.prefix_rows else total
                take = min(end - s.fed, self.max_prefill)
                if take > budget:
                    break
                last = s.fed + take == total
                if not self._prefill_piece(slot, s, take, out_offset + len(fin) if last else -1):
                    break
                budget -= take
                if s.fed == req.prefix_rows and self.prefix_cache.enabled:
                    self._store_prefix(slot, s)
                if last:
                    fin.append(slot)
            if not budget:
                break
        return np.asarray(fin, dtype=np.int64) if fin else _NO_SLOTS

    def _prefill_piece(self, slot: int, s: _Slot, n: int, out_row: int) -> bool:
        """Rows [fed, fed + n) of one prompt in one call; the last row is output to
        ``out_row`` unless it is -1."""
        a = s.fed
        self.embd[:n] = s.req.prompt_embd[a : a + n]
        np.add(self._arange[:n], a, out=self.pos[:n])
        self.seq[:n] = slot
        self.outf[:n] = 0
        if out_row >= 0:
            self.outf[n - 1] = 1
        t0 = time.perf_counter()
        try:
            self.backbone.decode_bound(n, out_row >= 0 and not self.fused, max(out_row, 0))
        except Exception as exc:
            log.exception("prefill failed")
            self._fail_slots(np.array([slot]), "prompt prefill failed", exc)
            return False
        self.profile.prefill += time.perf_counter() - t0
        self.profile.prefill_rows += n
        s.fed += n
        s.req.stats.prefill_ticks += 1
        self.kv_pos[slot] += n
        if s.fed == s.req.prompt.shape[0]:
            s.running = True
            s.req.stats.t_prefilled = time.monotonic()
            self._joining.remove(slot)
            self._run_cache = None
        return True

    def _load_prefix(self, slot: int, s: _Slot, state: np.ndarray) -> bool:
        try:
            self.backbone.load_seq_state(slot, state)
        except Exception as exc:
            log.exception("loading a cached prompt prefix failed")
            self._fail_slots(np.array([slot]), "loading the cached prompt prefix failed", exc)
            return False
        s.fed = s.req.prefix_rows
        self.kv_pos[slot] = s.fed
        s.req.stats.prefix_cached_rows = s.fed
        return True

    def _store_prefix(self, slot: int, s: _Slot) -> None:
        try:
            state = self.backbone.seq_state(slot)
        except Exception:  # the stream itself is fine; only the cache entry is lost
            log.exception("snapshot of a prompt prefix failed")
            self.prefix_cache.release(slot)
            return
        self.prefix_cache.store(s.req.prefix_key, slot, state)

    def _sample(self, slots: np.ndarray, t_tick: float) -> None:
        """Heads, sampling and state for output rows [0, len(slots)), then route frames."""
        prof = self.profile
        b = slots.size
        t2 = time.perf_counter()
        if self.fused:
            audio = self.logits[:b, 2:].reshape(b, self.ids.n_vq, self.ids.audio_rows)
        else:
            assert self.heads is not None and self.hidden is not None
            audio = self.heads(self.hidden[:b], self.audio_buf)
        t3 = time.perf_counter()
        pair = self.logits[:b, :2]
        self._force_fixed(slots, pair)
        out = self.states.step(slots, pair, audio, self._full_text_logits, self._out[:b])
        t4 = time.perf_counter()
        self.steps[slots] += 1
        self.next_rows[slots] = out
        tick_s = t4 - t_tick
        self.tick_s += 0.1 * (tick_s - self.tick_s)
        for slot in slots.tolist():  # before routing: routing frees finished slots
            s = self.slots[slot]
            if s is not None:
                s.req.stats.steps += 1
                s.req.stats.step_s += tick_s
        frames, ready, index = self.assembler.push(slots, out[:, 1:])
        self._route(slots, frames, ready, index)
        t5 = time.perf_counter()
        prof.ticks += 1
        prof.rows += b
        prof.heads += t3 - t2
        prof.sampling += t4 - t3
        prof.other += t5 - t4

    def _force_fixed(self, run: np.ndarray, pair: np.ndarray) -> None:
        fx = self.fixed[run]
        if fx.max(initial=-1) < 0:
            return
        st = self.steps[run]
        on = fx >= 0
        pair[on & (st < fx - 1), 1] = _NEG_INF  # keep talking
        pair[on & (st >= fx - 1), 0] = _NEG_INF  # then end speech

    def _full_text_logits(self, i: int) -> np.ndarray:
        """Full text-head logits of output row ``i``: rare, only outside audio mode."""
        if self.heads is None or self.hidden is None:
            raise GenerationError("text mode needs the full text head, which the fused GGUF does not hold")
        return self.heads.text_logits(self.hidden[i])

    def _route(self, run: np.ndarray, frames: np.ndarray, ready: np.ndarray, index: np.ndarray) -> None:
        """Hand finished frames to the decode thread and close finished streams."""
        n_vq = self.ids.n_vq
        st = self.states
        done = (
            st.is_stopping[run]
            | (st.delayed_length[run] == n_vq)  # last frame complete; next row is <|audio_end|>
            | (self.steps[run] >= self.max_new[run])
            | (self.kv_pos[run] >= self.n_ctx_seq)
        )
        now = time.monotonic()
        for i in np.flatnonzero(ready | done).tolist():
            slot = int(run[i])
            s = self.slots[slot]
            assert s is not None
            if ready[i]:
                if not s.pending:
                    s.pending_first = int(index[i])
                s.pending.append(frames[i].copy())
            if done[i]:
                s.req.stats.finish_reason = self._finish_reason(slot)
                self._emit(slot, s, now, last=True)
                self._free_finished(slot)
            elif s.pending and self._due(s, now):
                self._emit(slot, s, now, last=False)

    def _due(self, s: _Slot, now: float) -> bool:
        """Send the pending frames now? At the chunk target, or before a listener would run dry.

        A real-time listener started at the first chunk has ``slack`` seconds of
        audio left; waiting for a full chunk costs the remaining frames' ticks plus
        a decode, so send early when that would exhaust the slack.
        """
        target = self.chunk_frames[min(s.chunk_index, len(self.chunk_frames) - 1)]
        missing = target - len(s.pending)
        if missing <= 0:
            return True
        slack = s.t_first_emit + s.frames_sent * FRAME_S - now
        return slack < missing * self.tick_s + self.decode_margin_s

    def _emit(self, slot: int, s: _Slot, now: float, last: bool) -> None:
        codes = np.stack(s.pending) if s.pending else self._empty
        n = codes.shape[0]
        if n == 0 and not last:
            return
        if s.frames_sent == 0 and n:
            s.t_first_emit = now
        s.req.stats.frames += n
        self.decoder.submit(
            DecodeJob(
                s.req.rid, s.req.sink, codes, s.pending_first, int(self.steps[slot]) - 1,
                is_last=last, tick=self.ticks,
            )
        )
        s.frames_sent += n
        self.audio_due[slot] = s.t_first_emit + s.frames_sent * FRAME_S
        s.chunk_index += 1
        s.pending = []

    def _finish_reason(self, slot: int) -> str:
        if self.states.is_stopping[slot]:
            return "stop"
        if self.states.delayed_length[slot] == self.ids.n_vq:
            return "audio_end"
        if self.steps[slot] >= self.max_new[slot]:
            return "max_new_tokens"
        return "context_full"

    def _free_finished(self, slot: int) -> None:
        self._vacate(slot)


_NO_SLOTS = np.zeros(0, dtype=np.int64)
