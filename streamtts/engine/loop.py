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

Only this thread touches the backbone (backbone_calls.py makes its calls). The asyncio
side talks to it through a queue of typed commands (commands.py: submit / abort / stop) and
receives audio through each stream's sink; what a step's frames become is the chunk policy's
(chunk_policy.py). A stream enters a slot by :meth:`EngineCore.admit` and leaves it by
:meth:`EngineCore.free`, which reach every per-slot structure.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..config import EngineConfig
from ..core.frames import FrameAssembler
from ..core.tokens import TokenIds
from ..errors import EngineClosedError, GenerationError, NonFiniteLogitsError, OverloadedError
from ..kernels import Kernels, SpecDelayStep, SpecFramePush, SpecStepEmbed
from ..model.tables import AudioHeads, Embedder
from ..request import PreparedRequest
from .backbone_calls import BackboneCalls, BackboneLike, StepProfile
from .capacity import Capacity
from .chunk_policy import ChunkPolicy
from .commands import Abort, Command, EndSession, Stop, Submit
from .decoding import DecodeJob, DecodeWorker
from .non_finite import NonFiniteGuard
from .prefix_cache import PrefixCache
from .scheduler import NO_SLOTS, Plan, Scheduler
from .slot_table import SlotTable
from .waiting import WaitingQueue

log = logging.getLogger(__name__)

__all__ = ["BackboneLike", "EngineCore", "StepProfile", "StepResult"]

_NEG_INF = np.float32(-np.inf)
# Every stream paused ahead of its listener: the loop looks again this often (a stream resumes
# with resume_buffered_s of audio in hand, so a few ms late costs nothing) instead of spinning
# a core and the GIL until a listener catches up.
PAUSED_POLL_S = 0.005
# Idle with requests waiting: their deadlines are looked at this often.
_IDLE_POLL_S = 0.5


