"""engine.scheduler: the plan of one tick, with made-up streams (no threads, no llama.cpp)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamtts.config import EngineConfig, SamplingParams
from streamtts.constants import SAMPLE_RATE
from streamtts.engine.prefix_cache import PrefixCache
from streamtts.engine.scheduler import Plan, Scheduler
from streamtts.engine.slot_table import SlotTable
from streamtts.request import PreparedRequest


@dataclass
class Sink:
    consumed_samples: int = 0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(cap: int = 4, cache_mib: int = 0, **cfg: object) -> tuple[Scheduler, SlotTable, Clock]:
    config = EngineConfig(max_streams=cap, prefill_chunk=16, n_batch=64, **cfg)  # type: ignore[arg-type]
    slots = SlotTable(cap)
    clock = Clock()
    return Scheduler(config, slots, PrefixCache(cache_mib << 20), clock), slots, clock


def request(rid: int, rows: int, prefix_rows: int = 0, key: bytes = b"") -> PreparedRequest:
    return PreparedRequest(
        rid=rid, prompt=np.zeros((rows, 33), np.int64), prompt_embd=np.zeros((rows, 8), np.float32),
        sampling=SamplingParams(), seed=0, max_new_tokens=100, fixed_frames=None, sink=Sink(),
        prefix_rows=prefix_rows, prefix_key=key,
    )


def admit(sched: Scheduler, slots: SlotTable, slot: int, req: PreparedRequest, running: bool = False) -> None:
    s = slots.reset(slot, req)
    if running:
        s.fed, s.running = req.prompt.shape[0], True
    else:
        sched.admitted(slot)


def apply(sched: Scheduler, slots: SlotTable, plan: Plan) -> None:
    """What the engine does with a plan, minus the backbone."""
    for slot, _ in plan.loads:
        s = slots.streams[slot]
        assert s is not None
        s.fed = s.req.prefix_rows
    for p in plan.prefill:
        s = slots.streams[p.slot]
        assert s is not None and s.fed == p.start
        s.fed += p.rows
        if p.store_prefix:
            sched.prefix_cache.store(s.req.prefix_key, p.slot, np.zeros(10, np.uint8))
        if p.last:
            s.running = True
            sched.prefilled(p.slot)


def pieces(plan: Plan) -> list[tuple[int, int, int, bool]]:
    return [(p.slot, p.start, p.rows, p.last) for p in plan.prefill]


def test_running_streams_step_in_slot_order() -> None:
    sched, slots, _ = make()
    admit(sched, slots, 2, request(1, 10), running=True)
    admit(sched, slots, 0, request(2, 10), running=True)
    admit(sched, slots, 1, request(3, 10))  # still joining
    plan = sched.schedule()
    assert plan.decode.tolist() == [0, 2]
    assert pieces(plan) == [(1, 0, 10, True)]


def test_prompt_partition_depends_on_the_prompt_alone() -> None:
    """Prefix, then the rest, each in prefill_chunk pieces; at most prefill_chunk rows a tick."""
    sched, slots, _ = make(cache_mib=1)
    admit(sched, slots, 0, request(1, 40, prefix_rows=20, key=b"k"))
    seen = []
    for _ in range(6):
        plan = sched.schedule()
        seen.append(pieces(plan))
        assert sum(p.rows for p in plan.prefill) <= 16
        apply(sched, slots, plan)
    assert seen[:4] == [
        [(0, 0, 16, False)],
        [(0, 16, 4, False)],  # the prefix ends here (20 rows); the next piece would overrun the budget
        [(0, 20, 16, False)],
        [(0, 36, 4, True)],
    ]
    assert slots.streams[0] is not None and slots.streams[0].running


def test_joiners_are_fed_oldest_first_within_the_budget() -> None:
    sched, slots, _ = make()
    admit(sched, slots, 3, request(1, 12))
    admit(sched, slots, 0, request(2, 12))
    plan = sched.schedule()
    assert pieces(plan) == [(3, 0, 12, True)]  # 12 + 12 > 16: the second waits a tick
    apply(sched, slots, plan)
    assert pieces(sched.schedule()) == [(0, 0, 12, True)]


def test_a_prefix_being_computed_makes_others_wait_then_load_it() -> None:
    sched, slots, _ = make(cache_mib=1)
    admit(sched, slots, 0, request(1, 30, prefix_rows=20, key=b"voice"))
    admit(sched, slots, 1, request(2, 30, prefix_rows=20, key=b"voice"))
    plan = sched.schedule()
    assert pieces(plan) == [(0, 0, 16, False)] and not plan.loads  # slot 1 waits
    apply(sched, slots, plan)
    plan = sched.schedule()  # slot 0 completes the prefix (stored) and its prompt; slot 1 waits
    assert pieces(plan) == [(0, 16, 4, False), (0, 20, 10, True)] and plan.prefill[0].store_prefix
    assert not plan.loads
    apply(sched, slots, plan)
    plan = sched.schedule()  # stored: slot 1 loads it instead of computing it
    assert [s for s, _ in plan.loads] == [1]
    assert pieces(plan) == [(1, 20, 10, True)]


def test_a_released_claim_lets_a_waiter_compute() -> None:
    sched, slots, _ = make(cache_mib=1)
    admit(sched, slots, 0, request(1, 30, prefix_rows=20, key=b"v"))
    admit(sched, slots, 1, request(2, 30, prefix_rows=20, key=b"v"))
    apply(sched, slots, sched.schedule())
    slots.release(0)
    sched.released(0)  # the owner was cancelled before storing
    plan = sched.schedule()
    assert pieces(plan)[0] == (1, 0, 16, False)


def test_backpressure_pauses_and_resumes_with_hysteresis() -> None:
    sched, slots, _ = make(max_buffered_s=1.0, resume_buffered_s=0.5)
    req = request(1, 10)
    admit(sched, slots, 0, req, running=True)
    s = slots.streams[0]
    assert s is not None
    slots.frames_sent[0] = 20  # 1.6 s sent, none consumed
    assert sched.schedule().decode.size == 0 and s.paused
    req.sink.consumed_samples = int(0.8 * SAMPLE_RATE)  # 0.8 s buffered: still paused
    assert sched.schedule().decode.size == 0
    req.sink.consumed_samples = int(1.2 * SAMPLE_RATE)  # 0.4 s buffered: resume
    assert sched.schedule().decode.tolist() == [0] and not s.paused
    slots.frames_sent[0] = 30  # 1.2 s more sent (2.4 s in all): 1.2 s buffered, paused again
    assert sched.schedule().decode.size == 0 and s.paused


def test_backpressure_of_a_released_slot_is_forgotten() -> None:
    sched, slots, _ = make(max_buffered_s=1.0, resume_buffered_s=0.5)
    admit(sched, slots, 0, request(1, 10), running=True)
    slots.frames_sent[0] = 20
    assert sched.schedule().decode.size == 0
    slots.release(0)
    sched.released(0)
    admit(sched, slots, 0, request(2, 10), running=True)  # the slot's next stream starts unpaused
    s = slots.streams[0]
    assert s is not None and sched.schedule().decode.tolist() == [0] and not s.paused


def test_streams_far_ahead_skip_steps_while_a_newcomer_waits_for_audio() -> None:
    sched, slots, clock = make(step_slack_s=1.0)
    for slot in range(3):
        admit(sched, slots, slot, request(slot, 10), running=True)
    slots.audio_due[0] = clock.t + 5.0  # 5 s ahead of its listener
    slots.audio_due[1] = clock.t + 0.2  # nearly dry
    # slot 2 has no audio yet (-inf): a newcomer, so slot 0 sits this tick out
    assert sched.schedule().decode.tolist() == [1, 2]
    slots.audio_due[2] = clock.t + 0.1  # everyone has audio: all step
    assert sched.schedule().decode.tolist() == [0, 1, 2]
    # a stream far ahead between two that step would leave a gap, which costs as much as
    # stepping it (the engine decodes a stand-in row there): it steps
    slots.audio_due[:3] = [clock.t + 0.2, clock.t + 5.0, -np.inf]
    assert sched.schedule().decode.tolist() == [0, 1, 2]


def test_max_batch_rows_keeps_the_streams_closest_to_running_dry() -> None:
    sched, slots, clock = make(max_batch_rows=2, step_slack_s=0.0)
    for slot, due in enumerate([3.0, 0.5, 2.0, 0.1]):
        admit(sched, slots, slot, request(slot, 10), running=True)
        slots.audio_due[slot] = clock.t + due
    assert sched.schedule().decode.tolist() == [1, 3]


def test_slot_table_reset_and_release_leave_no_stale_column() -> None:
    tab = SlotTable(2)
    req = request(7, 10)
    req.fixed_frames = 5
    tab.reset(1, req)
    tab.kv_pos[1], tab.steps[1], tab.audio_due[1] = 50, 9, 3.0
    assert tab.find(7) == 1 and tab.free_slot() == 0 and tab.active == 1
    assert tab.release(1) is not None
    assert (tab.kv_pos[1], tab.steps[1], tab.max_new[1], tab.fixed[1]) == (0, 0, 0, -1)
    assert np.isneginf(tab.audio_due[1]) and tab.active == 0 and tab.find(7) is None


def test_slot_table_pending_frames_columns_start_fresh() -> None:
    tab = SlotTable(2, n_vq=3, pend_frames=2)
    tab.reset(1, request(7, 10))
    tab.prefix_frames[1] = 3
    tab.add_pending(np.array([1]), np.ones((1, 3), np.int64), np.array([0]))
    tab.frames_sent[1], tab.chunk_index[1], tab.t_first_emit[1], tab.bp_seen[1] = 8, 2, 5.0, 8
    tab.release(1)
    cols = (tab.pend_n, tab.warm, tab.pending_first, tab.prefix_frames, tab.frames_sent)
    assert [int(c[1]) for c in cols] == [0] * 5 and tab.chunk_index[1] == 0
    assert tab.t_first_emit[1] == 0.0 and tab.bp_seen[1] == -1
    assert not tab.pend[1].any()


def test_pending_frames_keep_order_warm_up_and_first_frame() -> None:
    """A continuation of 3 prefix frames: those the steps complete are warm-up, then new
    frames count from 0; a full buffer grows rather than drop a frame."""
    tab = SlotTable(2, n_vq=2, pend_frames=2)
    tab.reset(0, request(1, 10))
    tab.reset(1, request(2, 10))
    tab.prefix_frames[0] = 3
    slots = np.array([0, 1])
    for i in range(4):  # slot 0 completes frames 2, 3, 4, 5; slot 1 frames 0, 1, 2, 3
        tab.add_pending(slots, np.array([[2 + i, 2 + i], [10 + i, 10 + i]]), np.array([2 + i, i]))
    assert tab.pend.shape[1] >= 4
    assert tab.pend_n.tolist() == [4, 4] and tab.warm.tolist() == [1, 0]
    assert tab.pending_first.tolist() == [0, 0]
    codes = tab.take_pending(0)
    assert codes[:, 0].tolist() == [2, 3, 4, 5] and tab.pend_n[0] == 0 and tab.warm[0] == 0
    tab.add_pending(slots[:1], np.array([[6, 6]]), np.array([6]))
    assert tab.pending_first[0] == 3 and codes[-1, 0] == 5  # the taken array is its own
    assert tab.take_pending(1)[:, 0].tolist() == [10, 11, 12, 13]


def test_the_plan_says_when_a_stream_waits_for_its_first_audio() -> None:
    """Stepped or still joining, a stream whose listener has no audio yet (-inf) makes the
    tick one the engine keeps short (no thread-count probe)."""
    sched, slots, clock = make(step_slack_s=1.0)
    admit(sched, slots, 0, request(0, 10), running=True)
    assert sched.schedule().first_audio  # alone, with no audio
    slots.audio_due[0] = clock.t + 5.0
    assert not sched.schedule().first_audio
    admit(sched, slots, 1, request(1, 10))  # joining
    plan = sched.schedule()
    assert plan.first_audio and plan.decode.tolist() == [0]
    apply(sched, slots, plan)
    plan = sched.schedule()  # slot 1 steps now; slot 0, 5 s ahead, sits the tick out
    assert plan.first_audio and plan.decode.tolist() == [1]
    slots.audio_due[1] = clock.t + 0.1
    assert not sched.schedule().first_audio


def test_a_next_segment_with_audio_in_hand_does_not_step_beside_a_newcomer() -> None:
    """A session's next segment admitted with its listener 3 s from running dry
    (ChunkPolicy.started) is no newcomer: beside one it sits the tick out (as a newcomer
    itself, -inf, it stepped); with under ``step_slack_s`` in hand it steps."""
    sched, slots, clock = make(step_slack_s=1.0)
    for slot in range(2):
        admit(sched, slots, slot, request(slot, 10), running=True)
    # slot 0: the next segment, before its first chunk; slot 1: a new stream
    assert sched.schedule().decode.tolist() == [0, 1]
    slots.audio_due[0] = clock.t + 3.0
    assert sched.schedule().decode.tolist() == [1]
    slots.audio_due[0] = clock.t + 0.5
    assert sched.schedule().decode.tolist() == [0, 1]
