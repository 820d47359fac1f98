"""The browser page in headless Chromium (Debian's, driven by Playwright).

The page exposes what it measured as ``window.streamtts``: every chunk's
scheduled start on the AudioContext clock, underruns, segments, TTFA. The
test asserts that audio arrived and was scheduled back to back: each chunk
starts exactly where the previous one ends, with no underrun.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]
TEXT = (
    "Hello from the browser page, this is the first sentence. "
    "Here comes the second sentence, right after the first one. "
    "And a third one closes the short demo."
)


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "4", "--max-sessions", "4", "--n-threads", "2")


@pytest.fixture
def page(tmp_path: Path) -> Any:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium): apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a new, empty user data dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            yield ctx.new_page()
        finally:
            ctx.close()


# The page's head start before playback. Its default (0.1 s) is for a dedicated machine; the test
# machine may be shared with other jobs, and a stall of the CPU is not what this test is about:
# 1 s keeps it about the page's scheduling.
PREROLL_S = 1.0
# Above this real-time factor the server, not the page, is too slow for gapless playback.
MAX_RTF_FOR_NO_UNDERRUN = 0.7


def run_page(page: Any, server: Any, words: bool) -> dict[str, Any]:
    page.goto(f"{server.http}/?preroll={PREROLL_S}")
    page.fill("#text", TEXT)
    page.fill("#seed", "4")
    if words:
        page.check("#tokens")
    page.click("#speak")
    page.wait_for_function("window.streamtts.state === 'done'", timeout=90_000)
    stats: dict[str, Any] = page.evaluate("window.streamtts")
    stats["ui_segments"] = page.locator("#segments li").count()
    stats["ttfa_text"] = page.inner_text("#s-ttfa")
    return stats


def assert_gapless(stats: dict[str, Any]) -> None:
    assert stats["errors"] == [] and stats["closeCode"] == 1000
    assert stats["ready"]["format"] == "pcm_f32le_24000"
    done = stats["done"]
    assert done["reason"] == "end" and done["frames"] > 0
    # every sample the server sent arrived and was scheduled
    assert stats["samples"] == done["frames"] * 1920
    assert stats["chunks"] > done["segments"]
    sched = stats["schedule"]
    assert len(sched) == stats["chunks"] and sched[0]["start"] > 0
    why = f"underruns {stats['underruns']} ({stats['gapSeconds']:.2f} s), server RTF {done['rtf']}"
    for prev, cur in zip(sched, sched[1:], strict=False):
        if cur["late"]:  # an underrun: the chunk came after the previous one had finished playing
            assert cur["start"] > prev["start"] + prev["samples"] / 24000, why
            continue
        # back to back on the audio clock: this chunk starts where the previous one ends
        assert cur["start"] == pytest.approx(prev["start"] + prev["samples"] / 24000, abs=1e-9), why
    assert stats["underruns"] == sum(c["late"] for c in sched)
    if done["rtf"] > MAX_RTF_FOR_NO_UNDERRUN:
        # The server could not generate in real time (other jobs on the test machine's CPU):
        # gaps are then real and the page handled them (checked above); nothing to blame.
        warnings.warn(f"server ran at RTF {done['rtf']}: not checking for underruns ({why})", stacklevel=2)
        return
    assert stats["underruns"] == 0 and stats["gapSeconds"] == 0, why
    assert stats["ttfaMs"] is not None and stats["ttfaMs"] > 0 and stats["ttfa_text"].endswith("ms")


def test_page_streams_and_schedules_without_gaps(page: Any, server: Any) -> None:
    stats = run_page(page, server, words=False)
    assert_gapless(stats)
    assert [s["text"] for s in stats["segments"]] == [
        "Hello from the browser page, this is the first sentence.",
        "Here comes the second sentence, right after the first one.",
        "And a third one closes the short demo.",
    ]
    assert stats["ui_segments"] == 3
    # the page's audio clock runs at the stream's rate: no per-chunk resampling in the browser
    assert page.evaluate("ctx.sampleRate") == 24000
    server.wait_idle()


def test_page_word_by_word_speaks_the_same_segments(page: Any, server: Any) -> None:
    stats = run_page(page, server, words=True)
    assert_gapless(stats)
    assert len(stats["segments"]) == 3
    server.wait_idle()
