"""What a real-time listener hears of chunk arrival times (streamtts.audio.continuity)."""

from __future__ import annotations

import pytest

from streamtts.audio.continuity import continuity_row, play


def test_chunks_ahead_of_playback_play_without_underrun() -> None:
    # 0.5 s chunks every 0.4 s: always ahead of a listener who starts at once
    arrivals = [(10.0 + 0.4 * i, 0.5) for i in range(20)]
    assert play(arrivals, 0.0).underruns == 0


def test_a_late_chunk_is_an_underrun_unless_the_buffer_covers_it() -> None:
    # 0.2 s of audio, then the next arrives 0.35 s after the first: 0.15 s short at no buffer
    arrivals = [(1.0, 0.2), (1.35, 0.2), (1.5, 0.2)]
    p = play(arrivals, 0.0)
    assert p.underruns == 1 and p.longest_s == pytest.approx(0.15)
    # playback resumed at 1.35: runs out at 1.55, so the chunk at 1.5 is on time
    assert play(arrivals, 0.1).longest_s == pytest.approx(0.05)
    assert play(arrivals, 0.16).underruns == 0


def test_waits_accumulate_and_the_longest_is_kept() -> None:
    arrivals = [(0.0, 0.1), (0.3, 0.1), (0.4, 0.0), (1.0, 0.1)]  # empty chunks carry no audio
    p = play(arrivals, 0.0)
    assert p.underruns == 2
    assert p.longest_s == pytest.approx(0.6) and p.total_s == pytest.approx(0.8)


def test_continuity_row_shares_per_buffer() -> None:
    smooth = [(0.08 * i, 0.08) for i in range(50)]
    late_by_70ms = [(0.0, 0.08), (0.15, 0.08), (0.23, 0.08)]
    row = continuity_row([smooth, late_by_70ms])
    assert (row["c50"], row["c100"], row["c200"]) == (0.5, 1.0, 1.0)
    assert row["underrun_ms_max"] == 0.0  # at 100 ms neither runs dry
    assert continuity_row([]) == {}
