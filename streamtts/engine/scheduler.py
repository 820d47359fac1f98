"""What one engine tick does: which streams step, which prompt pieces are fed.

:meth:`Scheduler.schedule` reads the slot table, the prefix cache and the clock
and returns a :class:`Plan`; it calls no backbone, so it is tested with made-up
streams and no threads. The engine thread carries the plan out
(``EngineCore.execute``) and feeds the outcome back (``EngineCore.update``).

Who steps: every prefilled stream, except streams paused by backpressure (their
consumer is more than ``max_buffered_s`` behind, resumed under
``resume_buffered_s``); while some stream waits for its first audio, streams
already more than ``step_slack_s`` ahead of a real-time listener (each row costs
tick time the newcomer's 32 steps wait for, and those streams have audio in
hand); and, above ``max_batch_rows``, all but the ones closest to running dry. A
session's next segment starts with its session's audio in hand (``ChunkPolicy.started``),
so it is no newcomer. ``Plan.first_audio`` tells the engine a stream waits for its first
audio (no thread-count probe then: engine/thread_tuner.py).

Prefill: each joining prompt, oldest first, in a partition that depends on the
prompt alone: its cacheable prefix (if any), then the rest, each cut in
``prefill_chunk`` pieces, one llama_decode per piece holding that sequence only.
llama.cpp's CPU flash attention rounds differently for different row counts,
and it splits a batch of unequal sequences into equal pieces, so shared calls or
budget-sized pieces would make a stream's output depend on who joined with it.
At most ``prefill_chunk`` rows are fed per tick. Without a prefix and with
prompts up to ``n_batch`` rows this is the official one-call prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config import EngineConfig
from .prefix_cache import PrefixCache
from .slot_table import SlotTable

NO_SLOTS = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class PrefillPiece:
    """Prompt rows ``[start, start + rows)`` of ``slot`` in one llama_decode."""

    slot: int
    start: int
    rows: int
    last: bool  # completes the prompt: its last row is output (the stream's first step)
    store_prefix: bool = False  # the prefix is complete after it: snapshot the sequence


@dataclass(slots=True)
class Plan:
    decode: np.ndarray = field(default_factory=lambda: NO_SLOTS)  # slots stepped, in row order
    loads: list[tuple[int, np.ndarray]] = field(default_factory=list)  # cached prefixes to load first
    prefill: list[PrefillPiece] = field(default_factory=list)
    first_audio: bool = False  # a stream stepped or joining waits for its first audio

    @property
    def empty(self) -> bool:
        return not (self.decode.size or self.loads or self.prefill)


class Scheduler:
    def __init__(
        self,
        cfg: EngineConfig,
        slots: SlotTable,
        prefix_cache: PrefixCache,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.slots = slots
        self.prefix_cache = prefix_cache
        self.clock = clock
        self.max_prefill = max(1, min(cfg.prefill_chunk, cfg.n_batch))
        self.joining: list[int] = []  # slots still prefilling, in admission order
        self._run_cache: np.ndarray | None = None
        self._paused: list[int] = []  # slots paused by backpressure
        self._newcomer = False  # a running stream waits for its first audio (the last _running)

    # -- bookkeeping the engine reports --------------------------------------------------
    def admitted(self, slot: int) -> None:
        self.joining.append(slot)
        self._run_cache = None

    def prefilled(self, slot: int) -> None:
        if slot in self.joining:
            self.joining.remove(slot)
        self._run_cache = None

    def released(self, slot: int) -> None:
        if slot in self.joining:
            self.joining.remove(slot)
        self.prefix_cache.release(slot)
        self._run_cache = None

    # -- the plan ------------------------------------------------------------------------
    def schedule(self) -> Plan:
        plan = Plan(decode=self._running())
        plan.first_audio = self._newcomer or (bool(self.joining) and self._joiner_waits())
        self._plan_prefill(plan)
        return plan

    def _joiner_waits(self) -> bool:
        """A stream still prefilling waits for its first audio (a session's next segment
        with its session's audio in hand does not)."""
        due = self.slots.audio_due
        return any(due[s] == -np.inf for s in self.joining)

    def _running(self) -> np.ndarray:
        if self._backpressure() or self._run_cache is None:
            self._run_cache = self._runnable()
        run = self._run_cache
        if run.size < 2:
            self._newcomer = bool(run.size) and bool(self.slots.audio_due[run[0]] == -np.inf)
            return run
        slack = self.slots.audio_due[run] - self.clock()  # audio in hand (-inf: none yet)
        self._newcomer = bool(np.isneginf(slack).any())
        ahead = self.cfg.step_slack_s
        if ahead > 0 and self._newcomer:
            keep = slack < ahead
            run, slack = run[keep], slack[keep]
        limit = self.cfg.max_batch_rows
        if 0 < limit < run.size:  # the ones closest to running dry
            run = np.sort(run[np.argpartition(slack, limit - 1)[:limit]])
        if run.size >= 2 and run[-1] - run[0] + 1 > run.size:
            # a slot between skipped costs as much as the stand-in row the engine decodes
            # there (EngineCore._decode_run): the runnable streams in between step too
            full = self._run_cache
            between = full[(full >= run[0]) & (full <= run[-1])]
            if between.size > run.size and not 0 < limit < between.size:
                run = between
        return run

    def running(self) -> int:
        """Streams prefilled: the ones a tick steps, those it skips while a new stream makes
        its first frame (``step_slack_s``) and those paused far ahead of their listeners."""
        return int(self.slots.active) - len(self.joining)

    def _runnable(self) -> np.ndarray:
        """The slots of the streams that are prefilled and not paused, ascending."""
        streams = self.slots.streams
        on = [i for i, s in enumerate(streams) if s is not None and s.running and not s.paused]
        return np.array(on, dtype=np.int64)

    def _backpressure(self) -> bool:
        """Pause the streams more than ``max_buffered_s`` ahead of their consumer, resume
        them under ``resume_buffered_s``; True when any changed.

        Buffered audio grows only when frames are sent (the consumer only takes), so a
        stepping stream's check can change nothing until its ``frames_sent`` moves: only
        those are checked (``bp_seen``), and the paused ones, each tick."""
        tab = self.slots
        hi, lo = self.cfg.max_buffered_s, self.cfg.resume_buffered_s
        changed = False
        for slot in list(self._paused) if self._paused else ():  # first: none is checked twice
            s = tab.streams[slot]
            if s is None or not s.paused:  # released (or given to a new stream) meanwhile
                self._paused.remove(slot)
            elif s.running and tab.buffered_s(slot) < lo:
                s.paused, changed = False, True
                self._paused.remove(slot)
                tab.bp_seen[slot] = -1  # checked again next tick, as one whose frames_sent moved
        if self._run_cache is None:
            self._run_cache = self._runnable()
        run = self._run_cache
        for slot in run[tab.frames_sent[run] != tab.bp_seen[run]].tolist():
            s = tab.streams[slot]
            if s is None or not s.running or s.paused:  # a cache out of date: rebuilt after
                continue
            tab.bp_seen[slot] = tab.frames_sent[slot]
            if tab.buffered_s(slot) > hi:
                s.paused, changed = True, True
                self._paused.append(slot)
        return changed

    def _plan_prefill(self, plan: Plan) -> None:
        budget = self.max_prefill
        cache = self.prefix_cache
        for slot in self.joining:
            s = self.slots.streams[slot]
            if s is None:
                continue
            req = s.req
            total = req.prompt.shape[0]
            fed = s.fed
            if fed == 0 and req.prefix_rows and cache.enabled:
                got = cache.lookup(req.prefix_key, slot, req.prefix_rows)
                if isinstance(got, str):
                    if got == "wait":
                        continue  # another stream computes this prefix; load it once stored
                else:
                    plan.loads.append((slot, got))
                    fed = req.prefix_rows
            while budget and fed < total:
                end = req.prefix_rows if fed < req.prefix_rows else total
                take = min(end - fed, self.max_prefill)
                if take > budget:
                    break
                plan.prefill.append(
                    PrefillPiece(
                        slot, fed, take, last=fed + take == total,
                        store_prefix=cache.enabled and fed + take == req.prefix_rows,
                    )
                )
                budget -= take
                fed += take
            if not budget:
                break
