"""Admission by measured capacity (streamtts.engine.capacity): made-up ticks, a fake clock."""

from __future__ import annotations

import pytest

from streamtts.engine.capacity import Capacity


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def open_limit(c: Capacity) -> Capacity:
    """Seconds in time at the limit until it reaches the hard cap (past the slow start)."""
    while c.limit < c.max_streams:
        c.window(c.limit, 0.010)
    return c


def test_a_fresh_engine_starts_slow_and_doubles_each_second_in_time() -> None:
    c = Capacity(max_streams=12, margin=0.25, deadline_s=2.0)
    assert c.estimate(3) is None and c.streams() == 2  # nothing measured: the slow start's two
    assert c.admits(1) and not c.admits(2)
    c.window(2.0, 0.010)  # a second in time at the limit: twice as many
    c.window(4.0, 0.010)
    assert c.streams() == 8 and c.slow_start
    c.window(1.0, 0.010)  # well below the limit: no evidence for more
    assert c.streams() == 8
    c.window(8.0, 0.070)  # behind (70 ms x 1.25 > 80 ms): 3/4 of 8, and the slow start ends
    assert c.streams() == 6 and not c.slow_start
    c.window(6.0, 0.010)  # from here half a stream a second
    assert c.limit == 6.5 and c.streams() == 6
    open_limit(c)
    assert c.streams() == 12 and c.admits(11) and not c.admits(12)  # the hard cap


def test_one_count_seen_is_extended_in_proportion() -> None:
    c = open_limit(Capacity(max_streams=16, margin=0.25, deadline_s=2.0))
    c.observe(1, 0.020)  # 20 ms a tick alone: 64 ms (80 / 1.25) fits 3
    assert c.estimate(3) == pytest.approx(0.060)
    assert c.streams() == 3


def test_a_line_through_the_counts_seen() -> None:
    c = open_limit(Capacity(max_streams=16, margin=0.25, deadline_s=2.0))
    for _ in range(30):
        c.observe(1, 0.020)
        c.observe(2, 0.028)  # batching: 8 ms more per stream
    assert c.estimate(2) == pytest.approx(0.028)  # seen often enough: its own average
    assert c.estimate(6) == pytest.approx(0.060)
    assert c.streams() == 6  # 6: 60 ms; 7: 68 ms > 64 ms


def test_the_budget_is_a_frame_for_each_frame_a_step_completes() -> None:
    c = open_limit(Capacity(max_streams=16, margin=0.25, deadline_s=2.0))
    for _ in range(30):
        c.observe(1, 0.020)
        c.observe(2, 0.028)
    assert c.share == 1.0 and c.streams() == 6  # nothing made yet: a frame a step (64 ms)
    for _ in range(400):  # sentences of 44 frames: 76 steps each, 44 of them complete a frame
        c.made(76, 44)
    assert c.share == pytest.approx(44 / 76, abs=0.01)
    assert c.budget_s == pytest.approx(0.080 * 44 / 76 / 1.25, rel=0.02)
    assert c.streams() == 3  # 3: 36 ms fits 37 ms; 4: 44 ms does not
    assert c.info()["frames_per_step"] == pytest.approx(0.579, abs=0.01)
    # the windows' ticks start to start keep a frame as their budget (what the machine did
    # between steps is in them): 40 ms is in time, 70 ms behind
    c.window(3.0, 0.040)
    assert c.windows_behind == 0
    c.window(3.0, 0.070)
    assert c.windows_behind == 1
    for _ in range(400):  # long text: nearly every step completes a frame
        c.made(100, 99)
    assert c.share > 0.98
    open_limit(c)
    assert c.streams() == 6


def test_prompts_cost_their_average_share_of_the_steps_not_a_window_behind() -> None:
    c = open_limit(Capacity(max_streams=16, margin=0.25, deadline_s=2.0))
    for _ in range(30):
        c.observe(1, 0.020)
        c.observe(2, 0.028)
    t = 0.0
    c.tick_started(1, t)
    c.fed_prompts(1.0)  # a long prompt fed in the first tick: every stream waited for it
    t += 1.02
    for _ in range(60):  # then ticks of 20 ms: a window of a second of them
        c.tick_started(1, t)
        t += 0.020
    # counted start to start, the first tick (1.02 s) alone would have been a window behind;
    # the prompt not counted, the window is 50 ticks of 20 ms
    assert c.windows_behind == 0
    for _ in range(400):  # streams of 76 steps (44 frames), each prompt fed in 190 ms
        c.made(76, 44, 0.190)
    assert c.prompt_s == pytest.approx(0.190 / 76, rel=0.02)
    # a tick of n streams costs n x 2.5 ms more: 3 streams, 36 + 7.5 ms > 37 ms; 2: 28 + 5 ms
    assert c.cost_s(0.028, 2) == pytest.approx(0.033, rel=0.02)
    assert c.streams() == 2
    assert c.info()["prompt_ms_per_step"] == pytest.approx(2.5, rel=0.02)
    c.window(2.0, 0.058)  # 58 ms start to start and 5 ms of prompts: within 64 ms
    assert c.windows_behind == 0
    c.window(2.0, 0.062)  # 62 + 5 ms: behind
    assert c.windows_behind == 1


