"""engine.chunk_policy: when a stream's frames go out and why it ends, with made-up streams
(no threads, no llama.cpp): the slot table and the delay states as the engine leaves them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamtts.config import SamplingParams
from streamtts.constants import FRAME_S
from streamtts.core.delay_state import DelayStates
from streamtts.core.tokens import TokenIds
from streamtts.engine.chunk_policy import REFERENCE_BUFFER_S, ChunkPolicy, first_chunk_frames
from streamtts.engine.decoding import DecodeJob
from streamtts.engine.slot_table import SlotTable
from streamtts.request import PreparedRequest, StreamStats

IDS = TokenIds()
K = IDS.n_vq


@dataclass
class Sink:
    stats: StreamStats = field(default_factory=StreamStats)
    consumed_samples: int = 0
    cancelled: bool = False


@dataclass
class Out:
    """What the policy handed on: the tick's chunks, and the slots it ended (with their last chunk)."""

    jobs: list[DecodeJob] = field(default_factory=list)
    freed: list[tuple[int, DecodeJob]] = field(default_factory=list)


def make(cap: int = 4, chunk_frames: tuple[int, ...] = (2, 4), n_ctx: int = 1000) -> tuple[ChunkPolicy, SlotTable, DelayStates, Out]:
    slots = SlotTable(cap, K, max(chunk_frames) + K - 1)
    states = DelayStates(cap, IDS)
    out = Out()

    def free(slot: int, job: DecodeJob) -> None:
        slots.release(slot)
        out.freed.append((slot, job))

    return ChunkPolicy(chunk_frames, slots, states, n_ctx, out.jobs.extend, free), slots, states, out


def admit(
    slots: SlotTable, slot: int, rid: int, max_new: int = 100, states: DelayStates | None = None,
    policy: ChunkPolicy | None = None, **fields: Any,
) -> PreparedRequest:
    """``req`` (PreparedRequest ``fields`` too) in ``slot``, with the chunks ``policy`` gives it."""
    req = PreparedRequest(
        rid=rid, prompt=np.zeros((4, 1 + K), np.int64), prompt_embd=np.zeros((4, 8), np.float32),
        sampling=SamplingParams(), seed=0, max_new_tokens=max_new, fixed_frames=None, sink=Sink(), **fields,
    )  # fmt: skip
    s = slots.reset(slot, req, policy.chunks_for(req) if policy is not None else (1,))
    s.fed, s.running = 4, True
    if states is not None:  # generating: neither stopping nor past its last frame (a free slot is stopping)
        states.is_stopping[slot] = False
    return req


def tick(policy: ChunkPolicy, slots: SlotTable, run: list[int], frame: int, now: float, ready: bool = True) -> None:
    """Every stream of ``run`` stepped and (``ready``) completed frame ``frame``."""
    r = np.asarray(run, dtype=np.int64)
    slots.steps[r] += 1
    frames = np.full((r.size, K), frame, dtype=np.int64)
    index = np.full(r.size, frame, dtype=np.int64)
    policy.route(r, frames, np.full(r.size, ready), index, now, frame)


def test_the_first_chunk_waits_for_its_size_then_chunks_at_their_target() -> None:
    policy, slots, states, out = make(chunk_frames=(2, 4))
    admit(slots, 0, rid=1, states=states, policy=policy)
    policy.tick_s = 1.0  # slow ticks: before the first chunk nobody listens, so nothing is late
    tick(policy, slots, [0], 0, now=10.0)
    assert out.jobs == []
    tick(policy, slots, [0], 1, now=10.5)
    assert [j.codes[:, 0].tolist() for j in out.jobs] == [[0, 1]]  # the first chunk: its 2 frames
    assert slots.chunk_index[0] == 1 and slots.frames_sent[0] == 2
    assert slots.t_first_emit[0] == 10.5 and slots.audio_due[0] == 10.5 + 2 * FRAME_S
    # the next target is 4 frames, and the listener has 160 ms in hand against fast ticks: it waits
    policy.tick_s = 0.001
    for f in range(2, 5):
        tick(policy, slots, [0], f, now=10.5)
    assert len(out.jobs) == 1
    tick(policy, slots, [0], 5, now=10.5)
    assert [j.codes[:, 0].tolist() for j in out.jobs][1] == [2, 3, 4, 5]
    assert slots.chunk_index[0] == 2 and slots.frames_sent[0] == 6


