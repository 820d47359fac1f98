"""WaitingQueue: requests waiting for a stream slot, and admission by measured capacity.

A session's next segment waits ahead of new streams and is never refused for capacity; it
starts on the room its session holds for it even when the capacity fell after the session was
admitted (the fall refuses new streams instead). With
``admission: capacity`` a new stream that cannot start at once waits only while its first
audio can still come within ``first_audio_deadline_s``; otherwise it is refused when it
arrives (:meth:`WaitingQueue.refusal`), as soon as its expected wait runs past the deadline
while it waits (the capacity fell under it), or when its wait runs out (:meth:`WaitingQueue.expire`).

A session of several segments runs its next segment beside the one playing (generated ahead,
so that it is ready when the first ends: ``PreparedRequest.reserve`` streams more). Counting
only the streams running, a new session was admitted while another was between two segments
or had not started its next one yet, and then that session's next segment waited for a slot
while its listener ran dry. So capacity is counted by demand: each session with a stream
running holds room for its streams to come (``reserve``), and a new stream starts only with
room for itself and what its own session will run.
Engine-thread only, but :meth:`refusal` (a read) is also asked by the front end before it
prepares a request; the engine asks again when the request arrives.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator

from ..config import EngineConfig
from ..errors import OverloadedError, QueueTimeoutError
from ..request import PreparedRequest
from .capacity import Capacity
from .slot_table import SlotTable

__all__ = ["WaitingQueue"]

log = logging.getLogger(__name__)

_REJUDGE_S = 0.05  # the waiting new streams' expected waits are judged again this often


class WaitingQueue:
    def __init__(
        self,
        cfg: EngineConfig,
        slots: SlotTable,
        admission: Capacity,
        reject: Callable[[PreparedRequest, BaseException], None],
    ) -> None:
        self.cfg = cfg
        self.slots = slots
        self.admission = admission
        self.by_capacity = cfg.admission == "capacity"
        self._reject = reject  # ends a request that will not start, with its error
        self.requests: deque[PreparedRequest] = deque()
        self._queued_at: dict[int, float] = {}  # rid -> when it joined the queue
        # session -> [its streams running, the streams it runs beside one, whether its next
        # segment was queued] (the latter two: its latest request's)
        self._sessions: dict[int, list[int]] = {}
        self._held = 0  # the room the sessions hold beyond their streams running (kept as they change)
        self._judged_at = 0.0  # when the waiting new streams' expected waits were last judged

    @property
    def demand(self) -> int:
        """The streams running plus the room the sessions running hold for their next ones."""
        return self.slots.active + self._held

    def started(self, req: PreparedRequest) -> None:
        """``req`` took a slot (its session's room counts from here)."""
        if req.session:
            s = self._sessions.get(req.session)
            if s is None:
                s = self._sessions[req.session] = [0, 0, 0]
            else:
                self._held -= _room_held(s)
            s[0] += 1
            s[1] = req.reserve  # the last segment's says that no more are coming
            s[2] = int(req.next_queued)
            self._held += _room_held(s)

    def ended(self, req: PreparedRequest) -> bool:
        """``req``'s slot is free. A session whose next segment was queued when its latest
        started keeps its room with no stream running: between two segments, the next one
        starts once its listener has played into the one before, and when it waited then for
        the capacity new streams had taken, it came seconds late (:meth:`end_session` frees
        a session cut short). One whose next segment comes later (streamed text) holds none
        and asks again like a new one would. True when that was the last stream of its
        session: none running, and its latest said that no more are coming."""
        s = self._sessions.get(req.session) if req.session else None
        if s is None:
            return False
        self._held -= _room_held(s)
        s[0] -= 1
        if s[0] <= 0 and not (s[1] and s[2]):
            del self._sessions[req.session]
            return s[1] == 0
        self._held += _room_held(s)
        return False

    def end_session(self, session: int) -> None:
        """Session ``session`` starts no more streams (it ended or was cut): its room is free
        (its streams still running count as streams until they end)."""
        s = self._sessions.pop(session, None)
        if s is not None:
            self._held -= _room_held(s)

    def _room(self, req: PreparedRequest) -> bool:
        """By capacity, whether ``req`` may start: a session's next segment when its session
        holds room for it, else if it fits in the streams running; a new stream with its
        session's ``reserve`` more beside it, in what every session holds."""
        if req.priority:
            # The room was counted when the session was admitted: waiting for the capacity
            # after it fell under the sessions admitted made their next segments wait 0.7-1.8 s
            # (mid demo model at 2x) while their listeners ran dry.
            return self._holds_room(req.session) or self.admission.admits(self.slots.active)
        return self._fits(req.reserve)

    def _holds_room(self, session: int) -> bool:
        s = self._sessions.get(session) if session else None
        return s is not None and _room_held(s) > 0

    def _fits(self, req_reserve: int) -> bool:
        """A new stream with ``req_reserve`` more beside it, in what every session holds."""
        demand = self.demand
        # an idle engine starts any session (one too slow for its two streams still serves it)
        return demand == 0 or self.admission.admits(demand + req_reserve)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def next_is_priority(self) -> bool:
        """Whether a session's next segment is first in line (it takes the next free slot)."""
        return bool(self.requests) and self.requests[0].priority

    def enqueue(self, req: PreparedRequest) -> None:
        """Into the queue (a session's next segment ahead of new streams); by capacity, a
        new stream that cannot start now and would wait past its deadline is refused."""
        self._queued_at[req.rid] = time.monotonic()  # its wait counts from here
        if req.priority:
            at = next((i for i, r in enumerate(self.requests) if not r.priority), len(self.requests))
            self.requests.insert(at, req)
            return
        if self.by_capacity and not self._startable(req.reserve):
            err = self.refusal(req.reserve)
            if err is not None:
                self.admission.refused += 1
                del self._queued_at[req.rid]
                self._reject(req, err)
                return
            self.admission.queued += 1
        self.requests.append(req)

    def _startable(self, reserve: int) -> bool:
        """Whether a new stream (its session running ``reserve`` more beside it) would start
        at once: nothing queued, a slot and capacity."""
        return not self.requests and self.slots.free_slot() is not None and self._fits(reserve)

    def refusal(self, reserve: int = 0) -> OverloadedError | None:
        """By capacity: the error refusing a new stream (its session running ``reserve`` more
        beside it) that cannot start now and would wait past its first-audio deadline; None
        when it may start or wait."""
        if not self.by_capacity or self._startable(reserve):
            return None
        ahead = len(self.requests) + self._over(reserve)
        return None if not self.admission.refuses(ahead) else self._overloaded(ahead)

    def _over(self, reserve: int) -> int:
        """The streams that must end, beyond the one every wait counts, before a new stream
        (with ``reserve`` more beside it) has room: more when the capacity fell under the
        streams running or sessions hold room."""
        return max(0, self.demand + reserve - self.admission.streams())

    def _overloaded(self, ahead: int) -> OverloadedError:
        cap = self.admission
        retry = cap.retry_after_s(ahead)
        return OverloadedError(
            f"the engine is at its measured capacity ({cap.streams()} streams in real time) and "
            f"no slot is expected within {cap.deadline_s:g} s; retry in {retry} s",
            retry_after_s=retry,
        )

    def expire(self) -> None:
        """End the requests that waited too long: a new stream (by capacity) past its
        first-audio deadline, any request past ``queue_timeout_s``; by capacity, a new
        stream whose wait is no longer expected to end within its deadline is refused now."""
        if not self.requests:
            return
        now = time.monotonic()
        if self.by_capacity and now - self._judged_at >= _REJUDGE_S:
            self._judged_at = now
            self._rejudge(now)
        limit = self.cfg.queue_timeout_s
        first = min(limit, self.cfg.first_audio_deadline_s) if self.by_capacity else limit
        since = self._queued_at
        for req in [r for r in self.requests if now - since[r.rid] > (limit if r.priority else first)]:
            self.requests.remove(req)
            del since[req.rid]
            waited = limit if req.priority else first
            self._reject(req, QueueTimeoutError(
                f"no stream slot became free within {waited:g} s "
                f"({self.slots.active} streams running, capacity {self.admission.streams()})",
                retry_after_s=self.admission.retry_after_s(len(self.requests)),
            ))  # fmt: skip

    def _rejudge(self, now: float) -> None:
        """Refuse the new streams waiting whose first audio is no longer expected within the
        deadline (the capacity fell under them, or streams finish slower than when they came):
        at once, rather than when the deadline passes."""
        refuse: list[tuple[PreparedRequest, int]] = []
        for i, req in enumerate(self.requests):
            if req.priority:
                continue
            ahead = i - len(refuse) + self._over(req.reserve)
            if self.admission.refuses(ahead, now - self._queued_at[req.rid]):
                refuse.append((req, ahead))
        for req, ahead in refuse:
            self.requests.remove(req)
            del self._queued_at[req.rid]
            self.admission.refused += 1
            self._reject(req, self._overloaded(ahead))

    def admissible(self) -> Iterator[tuple[int, PreparedRequest]]:
        """(free slot, request) while both a slot and (by capacity) room are there; requests
        cancelled while they waited are dropped. The caller admits each before the next."""
        while self.requests:
            slot = self.slots.free_slot()
            if slot is None:
                return
            head = self.requests[0]
            if self.by_capacity and not self._room(head):
                return
            req = self.requests.popleft()
            queued_at = self._queued_at.pop(req.rid, None)
            if req.priority and queued_at is not None and log.isEnabledFor(logging.DEBUG):
                log.debug("a session's next segment waited %.0f ms (%d running, capacity %d)",
                          1000 * (time.monotonic() - queued_at), self.slots.active, self.admission.streams())
            if not req.sink.cancelled:
                self.admission.admitted += 1
                self.started(req)
                yield slot, req

    def remove(self, rid: int) -> bool:
        """Take request ``rid`` out of the queue (aborted while it waited)."""
        for req in self.requests:
            if req.rid == rid:
                self.requests.remove(req)
                self._queued_at.pop(rid, None)
                return True
        return False

    def fail_all(self, err: BaseException) -> None:
        while self.requests:
            self._reject(self.requests.popleft(), err)
        self._queued_at.clear()


def _room_held(session: list[int]) -> int:
    """The room a session ([streams running, reserve, next queued]) holds beyond its streams
    running."""
    running, reserve, _ = session
    return max(0, 1 + reserve - running)