def test_a_running_average_follows_a_slower_machine() -> None:
    c = open_limit(Capacity(max_streams=16, margin=0.0, deadline_s=2.0))
    for _ in range(30):
        c.observe(4, 0.040)
    fast = c.streams()
    for _ in range(60):
        c.observe(4, 0.079)  # a neighbour took a core
    assert c.streams() < fast
    assert c.streams() >= 1


def test_counts_not_stepped_for_a_minute_are_read_off_the_line_again() -> None:
    clock = Clock()
    c = open_limit(Capacity(max_streams=16, margin=0.25, deadline_s=2.0, clock=clock))
    for _ in range(30):
        for n in range(1, 7):
            c.observe(n, 0.005 * n)  # 5 ms a stream: 12 fit in 64 ms
    assert c.streams() == 12
    for _ in range(60):  # a busy neighbour: every count four times slower
        for n in range(1, 7):
            c.observe(n, 0.020 * n)
    assert c.streams() == 3
    for _ in range(150):  # it left; the capacity stepped counts 1-3 only since (75 s)
        for n in range(1, 4):
            c.observe(n, 0.005 * n)
        clock.t += 0.5
    assert c.estimate(4) == pytest.approx(0.020, abs=0.001)  # 4: a minute stale, off the line
    assert c.streams() == 12


def test_too_slow_for_one_still_serves_one() -> None:
    c = Capacity(max_streams=4, margin=0.25, deadline_s=2.0)
    c.observe(1, 0.5)
    assert c.streams() == 1 and c.admits(0) and not c.admits(1)


def test_wait_and_refusal_from_the_measured_finish_rate() -> None:
    clock = Clock()
    c = Capacity(max_streams=4, margin=0.25, deadline_s=2.0, clock=clock)
    assert c.wait_s(0) is None and not c.refuses(10)  # unknown: it waits
    assert c.retry_after_s(3) == 1
    for _ in range(5):  # a stream ends every second
        c.finished()
        clock.t += 1.0
    assert c.finish_rate() == pytest.approx(4 / 5)  # 4 gaps since the first, up to now
    assert c.wait_s(0) == pytest.approx(1.25)
    assert not c.refuses(0) and c.refuses(1)  # 2.5 s > the 2 s deadline
    assert c.refuses(0, waited_s=1.0)  # waited 1 s, 1.25 s more expected: past the deadline
    assert c.retry_after_s(1) == 3
    clock.t += 500.0  # long ago: unknown again
    assert c.finish_rate() is None



def test_a_second_of_slow_ticks_lowers_the_capacity_and_seconds_in_time_raise_it() -> None:
    c = open_limit(Capacity(max_streams=16, margin=0.25, deadline_s=2.0))
    for _ in range(30):
        c.observe(12, 0.014)  # a tick's own time: 12 streams in 14 ms
    assert c.streams() == 16
    t = 0.0
    for _ in range(12):  # then a second in which 12 streams got a tick every 100 ms
        c.tick_started(12, t)
        t += 0.100
    assert c.windows_behind == 1 and c.streams() == 9  # 12 x 0.75
    assert c.info()["limit_streams"] == 9.0
    c.untimed(t)  # the loop waits (the tick under way ends here): that wait is no tick's
    t += 60.0
    for _ in range(300):  # four seconds (and a bit) of 14 ms ticks at 9 streams
        c.tick_started(9, t)
        t += 0.014
    # 9 -> 9.5 -> 10 -> 10.5, then 9 streams are no evidence for an 11th
    assert c.windows_behind == 1 and c.streams() == 10 and c.limit == 10.5
    for _ in range(80):  # a second of ticks stepping 2 streams, the loop idle between
        c.tick_started(2, t)
        t += 0.014
        c.untimed(t)  # nothing running: no evidence for more
        t += 0.050
    assert c.limit == 10.5
    for _ in range(80):  # ... but 11 running, every one paused ahead of its listener now and then
        c.tick_started(2, t)
        t += 0.014
        c.untimed(t, ahead=11)
        t += 0.050
    # each 32 ticks (two seconds) a window: 10.5 -> 11 -> 11.5
    assert c.limit == 11.5
    c.forget_ticks()  # a new warm-up: the slow start again
    assert c.streams() == 2 and c.slow_start