def test_a_listener_about_to_run_dry_gets_what_there_is() -> None:
    policy, slots, states, out = make(chunk_frames=(1, 8))
    admit(slots, 0, rid=1, states=states, policy=policy)
    tick(policy, slots, [0], 0, now=10.0)  # the first chunk: one frame, 80 ms of audio
    policy.tick_s = 0.05  # slow ticks: seven more frames would take 0.35 s
    tick(policy, slots, [0], 1, now=10.0)
    assert [j.codes.shape[0] for j in out.jobs] == [1, 1]  # sent early, short of its target
    due = policy.due(np.array([0]), now=10.0)
    assert not due.any()  # nothing new pending: nothing to send


def test_due_counts_only_new_frames() -> None:
    policy, slots, states, _ = make(chunk_frames=(2,))
    admit(slots, 0, rid=1, states=states)
    slots.warm[0] = slots.pend_n[0] = 2  # a continuation's warm-up frames: not new audio
    assert not policy.due(np.array([0]), now=0.0).any()
    slots.pend_n[0] = 4
    assert policy.due(np.array([0]), now=0.0).all()


def test_a_stream_ends_for_each_reason_and_frees_its_slot() -> None:
    policy, slots, states, out = make(cap=4, n_ctx=50)
    reqs = [admit(slots, i, rid=10 + i, max_new=5, states=states) for i in range(4)]
    states.is_stopping[0] = True  # sampled the end of speech
    states.delayed_length[1] = K  # its last frame is complete
    slots.steps[2] = 4  # the next step is its fifth: max_new_tokens
    slots.kv_pos[3] = 50  # its context is full
    tick(policy, slots, [0, 1, 2, 3], 0, now=1.0)
    assert sorted(slot for slot, _ in out.freed) == [0, 1, 2, 3]
    assert [r.stats.finish_reason for r in reqs] == ["stop", "audio_end", "max_new_tokens", "context_full"]
    assert all(job.is_last for _, job in out.freed) and out.jobs == []
    assert slots.active == 0


def test_a_stream_without_a_new_frame_still_ends() -> None:
    policy, slots, states, out = make()
    req = admit(slots, 0, rid=1, states=states)
    states.is_stopping[0] = True
    tick(policy, slots, [0], 0, now=1.0, ready=False)
    assert [(slot, job.is_last, job.codes.shape[0]) for slot, job in out.freed] == [(0, True, 0)]
    assert req.stats.finish_reason == "stop"


def test_the_tick_estimate_follows_the_ticks() -> None:
    policy, _, _, _ = make()
    for _ in range(100):
        policy.observe_tick(0.02)
    assert abs(policy.tick_s - 0.02) < 1e-6


def sizes_sent(policy: ChunkPolicy, slots: SlotTable, out: Out, frames: int) -> list[int]:
    """The chunk sizes slot 0 sends over ``frames`` ticks with ticks far within a frame's time
    (no listener is ever late: only the targets decide)."""
    policy.tick_s = 0.0
    for f in range(frames):
        tick(policy, slots, [0], f, now=0.0)
    return [j.codes.shape[0] for j in out.jobs]


def test_a_larger_playback_buffer_gets_a_smaller_first_chunk() -> None:
    """One frame less for every whole 80 ms beyond the 100 ms the first chunk is chosen for;
    at least one frame; the ramp after it unchanged."""
    assert first_chunk_frames((4, 8), 0.0) == (4, 8)  # not said: the configured chunks
    assert first_chunk_frames((4, 8), REFERENCE_BUFFER_S) == (4, 8)
    assert first_chunk_frames((4, 8), REFERENCE_BUFFER_S + 0.079) == (4, 8)
    assert first_chunk_frames((4, 8), REFERENCE_BUFFER_S + FRAME_S) == (3, 8)
    assert first_chunk_frames((4, 8), 0.34) == (1, 8)  # 240 ms beyond: three frames less
    assert first_chunk_frames((4, 8), 5.0) == (1, 8)
    assert first_chunk_frames((1, 2, 4, 8), 5.0) == (1, 2, 4, 8)