@dataclass(slots=True)
class StepResult:
    """What ``execute`` hands ``update``: output rows [0, len(slots)) belong to ``slots``
    (their audio logits lie in the buffers the step kernels are bound to)."""

    slots: np.ndarray
    t_start: float
    prompts_s: float = 0.0  # of it, feeding prompts (prefill pieces, cached prefixes loaded, stored)


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
        self.heads = heads
        self.decoder = decoder
        self.fused = fused_heads
        cap = self.capacity = cfg.max_streams
        k, a = ids.n_vq, ids.audio_rows
        self.n_ctx_seq = backbone.n_ctx_seq
        # new frames wait at most for the largest chunk, behind at most n_vq - 1 warm-up ones
        # (a continuation's prefix frames that its first steps complete)
        self.slots = SlotTable(cap, k, max(cfg.chunk_frames) + k - 1)
        self.kernels = kernels
        self.states = kernels.delay_states(cap, ids)
        self.assembler = FrameAssembler(cap, k, ids.audio_pad_code)
        self.prefix_cache = PrefixCache(cfg.prefix_cache_mib << 20)
        self.scheduler = Scheduler(cfg, self.slots, self.prefix_cache)
        self.profile = StepProfile()
        calls = self.calls = BackboneCalls(
            cfg, backbone, self.slots, self.scheduler, self.prefix_cache, self.profile, self._fail_slots,
            n_cols=2 + (k * a if fused_heads else 0), hidden=not fused_heads, n_vq=k,
        )  # fmt: skip
        self.logits, self.hidden = calls.logits, calls.hidden
        # the heads' output, or (fused heads) whole rows copied when no kernel reads them strided
        self.audio_in_place = fused_heads and kernels.reads_strided_audio
        self.audio_buf = np.zeros((0 if self.audio_in_place else 2 * cap, k * a), dtype=np.float32)
        # the copy of a decode's outputs runs on the tick's threads too
        if kernels.pool is not None:
            backbone.set_tick_pool(kernels.pool.handle)
        audio_base = self.logits[:, 2:] if self.audio_in_place else self.audio_buf
        self._out = np.zeros((2 * cap, 1 + k), dtype=np.int64)
        # the step's kernels, bound once to these buffers: a step of B streams has their slot
        # numbers in slot_buf[:B] and its logits and rows in the first B rows of the others
        audio_all = audio_base.reshape(2 * cap, k, a)  # a view: the last axis is contiguous
        assert audio_all.size == 0 or np.shares_memory(audio_all, audio_base)
        self._slot_buf = calls.slot_buf
        self._step = kernels.bind_delay_step(
            SpecDelayStep(self.states, self._slot_buf, self.logits[:, :2], audio_all, self._out, self._full_text_logits)
        )
        # A step with no prompt piece reads its logits where the backbone left them (fused
        # heads: 17 MB a tick at 128 streams not copied); a plain bool, so a test can turn it off.
        self.lend_logits = self.audio_in_place and self._step.reads_lent
        self._guard = NonFiniteGuard(self._step, 2 * cap)
        self._lent = 0  # the address the delay step reads from, 0: self.logits
        self.lent_steps = 0  # steps that read lent rows (a plain int, for tests and --profile)
        self._push = kernels.bind_frame_push(SpecFramePush(self.assembler, self._slot_buf, self._out[:, 1:]))
        self.next_rows = calls.next_rows
        if embedder is not None:
            calls.embed = kernels.bind_step_embed(SpecStepEmbed(embedder, self._slot_buf, self.next_rows, calls.embd))
        self._empty = np.zeros((0, k), dtype=np.int64)
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="streamtts-engine", daemon=True)
        self._stopping = False
        self.ticks = 0  # engine ticks so far (prefill-only ticks included)
        self._all_paused = False  # the last tick had nothing to run: every stream paused
        # admission by measured capacity (cfg.admission == "capacity"); ticks timed either way
        self.admission = Capacity(cap, cfg.realtime_margin, cfg.first_audio_deadline_s)
        self.waiting = WaitingQueue(cfg, self.slots, self.admission, self._reject)
        self.policy = ChunkPolicy(cfg.chunk_frames, self.slots, self.states, self.n_ctx_seq, decoder.submit_many, self.free)

    # -- front-end API (any thread) -------------------------------------------------------
    def start(self) -> None:
        if self.cfg.gil_switch_ms > 0:
            sys.setswitchinterval(self.cfg.gil_switch_ms / 1000)  # see EngineConfig.gil_switch_ms
        self._thread.start()

    def submit(self, req: PreparedRequest) -> None:
        if self._stopping:
            raise EngineClosedError("engine is closed")
        self._commands.put(Submit(req))

    def abort(self, rid: int) -> None:
        self._commands.put(Abort(rid))

    def end_session(self, session: int) -> None:
        self._commands.put(EndSession(session))

    def stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._commands.put(Stop())
        if self._thread.is_alive():
            self._thread.join()
        if self.heads is not None:
            self.heads.close()
        if self.kernels.pool is not None:
            self.backbone.set_tick_pool(None)  # before the pool's threads stop
        self.kernels.close()

    @property
    def active_streams(self) -> int:
        return self.slots.active

    @property
    def queued_streams(self) -> int:
        return len(self.waiting)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        cpu = self.calls.pin_engine_thread()  # this thread decodes from now on
        if cpu is not None:
            log.debug("engine thread pinned to CPU %d, llama.cpp's workers to others", cpu)
        try:
            while True:
                if not self._drain_commands(self._wait_s()):
                    break
                self._admit_waiting()
                self.waiting.expire()  # after: one that can start now does
                if self.slots.active:
                    self.step()
        except BaseException:  # pragma: no cover - a bug; make it loud and fail every stream
            log.exception("engine loop crashed")
            self._fail_all(GenerationError("engine loop crashed; see the log"))
            raise
        finally:
            self._fail_all(EngineClosedError("engine closed"))

    def _wait_s(self) -> float | None:
        """How long the loop may wait for a command first: until one comes when idle (its
        waiting requests' deadlines looked at meanwhile), a moment when every stream is
        paused, not at all while streams step."""
        if self.slots.active == 0:
            return _IDLE_POLL_S if self.waiting else None
        return PAUSED_POLL_S if self._all_paused else 0.0

    def step(self) -> None:
        """One tick: ``schedule -> execute -> update``."""
        self.ticks += 1
        plan = self.scheduler.schedule()
        self._all_paused = plan.empty
        if plan.empty:
            # every stream paused ahead of its listener: nothing is behind
            self.admission.untimed(time.perf_counter(), self.slots.active)
            return
        t0 = time.perf_counter()
        # the room sessions hold between their segments counts as streams running: admission
        # counts it, and counting only the streams running, a tiny-model server whose
        # sessions held 4 had 1-2 running and its limit never rose past 4
        running = max(self.scheduler.running(), self.waiting.demand)
        self.admission.tick_started(int(plan.decode.size), t0, running)
        with self.decoder.turns.backbone():  # CPU codec: not while the codec's call runs
            self.profile.codec_wait += time.perf_counter() - t0
            result = self.execute(plan)
        self.admission.fed_prompts(result.prompts_s)
        if result.slots.size:
            self.update(result)
            if not (plan.prefill or plan.loads):  # a steady tick: what N streams cost
                self.admission.observe(int(plan.decode.size), time.perf_counter() - t0)
        if not self.slots.active:
            self.admission.untimed(time.perf_counter())  # the loop waits for work next

    def _drain_commands(self, wait_s: float | None) -> bool:
        """Apply the commands queued, having waited up to ``wait_s`` for the first (None: as
        long as it takes); False on Stop."""
        if wait_s == 0.0 and self._commands.empty():  # the usual tick: no exception raised and caught
            return True
        block = wait_s != 0.0
        while True:
            try:
                if block:
                    cmd = self._commands.get(timeout=wait_s)
                    block = False
                else:
                    cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
            if isinstance(cmd, Submit):
                self.waiting.enqueue(cmd.req)
            elif isinstance(cmd, Abort):
                self._abort(cmd.rid)
            elif isinstance(cmd, EndSession):
                self.waiting.end_session(cmd.session)
                self.policy.end_session(cmd.session)
            else:
                return False

    def refusal(self, reserve: int = 0) -> OverloadedError | None:
        """By capacity, the error that would refuse a new stream now (read by the front end
        too, before it prepares a request; ``reserve``: the streams its session will run
        beside it); None when it may start or wait."""
        return self.waiting.refusal(reserve)

    def _admit_waiting(self) -> None:
        for slot, req in self.waiting.admissible():
            self.admit(slot, req)

    def _reject(self, req: PreparedRequest, err: BaseException) -> None:
        self.decoder.submit(DecodeJob(req.rid, req.sink, self._empty, 0, 0, error=err))

    # -- a slot's lifecycle: admit and free reach every per-slot structure -------------------
    def admit(self, slot: int, req: PreparedRequest) -> None:
        """Start ``req`` in the free ``slot``: its row in the slot table, its delay state, its
        frame assembler, a continuation's prefix frames, and the scheduler's prefill queue."""
        s = self.slots.reset(slot, req, self.policy.chunks_for(req))
        req.stats.t_admitted = time.monotonic()
        self.policy.started(slot, req.stats.t_admitted)
        req.stats.prompt_rows = req.prompt.shape[0]
        self.states.reset(slot, req.prompt, req.sampling, req.seed)
        self.assembler.reset(slot)
        if req.audio_prefix_rows:
            # A continuation: the prompt ends in an audio prefix (T rows in the delay layout).
            # Its rows go into the frame assembler as if generated, so the first steps complete
            # the prefix's last frames; the frames it completes already are pending as warm-up:
            # the codec decodes them for its state and their samples are not sent.
            t = req.audio_prefix_rows
            known = self.assembler.seed(slot, req.prompt[-t:, 1:])
            known = known[np.any(known != self.ids.audio_pad_code, axis=1)]  # as a push's `ready`
            s.lead = known if known.shape[0] else None
            self.slots.prefix_frames[slot] = t
        self.scheduler.admitted(slot)

    def free(self, slot: int, final: DecodeJob | None = None) -> None:
        """Empty a slot (its row, KV cells, prefix claims, place in the prefill queue) and
        hand ``final`` to the decode thread."""
        held = self.slots.streams[slot]
        demand = self.waiting.demand
        if held is not None:  # its step counts, as at each chunk (an abort or failure ends here)
            st = held.req.stats
            st.steps = int(self.slots.steps[slot])
            st.step_s = float(self.slots.step_s[slot])
            self.admission.made(st.steps, st.frames, st.prefill_s)
        try:  # the cells first: a slot that shows free holds none
            self.backbone.seq_rm(slot)
        except Exception:  # pragma: no cover - the slot is unusable then; keep the engine up
            log.exception("could not free KV cache of slot %d", slot)
        s = self.slots.release(slot)
        self.scheduler.released(slot)
        if s is not None:
            last = self.waiting.ended(s.req)
            if s.req.prefix_session and (last or s.req.stats.finish_reason in ("cancelled", "error")):
                # the session is over (or cut): its own voice's snapshot is of no further use
                self.prefix_cache.drop_session(s.req.prefix_session)
        if s is not None and self.waiting.demand < demand and not self.waiting.next_is_priority:
            # room a new stream can have (not a segment ending while its session holds the
            # room for the next, nor one a session's next segment waiting takes first): the
            # rate of these is what a new stream's wait is estimated from
            self.admission.finished()
        if s is not None and final is not None:
            self.decoder.submit(final)

    def _abort(self, rid: int) -> None:
        slot = self.slots.find(rid)
        if slot is not None:
            s = self.slots.streams[slot]
            assert s is not None
            s.req.stats.finish_reason = "cancelled"
            self.free(slot, DecodeJob(rid, s.req.sink, self._empty, 0, 0, drop=True))
            return
        self.waiting.remove(rid)

    def _fail_all(self, err: BaseException) -> None:
        for i, s in enumerate(self.slots.streams):
            if s is not None:
                self.free(i, DecodeJob(s.req.rid, s.req.sink, self._empty, 0, 0, error=err))
        self.waiting.fail_all(err)

    def _fail_slots(self, slots: np.ndarray | list[int], what: str, exc: BaseException) -> None:
        for slot in np.asarray(slots).tolist():
            s = self.slots.streams[slot]
            if s is not None:
                err = GenerationError(f"{what}: {exc}")
                err.__cause__ = exc
                s.req.stats.finish_reason = "error"
                self.free(slot, DecodeJob(s.req.rid, s.req.sink, self._empty, 0, 0, error=err))

    # -- execute: the backbone and the heads -----------------------------------------------
    def execute(self, plan: Plan) -> StepResult:
        """Decode one row per stepped stream, then the planned prompt pieces (their last
        rows are output after the stepped ones), then the audio heads of all output rows."""
        t0 = time.perf_counter()
        run = plan.decode
        if self.calls.tuner is not None:  # no thread-count probe in a newcomer's first steps
            self.calls.tuner.hold = plan.first_audio
        # lent rows live until the next decode: none while a prompt piece decodes after the run
        lend = self.lend_logits and not plan.prefill and not plan.loads
        lent = 0
        if run.size:
            if not self.calls.decode_run(run, lend):
                run = NO_SLOTS
            elif lend:
                lent = self.backbone.lent_logits
        if lent != self._lent:
            self._step.read_logits_at(lent)
            self._lent = lent
        self.lent_steps += lent != 0
        t1 = time.perf_counter()
        fin = self.calls.prompts(plan, run.size)
        prompts_s = time.perf_counter() - t1
        slots = run if not fin else np.concatenate([run, np.asarray(fin, dtype=np.int64)])
        if slots.size and not self.audio_in_place:  # else a kernel reads the logits strided as they lie
            t2 = time.perf_counter()
            b = slots.size
            if self.fused:  # one copy into whole rows: the NumPy sampler then needs no other
                np.copyto(self.audio_buf[:b], self.logits[:b, 2:])
            else:
                assert self.heads is not None and self.hidden is not None
                self.heads(self.hidden[:b], self.audio_buf)
            self.profile.heads += time.perf_counter() - t2
        return StepResult(slots, t0, prompts_s)

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
        t3 = time.perf_counter()
        bad = self._guard.neutralise(b)
        self._force_fixed(slots, b)
        self._slot_buf[:b] = slots  # the kernels read the step's slots from here
        self._step(0, b)
        if bad is not None:  # rare: those streams end, the others' rows go on
            self._fail_slots(slots[bad], "generation step failed", NonFiniteLogitsError(slots[bad], "slots"))
            b = NonFiniteGuard.drop(self._slot_buf, self._out, b, bad)
            slots = self._slot_buf[:b].copy()
        out = self._out[:b]
        t4 = time.perf_counter()
        self.slots.steps[slots] += 1
        self.next_rows[slots] = out
        if self.slots.n_keep_rows:  # rare (checks against the official code): a loop is fine
            self._keep_rows(slots, out)
        tick_s = t4 - result.t_start
        self.policy.observe_tick(tick_s)
        self.slots.step_s[slots] += tick_s  # into each stream's stats as its chunks go out
        push = self._push
        push(0, b)
        self.policy.route(slots, push.frames[:b], push.ready[:b], push.index[:b], time.monotonic(), self.ticks)
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