def test_streams_a_tick_skips_count_as_kept_in_time_if_stepping_them_would_be() -> None:
    """While a new stream makes its first frame a tick steps only the streams short of audio
    (step_slack_s): under a steady flow of arrivals 1-2 of 8 running streams a tick. Those
    skipped are in time too, where stepping them as well would keep the ticks in time by the
    estimate: counted as stepped only, the limit stayed at 8 on an H200 (ticks of 12 ms
    where 64 fit) and at 4 on the tiny demo model."""
    c = Capacity(max_streams=64, margin=0.25, deadline_s=2.0)
    for _ in range(20):  # a GPU: a row more costs next to nothing
        c.observe(2, 0.012)
        c.observe(8, 0.013)
    t = 0.0
    for want in (4, 8, 16, 32):  # the slow start, with the limit's streams running each time
        for _ in range(100):  # a second of 12 ms ticks stepping 2 streams of those running
            c.tick_started(2, t, running=int(c.limit))
            t += 0.012
        assert c.limit == want  # doubled by each window once it closes
    assert c.windows_behind == 0
    for _ in range(100):  # but streams well below the limit running are still no evidence
        c.tick_started(2, t, running=3)
        t += 0.012
    assert c.limit == 32

    cpu = Capacity(max_streams=64, margin=0.25, deadline_s=2.0)
    for _ in range(20):  # 2 cores: each stream a share of the tick
        cpu.observe(1, 0.025)
        cpu.observe(2, 0.050)
    t = 0.0
    for _ in range(3):  # 2 of 4 stepped in 25 ms ticks: all 4 would take 100 ms, not in time
        for _ in range(41):
            cpu.tick_started(2, t, running=4)
            t += 0.025
    # 2 -> 2.5 -> 3 -> 3.5: doubling to 4 would take 100 ms ticks; a third stream fits (50 ms)
    assert cpu.limit == 3.5 and cpu.windows_behind == 0


def test_a_fast_model_whose_streams_wait_paused_judges_a_second_of_wall_time() -> None:
    """The tiny demo model at light load: 1 ms ticks, its streams paused far ahead of their
    listeners most of the time. A window of a second of ticks took a minute to gather, and
    meanwhile the slow start's limit of 2 refused 6 to 13 of 38 sessions."""
    c = Capacity(max_streams=16, margin=0.25, deadline_s=2.0)
    for _ in range(20):
        c.observe(1, 0.001)
        c.observe(4, 0.002)
    t = 0.0
    for _ in range(3):  # three seconds: 40 ticks each, every stream paused between them
        for _ in range(40):
            c.tick_started(1, t, running=int(c.limit))
            t += 0.001
            c.untimed(t, ahead=int(c.limit))
            t += 0.024
    t += 0.1  # the third window closes (its second is over)
    c.tick_started(1, t)
    assert c.limit == 16.0 and c.windows_behind == 0  # 2 -> 4 -> 8 -> 16
    # slow ticks (70 ms at 16 streams) in seconds of paused streams, but too few of them to
    # judge the pace by: no window closes ...
    for _ in range(13):
        c.tick_started(16, t)
        t += 0.070
        c.untimed(t, ahead=16)
        t += 0.500
    assert c.windows_behind == 0 and c.limit == 16.0
    for _ in range(3):  # ... until they make a second of ticks: behind
        c.tick_started(16, t)
        t += 0.070
        c.untimed(t, ahead=16)
        t += 0.500
    assert c.windows_behind == 1 and c.streams() == 11  # 3/4 of the 15 streams running on average


def test_the_slow_start_doubles_only_as_far_as_the_ticks_would_stay_in_time() -> None:
    """The mid demo model on 2 cores: about 13 ms a stream. A second in time at 4 streams
    (52 ms ticks) doubled the limit to 8, and the fifth stream admitted made every tick late."""
    c = Capacity(max_streams=16, margin=0.25, deadline_s=2.0)
    for _ in range(20):
        c.observe(1, 0.013)
        c.observe(4, 0.052)
    c.limit = 4.0  # the slow start got here
    c.window(4.0, 0.052)  # 8 streams: 52 + 52 ms; 5: 65 ms x 1.25 > 80 ms; half a stream more
    assert c.limit == 4.5 and c.slow_start and c.streams() == 4
    c.window(4.0, 0.052)  # and no more: a fifth would not keep the ticks in time
    assert c.limit == 4.5 and c.windows_behind == 0
    c.window(4.0, 0.030)  # faster ticks (a neighbour's load gone): 30 + 13 ms fits a fifth
    assert c.limit == 5.0
    c.window(2.0, 0.010)  # but doubling, when the ticks say so, in the slow start still
    assert c.limit == 5.0  # (2 streams well below the limit: no evidence)
    c.window(5.0, 0.020)  # 20 ms at 5: 10 streams would take 85 ms; 5 more do not fit, 0.5 does
    assert c.limit == 5.5
