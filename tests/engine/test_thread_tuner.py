"""The thread count per decode (streamtts.engine.thread_tuner): made-up decode times."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from streamtts.engine.thread_tuner import FIRST_PROBE, PROBE_EVERY, PROBE_ROUNDS, ThreadTuner


def run(t: ThreadTuner, rows: int, cost: Callable[[int], float], n: int) -> Counter[int]:
    """``n`` decodes of ``rows`` rows, each taking ``cost(threads)``; the counts used."""
    used: Counter[int] = Counter()
    for _ in range(n):
        k = t.threads(rows)
        used[k] += 1
        t.observe(rows, k, cost(k))
    return used


def test_candidates_are_powers_of_two_and_the_most() -> None:
    assert ThreadTuner(1).candidates == (1,) and not ThreadTuner(1).active
    assert ThreadTuner(2).candidates == (1, 2)
    assert ThreadTuner(6).candidates == (1, 2, 4, 6)
    assert ThreadTuner(16).candidates == (1, 2, 4, 8, 16)
    with pytest.raises(ValueError, match="max_threads"):
        ThreadTuner(0)


def test_one_thread_alone_runs_one_thread() -> None:
    t = ThreadTuner(1)
    assert run(t, 1, lambda k: 0.001, 1000) == Counter({1: 1000})


def test_a_fresh_tuner_uses_the_most_threads_until_its_first_probe() -> None:
    t = ThreadTuner(4)
    assert run(t, 1, lambda k: 0.001, FIRST_PROBE - 1) == Counter({4: FIRST_PROBE - 1})
    assert t.chosen() == {}


def test_a_one_row_decode_moves_to_fewer_threads_where_they_are_faster() -> None:
    """2 cores shared with other threads: one thread 0.8 ms, two 2.5 ms (a one-row tick of the
    tiny demo model under load); a 4-row decode is faster on two."""
    t = ThreadTuner(2)
    one_row = {1: 0.0008, 2: 0.0025}
    four_rows = {1: 0.004, 2: 0.0025}
    run(t, 1, one_row.__getitem__, FIRST_PROBE + 2 * PROBE_ROUNDS)
    run(t, 4, four_rows.__getitem__, FIRST_PROBE + 2 * PROBE_ROUNDS)
    assert t.chosen() == {1: 1, 4: 2}
    assert t.moves == 1
    # from here one-row decodes use one thread, but for the probes' few at two
    used = run(t, 1, one_row.__getitem__, 10 * PROBE_EVERY)
    assert 9 * PROBE_ROUNDS <= used[2] <= 10 * PROBE_ROUNDS  # a probe every PROBE_EVERY - 1 + 6
    assert t.threads(5) == 2 and t.threads(7) == 2  # 4-7 rows: one bucket


def test_it_moves_back_when_the_load_goes() -> None:
    t = ThreadTuner(2)
    run(t, 1, {1: 0.0008, 2: 0.0025}.__getitem__, FIRST_PROBE + 2 * PROBE_ROUNDS)
    assert t.chosen() == {1: 1}
    run(t, 1, {1: 0.0008, 2: 0.0005}.__getitem__, PROBE_EVERY + 2 * PROBE_ROUNDS)
    assert t.chosen() == {1: 2} and t.moves == 2


def test_a_neighbour_must_be_clearly_faster() -> None:
    t = ThreadTuner(2)
    run(t, 1, {1: 0.00096, 2: 0.001}.__getitem__, 5 * PROBE_EVERY)  # 4 % faster: noise
    assert t.chosen() == {1: 2} and t.moves == 0


def test_a_probe_tries_only_the_neighbours_and_moves_one_step() -> None:
    """16 threads: a probe tries 8 beside 16; 1 thread being the fastest is reached a step a
    probe, never through a jump to a count not measured beside the one in use."""
    t = ThreadTuner(16)
    cost = {1: 0.001, 2: 0.002, 4: 0.004, 8: 0.008, 16: 0.016}.__getitem__
    used = run(t, 1, cost, FIRST_PROBE + 2 * PROBE_ROUNDS)
    assert set(used) == {16, 8} and t.chosen() == {1: 8}
    for want in (4, 2, 1):
        run(t, 1, cost, PROBE_EVERY + 3 * PROBE_ROUNDS)
        assert t.chosen() == {1: want}
    used = run(t, 1, cost, PROBE_EVERY + 2 * PROBE_ROUNDS)  # at the lowest: 1 and 2 probed
    assert set(used) == {1, 2} and t.chosen() == {1: 1}


def test_an_observation_of_another_count_is_not_a_probes() -> None:
    t = ThreadTuner(2)
    run(t, 1, lambda k: 0.001, FIRST_PROBE - 1)
    k = t.threads(1)  # the probe starts
    t.observe(1, 3 - k, 0.5)  # a decode on the other count (not the probe's): ignored
    t.observe(1, k, 0.001)
    run(t, 1, {1: 0.001, 2: 0.001}.__getitem__, 2 * PROBE_ROUNDS - 1)
    assert t.chosen() == {1: 2} and t.moves == 0


def test_no_probe_runs_while_held() -> None:
    """``hold`` (a stream waits for its first audio): the count in use, no probe; the probe
    that was due runs at the first decode after, and one under way resumes where it was."""
    t = ThreadTuner(2)
    t.hold = True
    assert run(t, 1, lambda k: 0.001 if k == 1 else 0.002, FIRST_PROBE + 50) == Counter({2: FIRST_PROBE + 50})
    assert t.chosen() == {}
    t.hold = False
    run(t, 1, lambda k: 0.001 if k == 1 else 0.002, 3)  # the probe's first decodes
    t.hold = True
    assert run(t, 1, lambda k: 0.001 if k == 1 else 0.002, 10) == Counter({2: 10})  # held: none is a probe's
    t.hold = False
    run(t, 1, lambda k: 0.001 if k == 1 else 0.002, 2 * PROBE_ROUNDS - 3)
    assert t.chosen() == {1: 1}


def test_a_count_whose_decodes_stall_loses_to_a_steady_one() -> None:
    """Two threads: 0.16 ms, but one decode in three stalls 15 ms (both threads on one core);
    one thread: a steady 0.2 ms. Their medians favour two threads; their means one."""
    t = ThreadTuner(2)
    n = {"two": 0}

    def cost(k: int) -> float:
        if k == 1:
            return 0.0002
        n["two"] += 1
        return 0.015 if n["two"] % 3 == 0 else 0.00016

    run(t, 1, cost, FIRST_PROBE + 2 * PROBE_ROUNDS)
    assert t.chosen() == {1: 1}
