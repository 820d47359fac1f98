"""The backbone calls a tick makes, on buffers bound once: the step's one decode (with
stand-in rows between its slots), the joining prompts' pieces, and cached prefixes loaded
and stored. The engine thread alone calls these (loop.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..config import EngineConfig
from ..model.backbone import KV_PAD, BackboneParams
from .prefix_cache import PrefixCache
from .scheduler import Plan, Scheduler
from .slot_table import SlotTable
from .thread_tuner import ThreadTuner

log = logging.getLogger(__name__)

__all__ = ["BackboneCalls", "BackboneFactory", "BackboneLike", "StepProfile", "ThreadedBackbone"]


class BackboneLike(Protocol):
    """What the loop needs from a backbone (model/backbone.py's, or bench's zero-cost stand-in)."""

    n_embd: int
    n_ctx_seq: int
    n_vocab: int  # rows of the GGUF output layer

    def set_logit_columns(self, cols: np.ndarray | None) -> None: ...

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

    def set_tick_pool(self, pool: int | None) -> None: ...

    def seq_rm(self, seq: int, start: int = 0) -> None: ...

    def seq_state(self, seq: int) -> np.ndarray: ...

    def load_seq_state(self, seq: int, state: np.ndarray) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class ThreadedBackbone(Protocol):
    """A backbone whose decodes' thread count may change between decodes (model/backbone.py's)."""

    n_threads_max: int
    cpu_decodes: bool  # the layers run on the CPU (else its threads do little of a decode)

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None: ...

    def pin_caller(self, on: bool = True) -> int | None: ...


# what puts a stand-in in llama.cpp's place (tests; `streamtts bench --null-backbone`)
BackboneFactory = Callable[[BackboneParams], BackboneLike]


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


# a failed call: (slots, what failed, the error) -> those streams end with a GenerationError
FailSlots = Callable[[np.ndarray | list[int], str, BaseException], None]


class BackboneCalls:
    """The backbone and the buffers bound to it (the hot path allocates nothing).

    ``slot_buf[:B]`` holds a step's slot numbers (the kernels read them there) and
    ``next_rows[slot]`` each slot's next input row (the step embedding reads it)."""

    def __init__(
        self,
        cfg: EngineConfig,
        backbone: BackboneLike,
        slots: SlotTable,
        scheduler: Scheduler,
        prefix_cache: PrefixCache,
        profile: StepProfile,
        fail: FailSlots,
        *,
        n_cols: int,
        hidden: bool,
        n_vq: int,
    ) -> None:
        self.cfg = cfg
        self.backbone = backbone
        self.slots = slots
        self.scheduler = scheduler
        self.prefix_cache = prefix_cache
        self.profile = profile
        self._fail = fail
        cap = cfg.max_streams
        rows_max = max(cfg.n_batch, cap)
        h = backbone.n_embd
        self.embd = np.zeros((rows_max, h), dtype=np.float32)
        self.pos = np.zeros(rows_max, dtype=np.int32)
        self.seq = np.zeros(rows_max, dtype=np.int32)
        self.outf = np.zeros(rows_max, dtype=np.int8)
        # Output rows: one per running stream plus one per prompt completed this tick.
        self.logits = np.zeros((2 * cap, n_cols), dtype=np.float32)
        self.hidden = np.zeros((2 * cap, h), dtype=np.float32) if hidden else None
        backbone.bind(self.embd, self.pos, self.seq, self.outf, self.hidden, self.logits)
        self.want_hidden = hidden
        self.slot_buf = np.zeros(2 * cap, dtype=np.int64)
        self.next_rows = np.zeros((cap, 1 + n_vq), dtype=np.int64)
        self.embed: Callable[[int, int], None] | None = None  # the step embedding, bound by the loop
        self._arange = np.arange(rows_max, dtype=np.int32)
        self._slot_ids = np.arange(cap, dtype=np.int64)
        # automatic threads on the CPU: each decode's count chosen from measured decodes
        self.tuner: ThreadTuner | None = None
        self._threaded: ThreadedBackbone | None = None
        self._threads = 0  # the count the backbone decodes on now (with a tuner)
        if cfg.n_threads == 0 and isinstance(backbone, ThreadedBackbone) and backbone.cpu_decodes:
            tuner = ThreadTuner(backbone.n_threads_max)
            if tuner.active:
                self.tuner, self._threaded = tuner, backbone
                self._threads = backbone.n_threads_max

    def _decode(self, n: int, want_hidden: bool, out_offset: int = 0, lend: bool = False) -> None:
        """One llama_decode of the bound rows [0, n), on the thread count the tuner chose."""
        tuner = self.tuner
        if tuner is None:
            self.backbone.decode_bound(n, want_hidden, out_offset, lend)
            return
        k = tuner.threads(n)
        if k != self._threads:
            assert self._threaded is not None
            self._threaded.set_threads(k)
            if (k > 1) != (self._threads > 1):
                self._threaded.pin_caller(k > 1)
            self._threads = k
        t0 = time.perf_counter()
        self.backbone.decode_bound(n, want_hidden, out_offset, lend)
        tuner.observe(n, k, time.perf_counter() - t0)

    def pin_engine_thread(self) -> int | None:
        """Called by the thread that decodes, once: with ``pin_threads`` it keeps the CPU
        llama.cpp's pinned workers left for it while decodes use 2+ threads (a worker woken
        onto its core would wait there while another core idles); on one thread it may run
        anywhere (a busy neighbour may hold that CPU). The CPU, or None when not pinned."""
        backbone = self.backbone
        if not isinstance(backbone, ThreadedBackbone):
            return None
        threads = self._threads if self.tuner is not None else backbone.n_threads_max
        return backbone.pin_caller() if threads > 1 else None

    # -- the step --------------------------------------------------------------------------
    def decode_run(self, run: np.ndarray, lend: bool = False) -> bool:
        """One backbone call with one row per running stream (``run``, ascending); outputs
        land in rows [0, B).

        llama.cpp splits a call over its per-sequence KV streams into one graph per run of
        consecutive sequence ids, and each graph reads all the weights again (on the
        ``deep`` model four rows in slots 0, 2, 4, 6 cost 52 ms, in slots 0-3 24 ms). So a
        call whose slots have gaps decodes a stand-in row in each slot between (see
        ``stand_ins``): output nowhere, its KV cell removed after the call."""
        prof = self.profile
        b = run.size
        t0 = time.perf_counter()
        kv_pos = self.slots.kv_pos
        stand_ins = self.stand_ins(run)
        batch = run if stand_ins is None else self._slot_ids[run[0] : run[-1] + 1]
        n = batch.size
        if self.embed is not None:  # the slots' next rows, embedded
            self.slot_buf[:n] = batch
            self.embed(0, n)
        self.pos[:n] = kv_pos[batch]
        self.seq[:n] = batch
        if stand_ins is None:
            self.outf[:n] = 1
        else:  # a stand-in's row: the slot's last ids at its next position, no output
            self.outf[:n] = 0
            self.outf[run - run[0]] = 1
        t1 = time.perf_counter()
        try:
            self._decode(n, self.want_hidden, 0, lend)
        except Exception as exc:
            log.exception("backbone step failed for %d streams", b)
            self._fail(run, "backbone step failed", exc)
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

    def stand_ins(self, run: np.ndarray) -> np.ndarray | None:
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

    # -- joining prompts -------------------------------------------------------------------
    def prompts(self, plan: Plan, first_row: int) -> list[int]:
        """The plan's cached prefixes and prompt pieces; the slots whose prompt is complete,
        their last rows output from ``first_row`` on, in order."""
        for slot, state in plan.loads:
            self._load_prefix(slot, state)
        fin: list[int] = []
        for piece in plan.prefill:
            s = self.slots.streams[piece.slot]
            if s is None or s.fed != piece.start:  # failed or freed earlier in this tick
                continue
            out_row = first_row + len(fin) if piece.last else -1
            if self._prefill_piece(piece.slot, piece.rows, out_row):
                if piece.store_prefix:
                    self._store_prefix(piece.slot)
                if piece.last:
                    fin.append(piece.slot)
        return fin

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
            self._decode(n, out_row >= 0 and self.want_hidden, max(out_row, 0))
        except Exception as exc:
            log.exception("prefill failed")
            self._fail([slot], "prompt prefill failed", exc)
            return False
        dt = time.perf_counter() - t0
        self.profile.prefill += dt
        self.profile.prefill_rows += n
        s.fed += n
        s.req.stats.prefill_ticks += 1
        s.req.stats.prefill_s += dt
        self.slots.kv_pos[slot] += n
        if s.fed == s.req.prompt.shape[0]:
            s.running = True
            s.req.stats.t_prefilled = time.monotonic()
            self.scheduler.prefilled(slot)
        return True

    def _load_prefix(self, slot: int, state: np.ndarray) -> None:
        s = self.slots.streams[slot]
        assert s is not None
        t0 = time.perf_counter()
        try:
            self.backbone.load_seq_state(slot, state)
        except Exception as exc:
            log.exception("loading a cached prompt prefix failed")
            self._fail([slot], "loading the cached prompt prefix failed", exc)
            return
        s.req.stats.prefill_s += time.perf_counter() - t0
        s.fed = s.req.prefix_rows
        self.slots.kv_pos[slot] = s.fed
        s.req.stats.prefix_cached_rows = s.fed

    def _store_prefix(self, slot: int) -> None:
        s = self.slots.streams[slot]
        assert s is not None
        t0 = time.perf_counter()
        try:
            state = self.backbone.seq_state(slot)
        except Exception:  # the stream itself is fine; only the cache entry is lost
            log.exception("snapshot of a prompt prefix failed")
            self.prefix_cache.release(slot)
            return
        self.prefix_cache.store(s.req.prefix_key, slot, state, session=s.req.prefix_session)
        s.req.stats.prefill_s += time.perf_counter() - t0
