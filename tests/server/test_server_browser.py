"""The browser page in headless Chromium (Debian's, driven by Playwright).

The page exposes what it measured as ``window.streamtts``: every chunk's
scheduled start on the AudioContext clock, underruns, segments, TTFA, and an
output meter (an AudioWorklet on the same clock: when sound last started and
stopped). The tests assert that audio arrived and was scheduled back to back
(each chunk starts exactly where the previous one ends, with no underrun);
that Stop, and a new Speak during playback, silence the output within 100 ms
of the click on that clock although seconds of audio were still scheduled;
that "done" comes once playback has ended; that a refused start is final and
the next Speak works with fresh stats; and that a dropped clip becomes the
voice the next run speaks with.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

TEXT = (
    "Hello from the browser page, this is the first sentence. "
    "Here comes the second sentence, right after the first one. "
    "And a third one closes the short demo."
)


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "4", "--max-sessions", "4", "--n-threads", "2")


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


# -- Stop, re-run, refused start, upload, model notice ------------------------------------------
LONG_TEXT = " ".join(
    f"This is sentence number {i} of a long text, so that seconds of audio are scheduled ahead."
    for i in range(1, 9)
)
# A head start of 2 s: when sound starts, seconds of audio are already scheduled, even when the
# shared test machine generates slowly. Stop must silence those too.
STOP_PREROLL_S = 2.0
MAX_SILENCE_S = 0.1  # the bound, on the page's audio clock


def start_long_run(page: Any, server: Any) -> float:
    """Speak LONG_TEXT; return once sound is playing, with the seconds scheduled ahead."""
    page.goto(f"{server.http}/?preroll={STOP_PREROLL_S}")
    page.fill("#text", LONG_TEXT)
    page.fill("#seed", "5")
    page.click("#speak")
    page.wait_for_function("window.streamtts.meter.sound === true", timeout=90_000)
    assert page.evaluate("window.streamtts.meter.ready"), "the output meter (AudioWorklet) did not load"
    ahead: float = page.evaluate("run.nextStart - ctx.currentTime")
    return ahead


def silence_after(page: Any, click_time_expr: str) -> tuple[float, float]:
    """(seconds from the click to silence, seconds of silence observed since) on the audio clock."""
    try:
        page.wait_for_function("window.streamtts.meter.sound === false", timeout=5_000)
    except Exception as exc:  # Playwright's TimeoutError
        raise AssertionError("the output was still sounding 5 s after the click") from exc
    page.wait_for_timeout(1000)  # nothing scheduled may sound after that
    m = page.evaluate(f"({{meter: window.streamtts.meter, click: {click_time_expr}, now: ctx.currentTime}})")
    assert m["meter"]["sound"] is False, "sound came back after Stop: a scheduled source kept playing"
    return m["meter"]["silentSince"] - m["click"], m["now"] - m["meter"]["silentSince"]


def test_stop_silences_at_once(page: Any, server: Any) -> None:
    ahead = start_long_run(page, server)
    assert ahead > 0.5, f"only {ahead:.2f} s scheduled ahead: the test would not show a late stop"
    page.click("#stop")
    took, quiet = silence_after(page, "window.streamtts.stoppedAt")
    assert 0 <= took <= MAX_SILENCE_S, f"Stop took {took * 1000:.0f} ms to silence ({ahead:.1f} s were scheduled)"
    assert quiet >= 0.9
    st = page.evaluate("window.streamtts")
    assert st["state"] == "stopped"
    assert page.is_enabled("#speak") and not page.is_enabled("#stop")
    server.wait_idle()  # the cancel freed the server's session and engine slot


def test_second_speak_replaces_the_first(page: Any, server: Any) -> None:
    start_long_run(page, server)
    page.fill("#text", "A short second run.")
    page.click("#speak")
    # Silence first (the new run has a 2 s head start), then the new run alone; measured from
    # when the page silenced the first run (its click handler), as Stop is, on the audio clock
    took, _ = silence_after(page, "window.streamtts.replacedAt")
    assert 0 <= took <= MAX_SILENCE_S, f"the first run kept playing {took * 1000:.0f} ms after Speak"
    page.wait_for_function("window.streamtts.state === 'done'", timeout=90_000)
    st = page.evaluate("window.streamtts")
    assert st["run"] == 2 and st["errors"] == []
    assert [s["text"] for s in st["segments"]] == ["A short second run."]  # stats of run 2 only
    assert st["samples"] == st["done"]["frames"] * 1920
    # "done" only once the last scheduled sample has been heard
    last = st["schedule"][-1]
    assert st["playbackEnd"] >= last["start"] + last["samples"] / 24000
    server.wait_idle()


def test_refused_start_is_final_and_the_page_recovers(page: Any, server: Any) -> None:
    page.goto(f"{server.http}/?preroll={PREROLL_S}")
    page.fill("#text", "Hello there, this will be refused.")
    page.fill("#voice", "v_000000000000000000000000")
    page.click("#speak")
    page.wait_for_function("window.streamtts.state.startsWith('refused')", timeout=30_000)
    st = page.evaluate("window.streamtts")
    assert st["refused"]["code"] == "unknown_voice" and st["chunks"] == 0
    assert page.is_enabled("#speak") and not page.is_enabled("#stop")
    assert "unknown_voice" in page.inner_text("#log")
    page.wait_for_timeout(500)
    assert page.evaluate("window.streamtts.state").startswith("refused")  # not overwritten by the close
    server.wait_idle()
    # the next run starts from fresh stats
    page.fill("#voice", "")
    page.fill("#text", "Now it works.")
    page.click("#speak")
    page.wait_for_function("window.streamtts.state === 'done'", timeout=90_000)
    st = page.evaluate("window.streamtts")
    assert st["run"] == 2 and st["errors"] == [] and st["refused"] is None
    assert st["done"]["reason"] == "end" and st["samples"] == st["done"]["frames"] * 1920
    assert page.inner_text("#log") == ""
    server.wait_idle()


def test_dropped_clip_becomes_the_voice(page: Any, server: Any, voice_wav: Path) -> None:
    import base64

    page.goto(f"{server.http}/?preroll={PREROLL_S}")
    b64 = base64.b64encode(voice_wav.read_bytes()).decode()
    dt = page.evaluate_handle(
        """(b64) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], "voice.wav", { type: "audio/wav" }));
            return dt;
        }""",
        b64,
    )
    page.dispatch_event("#drop", "drop", {"dataTransfer": dt})
    page.wait_for_function("window.streamtts.upload && window.streamtts.upload.state !== 'uploading'", timeout=60_000)
    up = page.evaluate("window.streamtts.upload")
    assert up["state"] == "done" and up["voice_id"].startswith("v_"), up
    assert page.input_value("#voice") == up["voice_id"] and up["name"] == "voice.wav"
    page.fill("#text", "Spoken in the dropped voice.")
    page.click("#speak")
    page.wait_for_function("window.streamtts.state === 'done'", timeout=90_000)
    st = page.evaluate("window.streamtts")
    assert st["ready"]["voice"] == up["voice_id"] and st["done"]["frames"] > 0
    # a file that is not audio: one readable line, not a repr
    page.set_input_files("#clip", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not audio" * 100}])
    page.wait_for_function("window.streamtts.upload.state === 'error'", timeout=30_000)
    err = page.evaluate("window.streamtts.upload.error")
    assert "cannot read it as wav/flac/ogg" in err and "BytesIO" not in err and "<" not in err
    server.wait_idle()


def test_page_names_the_model_and_says_it_is_the_demo(page: Any, server: Any) -> None:
    page.goto(server.http + "/")
    page.wait_for_function("window.streamtts.info !== null", timeout=30_000)
    assert "demo model" in page.inner_text("#model")
    assert page.is_visible("#notice") and "tones, not words" in page.inner_text("#notice")
    icon = page.request.get(server.http + "/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")


def test_the_voice_field_offers_the_server_s_voices(page: Any, server: Any) -> None:
    """The page lists the voices a run may name (a datalist on the voice field), the OpenAI
    names marked as aliases of the model's own voice."""
    page.goto(f"{server.http}/?preroll={PREROLL_S}")
    page.wait_for_function("window.streamtts.voices > 0", timeout=30_000)
    options = page.eval_on_selector_all("#voice-list option", "els => els.map(e => [e.value, e.label])")
    labels = dict(options)
    assert page.get_attribute("#voice", "list") == "voice-list"
    assert labels["default"] == "default: the model's own voice"
    assert labels["alloy"] == "alloy: an alias of the model's own voice"