def test_the_stream_sends_the_chunks_its_buffer_chose() -> None:
    policy, slots, states, out = make(chunk_frames=(4, 8))
    admit(slots, 0, rid=1, states=states, policy=policy, playback_buffer_s=0.34)
    assert sizes_sent(policy, slots, out, 17) == [1, 8, 8]


def test_a_stream_may_have_its_own_chunks() -> None:
    """A benchmark's policy per stream (StreamOptions.chunk_frames): another stream keeps the
    config's, and a longer list than the table had fits."""
    policy, slots, states, out = make(chunk_frames=(2, 4))
    admit(slots, 1, rid=2, states=states, policy=policy)
    admit(slots, 0, rid=1, states=states, policy=policy, chunk_frames=(3, 1, 2, 5))
    assert sizes_sent(policy, slots, out, 16) == [3, 1, 2, 5, 5]
    assert slots.chunks[1].tolist() == [2, 4, 4, 4]


def test_a_sessions_next_segment_counts_the_audio_its_listener_has_in_hand() -> None:
    """Segment 0 of session 7 sent 2 s by t=10: its listener hears up to t=12. Segment 1,
    admitted then, is 2 s from running dry (not a listener waiting for audio, -inf), its
    first chunk is heard at t=12, and the session's due grows with it. A new stream, a
    stream of another session and a session's first segment wait for audio as before; a
    session that ended is forgotten."""
    policy, slots, states, out = make(chunk_frames=(25,))
    admit(slots, 0, rid=1, states=states, policy=policy, session=7)
    policy.started(0, now=9.0)
    assert slots.audio_due[0] == -np.inf  # a first segment: its listener waits
    for f in range(25):
        tick(policy, slots, [0], f, now=10.0)
    assert slots.audio_due[0] == 10.0 + 25 * FRAME_S == 12.0
    admit(slots, 1, rid=2, states=states, policy=policy, session=7, priority=True)
    policy.started(1, now=10.0)
    assert slots.audio_due[1] == 12.0
    for f in range(25):
        tick(policy, slots, [1], f, now=10.5)
    assert slots.t_first_emit[1] == 12.0 and slots.audio_due[1] == 14.0  # heard after segment 0
    for slot, fields in ((2, {}), (3, {"session": 8, "priority": True})):
        admit(slots, slot, rid=3 + slot, states=states, policy=policy, **fields)
        policy.started(slot, now=10.5)
        assert slots.audio_due[slot] == -np.inf
    policy.end_session(7)
    slots.release(1)
    admit(slots, 1, rid=9, states=states, policy=policy, session=7, priority=True)
    policy.started(1, now=10.5)
    assert slots.audio_due[1] == -np.inf


def test_a_later_segments_audio_is_not_counted_for_an_earlier_one() -> None:
    """Two segments of a session generate at once: when the later one's audio is sent first,
    the earlier one's listener does not have it before its own (it is not counted)."""
    policy, slots, states, out = make(chunk_frames=(25,))
    for slot in (0, 1):
        admit(slots, slot, rid=slot + 1, states=states, policy=policy, session=7, priority=True)
        policy.started(slot, now=10.0)
    for f in range(25):
        tick(policy, slots, [1], f, now=10.0)  # the later segment's first chunk: 2 s
    for f in range(25):
        tick(policy, slots, [0], f, now=10.5)
    assert slots.t_first_emit[0] == 10.5  # not 12.0


def test_a_listener_that_ran_dry_waits_like_a_new_one() -> None:
    policy, slots, states, out = make(chunk_frames=(25,))
    admit(slots, 0, rid=1, states=states, policy=policy, session=7)
    policy.started(0, now=9.0)
    for f in range(25):
        tick(policy, slots, [0], f, now=10.0)
    admit(slots, 1, rid=2, states=states, policy=policy, session=7, priority=True)
    policy.started(1, now=12.5)  # segment 0's 2 s were heard by t=12
    assert slots.audio_due[1] == -np.inf
