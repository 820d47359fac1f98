"""The engine loop: one thread, ``schedule -> execute -> update`` every tick.

``schedule`` (:mod:`.scheduler`) decides which streams step and which prompt
pieces are fed; ``execute`` runs them through the backbone and the audio heads;
``update`` samples, advances the delay state machines and routes frames.

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
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..config import EngineConfig
from ..constants import FRAME_S
from ..core.frames import FrameAssembler
from ..core.tokens import TokenIds
from ..errors import EngineClosedError, GenerationError, QueueTimeoutError
from ..kernels import Kernels, SpecDelayStep, SpecFramePush, SpecStepEmbed
from ..model.backbone import KV_PAD
from ..model.tables import AudioHeads, Embedder
from ..request import PreparedRequest
from .decoding import DecodeJob, DecodeWorker
from .prefix_cache import PrefixCache
from .scheduler import NO_SLOTS, Plan, Scheduler
from .slot_table import SlotTable, Stream

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

    def decode_bound(self, n_rows: int, want_hidden: bool = True, out_offset: int = 0, lend: bool = False) -> int: ...

    # where the last decode_bound(..., lend=True) left its logits rows, or 0 (copied)
    lent_logits: int

    def seq_rm(self, seq: int, start: int = 0) -> None: ...

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
    # the backbone waiting for a codec call to finish (CPU codec, `codec_turns`): the codec's
    # work the step pays for on shared cores
    codec_wait: float = 0.0
    prefill: float = 0.0
    prefill_rows: int = 0
    # the fastest one-row decode: what a step costs when nothing else wants the CPU
    # (`--profile` warns when the average is far above it)
    backbone_min_1row: float = float("inf")

    def per_step_ms(self) -> dict[str, float]:
        n = max(self.ticks, 1)
        return {k: 1000.0 * getattr(self, k) / n for k in ("embed", "backbone", "heads", "sampling", "other", "codec_wait")}


@dataclass(slots=True)
class StepResult:
    """What ``execute`` hands ``update``: output rows [0, len(slots)) belong to ``slots``."""

    slots: np.ndarray
    t_start: float
    audio: np.ndarray | None = None  # (B, n_vq, audio_rows) audio logits (heads already applied)


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
        kernels: Kernels,
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
        # new frames wait at most for the largest chunk, behind at most n_vq - 1 warm-up ones
        # (a continuation's prefix frames that its first steps complete)
        self.slots = SlotTable(cap, k, max(cfg.chunk_frames) + k - 1)
        self.kernels = kernels
        self.states = kernels.delay_states(cap, ids)
        self.assembler = FrameAssembler(cap, k, ids.audio_pad_code)
        self.prefix_cache = PrefixCache(cfg.prefix_cache_mib << 20)
        self.scheduler = Scheduler(cfg, self.slots, self.prefix_cache)
        rows_max = max(cfg.n_batch, cap)
        # Persistent buffers bound once to the backbone (the hot path allocates nothing).
        self.embd = np.zeros((rows_max, h), dtype=np.float32)
        self.pos = np.zeros(rows_max, dtype=np.int32)
        self.seq = np.zeros(rows_max, dtype=np.int32)
        self.outf = np.zeros(rows_max, dtype=np.int8)
        n_cols = 2 + (k * a if fused_heads else 0)
        # Output rows: one per running stream plus one per prompt completed this tick.
        self.logits = np.zeros((2 * cap, n_cols), dtype=np.float32)
        self.hidden = None if fused_heads else np.zeros((2 * cap, h), dtype=np.float32)
        # the heads' output, or (fused heads) whole rows copied when no kernel reads them strided
        self.audio_in_place = fused_heads and kernels.reads_strided_audio
        self.audio_buf = np.zeros((0 if self.audio_in_place else 2 * cap, k * a), dtype=np.float32)
        backbone.bind(self.embd, self.pos, self.seq, self.outf, self.hidden, self.logits)
        # the copy of a decode's outputs runs on the tick's threads too (a stand-in may not copy)
        self._attach_pool = getattr(backbone, "set_tick_pool", None)
        if self._attach_pool is not None and kernels.pool is not None:
            self._attach_pool(kernels.pool.handle)
        audio_base = self.logits[:, 2:] if self.audio_in_place else self.audio_buf
        self._out = np.zeros((2 * cap, 1 + k), dtype=np.int64)
        # the step's kernels, bound once to these buffers: a step of B streams has their slot
        # numbers in _slot_buf[:B] and its logits and rows in the first B rows of the others
        audio_all = audio_base.reshape(2 * cap, k, a)  # a view: the last axis is contiguous
        assert audio_all.size == 0 or np.shares_memory(audio_all, audio_base)
        self._slot_buf = np.zeros(2 * cap, dtype=np.int64)
        self._step = kernels.bind_delay_step(
            SpecDelayStep(self.states, self._slot_buf, self.logits[:, :2], audio_all, self._out, self._full_text_logits)
        )
        # A step with no prompt piece reads its logits where the backbone left them (fused
        # heads: 17 MB a tick at 128 streams not copied); a plain bool, so a test can turn it off.
        self.lend_logits = self.audio_in_place and self._step.reads_lent
        self._lent = 0  # the address the delay step reads from, 0: self.logits
        self.lent_steps = 0  # steps that read lent rows (a plain int, for tests and --profile)
        self._push = kernels.bind_frame_push(SpecFramePush(self.assembler, self._slot_buf, self._out[:, 1:]))
        self.next_rows = np.zeros((cap, 1 + k), dtype=np.int64)
        self._embed = (
            None if embedder is None else kernels.bind_step_embed(SpecStepEmbed(embedder, self._slot_buf, self.next_rows, self.embd))
        )
        self._empty = np.zeros((0, k), dtype=np.int64)
        self._arange = np.arange(rows_max, dtype=np.int32)
        self._slot_ids = np.arange(cap, dtype=np.int64)
        self.waiting: deque[PreparedRequest] = deque()
        self._commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="streamtts-engine", daemon=True)
        self._stopping = False
        self.profile = StepProfile()
        self.ticks = 0  # engine ticks so far (prefill-only ticks included)
        self.chunk_frames = list(cfg.chunk_frames)
        self._chunk_arr = np.asarray(self.chunk_frames, dtype=np.int64)  # the same, for _due
        self.tick_s = 0.0  # moving average of the tick time (for the chunk policy)
        self.decode_margin_s = 0.05  # time allowed for a decode window to reach the listener

    # -- front-end API (any thread) -------------------------------------------------------
    def start(self) -> None:
        if self.cfg.gil_switch_ms > 0:
            sys.setswitchinterval(self.cfg.gil_switch_ms / 1000)  # see EngineConfig.gil_switch_ms
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
        if self.heads is not None:
            self.heads.close()
        if self._attach_pool is not None and self.kernels.pool is not None:
            self._attach_pool(None)  # before the pool's threads stop
        self.kernels.close()

    @property
    def active_streams(self) -> int:
        return self.slots.active

    @property
    def queued_streams(self) -> int:
        return len(self.waiting)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                idle = self.slots.active == 0
                if not self._drain_commands(block=idle):
                    break
                self._expire_waiting()
                self._admit()
                if self.slots.active:
                    self.step()
        except BaseException:  # pragma: no cover - a bug; make it loud and fail every stream
            log.exception("engine loop crashed")
            self._fail_all(GenerationError("engine loop crashed; see the log"))
            raise
        finally:
            self._fail_all(EngineClosedError("engine closed"))

    def step(self) -> None:
        """One tick: ``schedule -> execute -> update``."""
        self.ticks += 1
        plan = self.scheduler.schedule()
        if plan.empty:
            return
        t0 = time.perf_counter()
        with self.decoder.turns.backbone():  # CPU codec: not while the codec's call runs
            self.profile.codec_wait += time.perf_counter() - t0
            result = self.execute(plan)
        if result.slots.size:
            self.update(result)

    def _drain_commands(self, block: bool) -> bool:
        if not block and self._commands.empty():  # the usual tick: no exception raised and caught
            return True
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
        while self.waiting:
            slot = self.slots.free_slot()
            if slot is None:
                return
            req = self.waiting.popleft()
            if req.sink.cancelled:
                continue
            s = self.slots.reset(slot, req)
            req.stats.t_admitted = time.monotonic()
            req.stats.prompt_rows = req.prompt.shape[0]
            self.states.reset(slot, req.prompt, req.sampling, req.seed)
            self.assembler.reset(slot)
            if req.audio_prefix_rows:
                self._seed_prefix(slot, s)
            self.scheduler.admitted(slot)

    def _seed_prefix(self, slot: int, s: Stream) -> None:
        """A continuation: the prompt ends in an audio prefix (T rows in the delay layout).
        Its rows go into the frame assembler as if generated, so the first steps complete
        the prefix's last frames; the frames it completes already are pending as warm-up:
        the codec decodes them for its state and their samples are not sent."""
        t = s.req.audio_prefix_rows
        known = self.assembler.seed(slot, s.req.prompt[-t:, 1:])
        known = known[np.any(known != self.ids.audio_pad_code, axis=1)]  # as a push's `ready`
        s.lead = known if known.shape[0] else None
        self.slots.prefix_frames[slot] = t

    def _abort(self, rid: int) -> None:
        slot = self.slots.find(rid)
        if slot is not None:
            s = self.slots.streams[slot]
            assert s is not None
            s.req.stats.finish_reason = "cancelled"
            self._free(slot, DecodeJob(rid, s.req.sink, self._empty, 0, 0, drop=True))
            return
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                return

    def _free(self, slot: int, final: DecodeJob | None = None) -> None:
        """Empty a slot (its row, KV cells, prefix claims, place in the prefill queue) and
        hand ``final`` to the decode thread."""
        held = self.slots.streams[slot]
        if held is not None:  # its step counts, as at each chunk (an abort or failure ends here)
            held.req.stats.steps = int(self.slots.steps[slot])
            held.req.stats.step_s = float(self.slots.step_s[slot])
        try:  # the cells first: a slot that shows free holds none
            self.backbone.seq_rm(slot)
        except Exception:  # pragma: no cover - the slot is unusable then; keep the engine up
            log.exception("could not free KV cache of slot %d", slot)
        s = self.slots.release(slot)
        self.scheduler.released(slot)
        if s is not None and final is not None:
            self.decoder.submit(final)

    def _fail_all(self, err: BaseException) -> None:
        for i, s in enumerate(self.slots.streams):
            if s is not None:
                self._free(i, DecodeJob(s.req.rid, s.req.sink, self._empty, 0, 0, error=err))
        while self.waiting:
            req = self.waiting.popleft()
            self.decoder.submit(DecodeJob(req.rid, req.sink, self._empty, 0, 0, error=err))

    def _fail_slots(self, slots: np.ndarray | list[int], what: str, exc: BaseException) -> None:
        for slot in np.asarray(slots).tolist():
            s = self.slots.streams[slot]
            if s is not None:
                err = GenerationError(f"{what}: {exc}")
                err.__cause__ = exc
                s.req.stats.finish_reason = "error"
                self._free(slot, DecodeJob(s.req.rid, s.req.sink, self._empty, 0, 0, error=err))

    # -- execute: the backbone and the heads -----------------------------------------------
    def execute(self, plan: Plan) -> StepResult:
        """Decode one row per stepped stream, then the planned prompt pieces (their last
        rows are output after the stepped ones), then the audio heads of all output rows."""
        t0 = time.perf_counter()
        run = plan.decode
        # lent rows live until the next decode: none while a prompt piece decodes after the run
        lend = self.lend_logits and not plan.prefill and not plan.loads
        lent = 0
        if run.size:
            if not self._decode_run(run, lend):
                run = NO_SLOTS
            elif lend:
                lent = self.backbone.lent_logits
        if lent != self._lent:
            self._step.read_logits_at(lent)
            self._lent = lent
        self.lent_steps += lent != 0
        for slot, state in plan.loads:
            self._load_prefix(slot, state)
        fin: list[int] = []
        for piece in plan.prefill:
            s = self.slots.streams[piece.slot]
            if s is None or s.fed != piece.start:  # failed or freed earlier in this tick
                continue
            out_row = run.size + len(fin) if piece.last else -1
            if self._prefill_piece(piece.slot, piece.rows, out_row):
                if piece.store_prefix:
                    self._store_prefix(piece.slot)
                if piece.last:
                    fin.append(piece.slot)
        slots = run if not fin else np.concatenate([run, np.asarray(fin, dtype=np.int64)])
        result = StepResult(slots, t0)
        if slots.size:
            t2 = time.perf_counter()
            b = slots.size
            if self.audio_in_place:  # a kernel reading strided rows: the logits as they lie
                result.audio = self.logits[:b, 2:].reshape(b, self.ids.n_vq, self.ids.audio_rows)
            elif self.fused:  # one copy into whole rows: the NumPy sampler then needs no other
                audio = self.audio_buf[:b]
                np.copyto(audio, self.logits[:b, 2:])
                result.audio = audio.reshape(b, self.ids.n_vq, self.ids.audio_rows)
            else:
                assert self.heads is not None and self.hidden is not None
                result.audio = self.heads(self.hidden[:b], self.audio_buf)
            self.profile.heads += time.perf_counter() - t2
        return result

    def _decode_run(self, run: np.ndarray, lend: bool = False) -> bool:
        """One backbone call with one row per running stream (``run``, ascending); outputs
        land in rows [0, B).

        llama.cpp splits a call over its per-sequence KV streams into one graph per run of
        consecutive sequence ids, and each graph reads all the weights again (on the
        ``deep`` model four rows in slots 0, 2, 4, 6 cost 52 ms, in slots 0-3 24 ms). So a
        call whose slots have gaps decodes a stand-in row in each slot between (see
        ``_stand_ins``): output nowhere, its KV cell removed after the call."""
        prof = self.profile
        b = run.size
        t0 = time.perf_counter()
        kv_pos = self.slots.kv_pos
        stand_ins = self._stand_ins(run)
        batch = run if stand_ins is None else self._slot_ids[run[0] : run[-1] + 1]
        n = batch.size
        if self._embed is not None:  # the slots' next rows, embedded
            self._slot_buf[:n] = batch
            self._embed(0, n)
        self.pos[:n] = kv_pos[batch]
        self.seq[:n] = batch
        if stand_ins is None:
            self.outf[:n] = 1
        else:  # a stand-in's row: the slot's last ids at its next position, no output
            self.outf[:n] = 0
            self.outf[run - run[0]] = 1
        t1 = time.perf_counter()
        try:
            self.backbone.decode_bound(n, not self.fused, 0, lend)
        except Exception as exc:
            log.exception("backbone step failed for %d streams", b)
            self._fail_slots(run, "backbone step failed", exc)
            return False
        finally:
            if stand_ins is not None:
                self._remove_stand_ins(stand_ins)
        kv_pos[run] += 1
        prof.embed += t1 - t0
        dt = time.perf_counter() - t1
        prof.backbone += dt
        if b == 1 and dt < prof.backbone_min_1row:
            prof.backbone_min_1row = dt
        return True

    def _stand_ins(self, run: np.ndarray) -> np.ndarray | None:
        """The slots between the first and last of ``run`` that are not in it, when a
        stand-in row in each makes the call one graph; None when there are none, or when
        the call would grow past ``max_batch_rows`` or attend over more cells: llama.cpp
        attends over the most cells any sequence of the graph holds (rounded up to 256),
        so a stand-in in a slot holding a longer context than any of ``run`` is left out."""
        if run.size < 2 or run[-1] - run[0] + 1 == run.size:
            return None
        between = self._slot_ids[run[0] : run[-1] + 1]
        limit = self.cfg.max_batch_rows
        if 0 < limit < between.size:
            return None
        gaps = between[np.isin(between, run, assume_unique=True, invert=True)]
        kv_pos = self.slots.kv_pos
        if int(kv_pos[gaps].max()) // KV_PAD > int(kv_pos[run].max()) // KV_PAD:
            return None
        return gaps

    def _remove_stand_ins(self, stand_ins: np.ndarray) -> None:
        """Take the stand-in rows' cells out of the KV cache (each slot's cells from its next
        position on: its own stream's, if any, stay)."""
        kv_pos = self.slots.kv_pos
        for slot in stand_ins.tolist():
            try:
                self.backbone.seq_rm(slot, int(kv_pos[slot]))
            except Exception:  # pragma: no cover - the slot is unusable then; keep the engine up
                log.exception("could not remove the stand-in row of slot %d", slot)

    def _prefill_piece(self, slot: int, n: int, out_row: int) -> bool:
        """Rows [fed, fed + n) of one prompt in one call; the last row is output to
        ``out_row`` unless it is -1."""
        s = self.slots.streams[slot]
        assert s is not None
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
            self._fail_slots([slot], "prompt prefill failed", exc)
            return False
        self.profile.prefill += time.perf_counter() - t0
        self.profile.prefill_rows += n
        s.fed += n
        s.req.stats.prefill_ticks += 1
        self.slots.kv_pos[slot] += n
        if s.fed == s.req.prompt.shape[0]:
            s.running = True
            s.req.stats.t_prefilled = time.monotonic()
            self.scheduler.prefilled(slot)
        return True

    def _load_prefix(self, slot: int, state: np.ndarray) -> None:
        s = self.slots.streams[slot]
        assert s is not None
        try:
            self.backbone.load_seq_state(slot, state)
        except Exception as exc:
            log.exception("loading a cached prompt prefix failed")
            self._fail_slots([slot], "loading the cached prompt prefix failed", exc)
            return
        s.fed = s.req.prefix_rows
        self.slots.kv_pos[slot] = s.fed
        s.req.stats.prefix_cached_rows = s.fed

    def _store_prefix(self, slot: int) -> None:
        s = self.slots.streams[slot]
        assert s is not None
        try:
            state = self.backbone.seq_state(slot)
        except Exception:  # the stream itself is fine; only the cache entry is lost
            log.exception("snapshot of a prompt prefix failed")
            self.prefix_cache.release(slot)
            return
        self.prefix_cache.store(s.req.prefix_key, slot, state)

    # -- update: sampling, state machines, frames -----------------------------------------
    def update(self, result: StepResult) -> None:
        """Sample the next row of every output stream, advance its state machine, and route
        the frames that became complete; a failure fails only these streams."""
        try:
            self._sample(result)
        except Exception as exc:
            log.exception("sampling failed for %d streams", result.slots.size)
            self._fail_slots(result.slots, "generation step failed", exc)

    def _sample(self, result: StepResult) -> None:
        prof = self.profile
        slots = result.slots
        b = slots.size
        assert result.audio is not None
        t3 = time.perf_counter()
        self._force_fixed(slots, b)
        self._slot_buf[:b] = slots  # the kernels read the step's slots from here
        self._step(0, b)
        out = self._out[:b]
        t4 = time.perf_counter()
        self.slots.steps[slots] += 1
        self.next_rows[slots] = out
        if self.slots.n_keep_rows:  # rare (checks against the official code): a loop is fine
            self._keep_rows(slots, out)
        tick_s = t4 - result.t_start
        self.tick_s += 0.1 * (tick_s - self.tick_s)
        self.slots.step_s[slots] += tick_s  # into each stream's stats as its chunks go out
        push = self._push
        push(0, b)
        self._route(slots, push.frames[:b], push.ready[:b], push.index[:b])
        prof.ticks += 1
        prof.rows += b
        prof.sampling += t4 - t3
        prof.other += time.perf_counter() - t4

    def _keep_rows(self, slots: np.ndarray, out: np.ndarray) -> None:
        for i in np.flatnonzero(self.slots.keep_rows[slots]).tolist():
            s = self.slots.streams[int(slots[i])]
            assert s is not None
            s.rows.append(out[i].copy())

    def _force_fixed(self, run: np.ndarray, b: int) -> None:
        if not self.slots.n_fixed:  # a plain int: after a decode every NumPy call runs cold
            return
        pair = self._step.pair_logits(b)  # where the step reads them: lent rows or self.logits
        fx = self.slots.fixed[run]
        st = self.slots.steps[run]
        on = fx >= 0
        pair[on & (st < fx - 1), 1] = _NEG_INF  # keep talking
        pair[on & (st >= fx - 1), 0] = _NEG_INF  # then end speech

    def _full_text_logits(self, i: int) -> np.ndarray:
        """Full text-head logits of output row ``i``: rare, only outside audio mode."""
        if self.heads is None or self.hidden is None:
            raise GenerationError("text mode needs the full text head, which the fused GGUF does not hold")
        return self.heads.text_logits(self.hidden[i])

    def _route(self, run: np.ndarray, frames: np.ndarray, ready: np.ndarray, index: np.ndarray) -> None:
        """Hand finished frames to the decode thread and close finished streams.

        All the step's frames go into the slot table at once; Python looks only at the
        streams that send a chunk or end this tick."""
        n_vq = self.ids.n_vq
        st = self.states
        tab = self.slots
        done = (
            st.is_stopping[run]
            | (st.delayed_length[run] == n_vq)  # last frame complete; next row is <|audio_end|>
            | (tab.steps[run] >= tab.max_new[run])
            | (tab.kv_pos[run] >= self.n_ctx_seq)
        )
        now = time.monotonic()
        got = np.flatnonzero(ready)
        if got.size == run.size:  # the usual tick: every stream completed a frame
            tab.add_pending(run, frames, index)
            send = done | self._due(run, now)
        else:
            tab.add_pending(run[got], frames[got], index[got])
            send = done.copy()
            send[got] |= self._due(run[got], now)
        out: list[DecodeJob] = []  # the tick's chunks, handed to the decode thread at once
        try:
            for i in np.flatnonzero(send).tolist():
                slot = int(run[i])
                if done[i]:
                    s = tab.streams[slot]
                    assert s is not None
                    s.req.stats.finish_reason = self._finish_reason(slot)
                    self._emit(slot, now, out, last=True)  # frees the slot before the last chunk goes out
                else:
                    self._emit(slot, now, out, last=False)
        finally:
            if out:
                self.decoder.submit_many(out)

    def _due(self, slots: np.ndarray, now: float) -> np.ndarray:
        """Which of ``slots`` (each just given a frame) send their new frames now? At the
        chunk target, or before a listener would run dry.

        A real-time listener started at the first chunk has ``slack`` seconds of
        audio left; waiting for a full chunk costs the remaining frames' ticks plus
        a decode, so send early when that would exhaust the slack.
        """
        tab = self.slots
        new = tab.pend_n[slots] - tab.warm[slots]
        target = self._chunk_arr[np.minimum(tab.chunk_index[slots], self._chunk_arr.size - 1)]
        missing = target - new
        slack = tab.t_first_emit[slots] + tab.frames_sent[slots] * FRAME_S - now
        late = slack < missing * self.tick_s + self.decode_margin_s
        due: np.ndarray = (new > 0) & ((missing <= 0) | late)
        return due

    def _emit(self, slot: int, now: float, out: list[DecodeJob], last: bool) -> None:
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
        if tab.frames_sent[slot] == 0 and n:
            tab.t_first_emit[slot] = now
        s.req.stats.frames += n
        rows = None
        if tab.keep_rows[slot]:
            rows = np.stack(s.rows) if s.rows else self._out[:0]
            s.rows = []
        job = DecodeJob(
            s.req.rid, s.req.sink, codes, int(tab.pending_first[slot]), int(tab.steps[slot]) - 1,
            is_last=last, tick=self.ticks, warm=warm, rows=rows,
        )
        if last:  # the slot and its KV cells are free before its listener hears the end
            self._free(slot, job)
            return
        out.append(job)
        tab.frames_sent[slot] += n
        tab.audio_due[slot] = tab.t_first_emit[slot] + tab.frames_sent[slot] * FRAME_S
        tab.chunk_index[slot] += 1

    def _finish_reason(self, slot: int) -> str:
        if self.states.is_stopping[slot]:
            return "stop"
        if self.states.delayed_length[slot] == self.ids.n_vq:
            return "audio_end"
        if self.slots.steps[slot] >= self.slots.max_new[slot]:
            return "max_new_tokens"
        return "context_full"
