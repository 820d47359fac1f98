"""Admission by measured capacity: how many streams the engine steps in real time.

A tick steps every running stream once, and a step completes a frame (80 ms of audio)
except a segment's first 32 or so (MOSS-TTS-Delay's 32 codebooks are one step apart), so
the streams stay ahead of real-time listeners while a tick takes less than a frame times
the share of steps that complete one (``share``: over the steps of the streams that ended
lately, about the last 2000; about 0.58 for sentences of 3.5 s, near 1 for long text).
Counting a frame a step, the mid demo model on 2 cores admitted 4-5 streams of sentences
whose sessions then kept only about 2 s ahead of their listeners, and a new stream's first
audio took 3.1 times its unloaded time (p95). Feeding a prompt stalls every stream, so a
tick of ``n`` streams also costs ``n`` times the prompt seconds per step of the streams
that ended lately (``prompt_s``). The engine times its own
ticks (``observe``: the streams a tick stepped and its wall time, codec turns included)
and keeps a running average per count of streams; counts not seen yet, or not stepped
for a minute (``_STALE_S``), are read off a straight line through the counts seen lately
(one count seen: in proportion to it, the pessimistic guess, which the next admitted
stream then measures). Nothing is set per
machine or model.

A tick's own time does not count what the machine did between ticks: on 2 cores the
server's event loop and the codec's thread take the GIL and the cores from the engine's
thread, and under load whole seconds passed at a tenth of the usual tick rate while the
estimate (each tick clipped to twice the average) hardly moved. So the engine also judges
its pace over windows of about a second of ticks, or of a second of wall time holding at
least ``_WINDOW_TICKS`` ticks (the tiny demo model's streams spend most of their time paused
far ahead of their listeners: a second of its 1 ms ticks took a minute to gather at light
load, and meanwhile the slow start's limit refused 6 to 13 of 38 sessions arriving in a
minute) (``tick_started``: ticks timed start to start, all of that counted but the loop's own
waits and the time spent feeding prompts, which ``prompt_s`` counts instead: one session's
voice prefix, 550 ms once, put its window behind and the limit fell to one stream). A window
whose ticks came slower than the margin allows lowers a limit on the capacity to three
quarters of the streams it stepped; each window in time with about as many streams as the
limit raises it by half a stream (streams running that a tick skipped, being far enough
ahead, count too when stepping them as well would still have been in time by the estimate).
The limit starts low (two streams) and doubles with each window in time until a first
window falls behind, as TCP's slow start does: a fresh server admitted up to the estimate at
once, and the streams admitted before the first slow window lowered the limit stuttered
together (measured: C100 92 % at twice the load on the tiny demo model); doubling still
reaches 64 in five seconds. Either step is taken only as far as the window's ticks, plus the
estimate's cost of the streams added, would stay in time (else half a stream, else none).
(Timing ticks start to start for the estimate itself was tried: once the estimate fell,
everything beyond it was refused, no tick at a higher count was seen again, and it never
rose.)

``streams()``, the capacity, is the most streams whose estimated tick, with their prompts'
share, plus ``margin`` of it still fits in that budget, and no more than that limit (at least one: a machine too slow
for one stream in real time serves one). A new stream is admitted only below it and below ``max_streams``, the hard
cap. One that cannot be admitted may wait only while its first audio can still come
within ``deadline_s``; the wait is estimated from the measured rate at which streams
finish (``wait_s``), and a request whose wait is beyond it is refused at once, with that
estimate as its Retry-After (and one already waiting is refused as soon as the estimate,
counted from when it came, runs past the deadline: the capacity fell under it).

Pure bookkeeping with an injectable clock: the engine thread calls it (no locks: the
server reads its numbers for metrics, a stale float at worst).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ..constants import FRAME_S

__all__ = ["Capacity"]

log = logging.getLogger(__name__)

_ALPHA = 0.1  # weight of a new tick in its count's running average
_TRUSTED = 20  # ticks after which a count's own average is used rather than the line
_FIRST = 3  # a count's first ticks: the fastest of them starts its average
_FINISHES = 32  # stream ends the finish rate is measured over
_FINISH_WINDOW_S = 120.0  # ... within this many seconds
_WINDOW_S = 1.0  # the engine's pace is judged over windows of about this many seconds of ticks
_WINDOW_TICKS = 32  # ... or of as many seconds of wall time, holding at least this many ticks
_BACKOFF = 0.75  # a window behind: the limit falls to this share of the streams it stepped
_RECOVER = 0.5  # a window in time: the limit rises by this many streams
_START = 2.0  # the limit of a fresh engine (slow start) ...
_START_GROWTH = 2.0  # ... times this a window in time, until a window falls behind
_SHARE_ROWS = 2000.0  # the share of steps that complete a frame: over the last streams' steps
_SHARE_PRIOR = 64.0  # ... starting as this many that each did (the budget of a frame a step)
_SHARE_MIN = 0.1
_STALE_S = 60.0  # a count of streams not stepped for this long is read off the line instead


class Capacity:
    _rows: float
    _frames: float
    _prompt_s: float

    def __init__(
        self,
        max_streams: int,
        margin: float,
        deadline_s: float,
        frame_s: float = FRAME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_streams = max_streams
        self.margin = margin
        self.deadline_s = deadline_s
        self.frame_s = frame_s
        self._clock = clock
        self.tick_s = np.zeros(max_streams + 1)  # running average per count of streams stepped
        self.seen = np.zeros(max_streams + 1, dtype=np.int64)  # ticks observed per count
        self.last_seen = np.full(max_streams + 1, -np.inf)  # when each count was last observed
        self._finishes: deque[float] = deque(maxlen=_FINISHES)
        self._capacity: int | None = None  # cached; None: recompute
        self.limit = min(float(max_streams), _START)  # from the windows' pace (see above)
        self._forget_made()
        self._tick_prompts = 0.0  # of the tick under way, seconds feeding prompts
        self.slow_start = True  # no window has fallen behind yet
        self.windows_behind = 0  # windows whose ticks came slower than the margin allows
        # the open window: [ticks, streams stepped, seconds of ticks start to start, the most
        # streams all paused ahead of their listeners at once meanwhile, streams running,
        # when it opened]
        self._win: list[float] | None = None
        self._tick_at: float | None = None  # when the tick under way started (None: waiting)
        self._last_streams = 0  # the streams the tick under way steps
        self._last_running = 0  # ... and the streams running then, stepped or not
        # decisions so far (read by the server's metrics)
        self.admitted = 0
        self.queued = 0
        self.refused = 0
        self.refused_early = 0  # by the front end, before preparing (its thread's own counter)

    # -- what the engine measures ----------------------------------------------------------
    def observe(self, streams: int, tick_s: float) -> None:
        """A tick stepped ``streams`` streams (no prompt fed) in ``tick_s`` seconds."""
        if not 1 <= streams <= self.max_streams:
            return
        seen, avg = self.seen[streams], self.tick_s[streams]
        if seen < _FIRST:
            # the first ticks of a count: the fastest of them (a first tick runs on cold caches,
            # or the process was descheduled meanwhile)
            self.tick_s[streams] = tick_s if seen == 0 else min(avg, tick_s)
        else:
            # a tick far off the average moves it at most by a factor of 2 per tick's weight:
            # a stall of the machine is not the engine's cost, a lasting slowdown still shows
            self.tick_s[streams] += _ALPHA * (min(max(tick_s, avg / 2), 2 * avg) - avg)
        self.seen[streams] += 1
        self.last_seen[streams] = self._clock()
        self._capacity = None

    def made(self, steps: int, frames: int, prompt_s: float = 0.0) -> None:
        """A stream ended, having taken ``steps`` steps that completed ``frames`` frames,
        its prompt fed in ``prompt_s`` seconds.

        Counted per stream over its life, not per tick: a tick steps the streams that need
        frames most (while a new stream makes its first frame, the ones well ahead of their
        listeners skip; those far ahead pause), so the ticks' rows are mostly segments'
        first steps. Counted so, the share came out far under the streams' own, and the tiny
        demo model's capacity fell to 2-3 streams at twice its load, where 9 had kept time."""
        if steps <= 0:
            return
        keep = math.exp(-steps / _SHARE_ROWS)
        self._rows = self._rows * keep + steps
        self._frames = self._frames * keep + min(frames, steps)
        self._prompt_s = self._prompt_s * keep + max(0.0, prompt_s)
        self._capacity = None

    def fed_prompts(self, seconds: float) -> None:
        """The tick under way spent ``seconds`` feeding prompts: a window does not count them
        (``prompt_s`` spreads what prompts cost over the steps)."""
        self._tick_prompts += seconds

    @property
    def prompt_s(self) -> float:
        """Seconds spent feeding prompts per stream-step, lately (a stream's prompt is fed
        once; every stream waits meanwhile, so a tick of ``n`` streams costs ``n`` times it
        on top of its own time). A one-off prompt of 550 ms (a session's own voice, fed
        once, cached after) in a window of a second put that window behind, and the limit
        fell to one stream; spread over the steps, it costs what it does on average."""
        return self._prompt_s / self._rows

    def cost_s(self, tick_s: float, streams: float) -> float:
        """What a tick of ``streams`` streams taking ``tick_s`` costs with the prompts' share."""
        return tick_s + streams * self.prompt_s

    @property
    def share(self) -> float:
        """The share of stream-steps that complete a frame, lately. A segment of ``f`` frames
        takes about ``f + 32`` steps (MOSS-TTS-Delay's 32 codebooks are one step apart), so
        sentences of 3.5 s complete a frame in 58 % of their steps."""
        return max(_SHARE_MIN, min(1.0, self._frames / self._rows))

    @property
    def budget_s(self) -> float:
        """What a tick's own work may take for its streams to keep up with real-time
        listeners: a frame's time for each frame a step completes, the margin to spare."""
        return self.frame_s * self.share / (1.0 + self.margin)

    @property
    def pace_budget_s(self) -> float:
        """What the windows' ticks, start to start, may take: a frame, the margin to spare.

        Not scaled by the share: those times hold what the machine did besides stepping (the
        event loop's turns, the codec's), which grows with the sessions served, not with
        each step's frames. Judged by the share, the tiny demo model's windows (5 streams,
        ticks every 41 ms start to start where their own work took under 10 ms, sessions
        seconds ahead of their listeners) fell behind at half its load, and the capacity
        dropped from 16 to 3-5 streams, refusing 13 of 38 sessions."""
        return self.frame_s / (1.0 + self.margin)

    def tick_started(self, streams: int, t: float, running: int | None = None) -> None:
        """A tick stepping ``streams`` streams starts at ``t`` (the one before, unless the
        loop waited since, ended here); ``running``: the streams prefilled then, the ones
        this tick skips and those paused ahead of their listeners included (default:
        ``streams``)."""
        self._tick_ended(t)
        self._tick_at, self._last_streams, self._tick_prompts = t, streams, 0.0
        self._last_running = streams if running is None else max(streams, running)
        w = self._win
        # a window is about a second of ticks, or a second of wall time (streams paused
        # meanwhile) holding _WINDOW_TICKS ticks
        if w is None or w[2] >= _WINDOW_S or (w[0] >= _WINDOW_TICKS and t - w[5] >= _WINDOW_S):
            if w is not None:
                self.window(w[1] / w[0], w[2] / w[0], int(w[3]), w[4] / w[0])
            self._win = [0.0, 0.0, 0.0, 0.0, 0.0, t]

    def untimed(self, t: float, ahead: int = 0) -> None:
        """The loop waits from ``t``: nothing to step, or every one of the ``ahead`` streams
        running is paused ahead of its listener (all kept in time: a window counts them as
        stepped). The tick under way ends here, and the wait is no tick's."""
        self._tick_ended(t)
        self._tick_at = None
        if self._win is not None and ahead > self._win[3]:
            self._win[3] = float(ahead)

    def _tick_ended(self, t: float) -> None:
        w, t0 = self._win, self._tick_at
        if w is not None and t0 is not None:
            w[0] += 1
            w[1] += self._last_streams
            w[2] += max(0.0, t - t0 - self._tick_prompts)
            w[4] += self._last_running

    def window(self, streams: float, tick_s: float, ahead: int = 0, running: float = 0.0) -> None:
        """Over the last window a tick stepped ``streams`` streams on average and took
        ``tick_s`` seconds start to start (the loop's waits not counted), while ``running``
        streams ran on average, all kept in time (the ones a tick skipped included: while a
        new stream makes its first frame, a tick steps only the streams with under
        ``step_slack_s`` of audio in hand; and those paused far ahead of their listeners); at
        some moment of it ``ahead`` streams were running, every one paused ahead of its
        listener."""
        # Counting only the streams stepped, a server taking a new stream every second or so
        # stepped 1.4 streams a tick on average beside 4 running, and the limit never rose:
        # 4 streams on the tiny demo model, 8 on an H200 with the 8B model (ticks of 2 and 12
        # ms, 80 ms allowed), the excess refused. The ones skipped count only if ticks
        # stepping them too (by the estimate's cost per count) would still have been in
        # time: on 2 cores, where a stream costs a share of the tick (the mid demo model),
        # counting them raised the limit past what all of them stepped at once could keep.
        running = max(streams, running)
        if running > streams and not self._would_fit(streams, running, tick_s):
            running = streams
        held = max(running, float(ahead))
        if self.cost_s(tick_s, running) > self.pace_budget_s and streams >= 1.0:
            was, self.limit = self.limit, max(1.0, min(self.limit, running) * _BACKOFF)
            log.debug("capacity limit %.2f -> %.2f: a window behind (%.2f streams stepped, %.2f "
                      "running, ticks %.1f ms)", was, self.limit, streams, running, 1000 * tick_s)
            self.windows_behind += 1
            self.slow_start = False
        elif held >= self.limit - 1.0:
            # in time with about as many streams as the limit: evidence for more (well below
            # the limit a window says nothing about it)
            self.limit = self._grown(streams, tick_s)
        self._capacity = None

    def _grown(self, stepped: float, tick_s: float) -> float:
        """The limit after a window in time near it: doubled in the slow start, else (or if
        doubling would not fit) half a stream more; each only if the window's ticks, plus the
        estimate's cost of the streams added, would still be in time. Doubling regardless,
        the mid demo model on 2 cores went from 4 to 8 in a second and admitted a fourth
        stream its ticks could not keep in time (65 ms start to start, where 64 fit): the
        sessions admitted then underran."""
        steps = [self.limit * _START_GROWTH] if self.slow_start else []
        for grown in (*steps, self.limit + _RECOVER):
            grown = min(float(self.max_streams), grown)
            n = math.floor(grown)
            if n <= stepped or self.estimate(n) is None or self._would_fit(stepped, n, tick_s):
                return grown
        return self.limit

    def _would_fit(self, stepped: float, running: float, tick_s: float) -> bool:
        """Whether ticks of ``tick_s`` stepping ``stepped`` streams would stay in time
        stepping ``running``: the estimate's difference between the two counts added."""
        lo, hi = max(1, round(stepped)), min(self.max_streams, math.ceil(running))
        a, b = self.estimate(lo), self.estimate(hi)
        if a is None or b is None:
            return False
        return self.cost_s(tick_s + max(0.0, b - a), hi) <= self.pace_budget_s

    def forget_ticks(self) -> None:
        """Drop the tick times and the frames steps made (after a warm-up: its ticks paid
        one-off costs); the limit starts again from the slow start."""
        self.tick_s[:] = 0.0
        self.seen[:] = 0
        self.last_seen[:] = -np.inf
        self._capacity = None
        self.limit = min(float(self.max_streams), _START)
        self.slow_start = True
        self._win = self._tick_at = None
        self._forget_made()

    def _forget_made(self) -> None:
        # the steps streams that ended took and the frames they completed, each decayed over
        # _SHARE_ROWS steps: a segment's first steps (the delay pattern's) make no frame
        self._rows = self._frames = _SHARE_PRIOR
        self._prompt_s = 0.0  # ... and the seconds their prompts took to feed, decayed so too

    def finished(self) -> None:
        """A stream ended (done, failed or aborted) and its slot is free for a new one."""
        self._finishes.append(self._clock())

    # -- estimates --------------------------------------------------------------------------
    def estimate(self, streams: int) -> float | None:
        """Seconds a tick of ``streams`` streams takes; None before any tick was timed."""
        seen = np.flatnonzero(self.seen)
        if seen.size == 0:
            return None
        # Counts not stepped for a while are read off the line through the counts stepped
        # since: after a busy spell raised every count's average and the capacity fell, the
        # counts above it were never stepped again, and their stale averages held it down
        # for good (the tiny demo model stayed at 3 streams for the rest of a run, 16 before).
        since = self._clock() - _STALE_S
        fresh = seen[self.last_seen[seen] >= since]
        if fresh.size:
            seen = fresh
        if self.seen[streams] >= _TRUSTED and self.last_seen[streams] >= since:
            return float(self.tick_s[streams])
        if seen.size == 1:
            n0 = int(seen[0])
            return float(self.tick_s[n0]) * max(streams, n0) / n0
        w = np.minimum(self.seen[seen], _TRUSTED).astype(np.float64)
        x, y = seen.astype(np.float64), self.tick_s[seen]
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        slope = max(0.0, float(np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2)))
        return max(0.0, float(ym + slope * (streams - xm)))

    def streams(self) -> int:
        """The capacity: the most streams that stay ahead of real time by the margin."""
        if self._capacity is None:
            budget = self.budget_s
            cap = self.max_streams
            if self.estimate(1) is not None:
                cap = 1
                for n in range(2, self.max_streams + 1):
                    est = self.estimate(n)
                    if est is None or self.cost_s(est, n) > budget:
                        break
                    cap = n
            self._capacity = max(1, min(cap, int(self.limit)))
        return self._capacity

    def admits(self, active: int) -> bool:
        """Whether one more stream may start beside ``active`` ones."""
        return active < self.streams()

    def finish_rate(self) -> float | None:
        """Slots freed for new streams per second lately; None before two within the window."""
        now = self._clock()
        # a copy first: the front end asks from its own thread while the engine thread
        # appends, and iterating the deque itself then raised "deque mutated during
        # iteration" (tuple() copies it in C, under the GIL, in one go)
        recent = [t for t in tuple(self._finishes) if now - t <= _FINISH_WINDOW_S]
        if len(recent) < 2 or recent[-1] <= recent[0]:
            return None
        return (len(recent) - 1) / (now - recent[0])

    def wait_s(self, ahead: int) -> float | None:
        """Seconds until a slot frees for a request with ``ahead`` requests in front of it;
        None while the finish rate is unknown."""
        rate = self.finish_rate()
        return None if rate is None else (ahead + 1) / rate

    def refuses(self, ahead: int, waited_s: float = 0.0) -> bool:
        """Whether a request that cannot start now (having waited ``waited_s`` already) is
        refused: its estimated wait runs past the first-audio deadline (unknown: it waits,
        for a stream to end or the limit to rise, and expires at the deadline)."""
        wait = self.wait_s(ahead)
        return wait is not None and waited_s + wait > self.deadline_s

    def retry_after_s(self, ahead: int) -> int:
        """Whole seconds a refused client should wait before trying again (1 to 60)."""
        wait = self.wait_s(ahead)
        return 1 if wait is None else min(60, max(1, math.ceil(wait)))

    def info(self) -> dict[str, float]:
        est = self.estimate(self.streams())
        return {
            "capacity_streams": self.streams(),
            "tick_ms_at_capacity": -1.0 if est is None else round(1000 * est, 3),
            "finish_rate_per_s": self.finish_rate() or 0.0,
            "limit_streams": round(self.limit, 2),
            "frames_per_step": round(self.share, 3),
            "prompt_ms_per_step": round(1000 * self.prompt_s, 3),
            "windows_behind": self.windows_behind,
            "admitted": self.admitted,
            "queued": self.queued,
            "refused": self.refused + self.refused_early,
        }
