"""The sans-I/O session (streamtts.server.session) and the protocol messages, without sockets."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from streamtts.audio.formats import decode_audio, get_format
from streamtts.errors import (
    CodecError,
    GenerationError,
    InputError,
    OverloadedError,
    PromptTooLongError,
    QueueTimeoutError,
)
from streamtts.request import StreamStats, Voice
from streamtts.server.protocol import CloseCode, ErrorCode, decode_client
from streamtts.server.session import (
    Abort,
    Action,
    Close,
    Configure,
    EndInput,
    SendAudio,
    SendText,
    Session,
    SessionSettings,
    Synthesize,
)

VOICE = Voice(codes=np.zeros((10, 32), np.int64), name="v")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(**kw: Any) -> tuple[Session, Clock]:
    clock = Clock()
    s = Session(SessionSettings(**kw), voices=lambda vid: VOICE if vid == "v_known" else None, clock=clock)
    return s, clock


def send(s: Session, obj: Any) -> list[Action]:
    s.receive_text(obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False))
    return s.actions()


def messages(actions: list[Action]) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, SendText)]


def only_error(actions: list[Action]) -> dict[str, Any]:
    msgs = messages(actions)
    assert len(msgs) == 1 and msgs[0]["type"] == "error", msgs
    assert not any(isinstance(a, (Close, Abort, Synthesize)) for a in actions)
    return msgs[0]


def test_start_sends_ready_and_configures_the_pipeline() -> None:
    s, _ = make()
    acts = send(s, {"type": "start", "voice": "v_known", "seed": 7, "format": "ulaw", "language": "en"})
    cfg = [a for a in acts if isinstance(a, Configure)]
    assert len(cfg) == 1 and cfg[0].reference is VOICE
    assert cfg[0].options.seed == 7 and cfg[0].options.language == "en"
    (ready,) = messages(acts)
    assert ready["type"] == "ready" and ready["format"] == "ulaw_8000" and ready["sample_rate"] == 8000
    assert ready["encoding"] == "ulaw" and ready["voice"] == "v_known" and ready["session"] == s.id
    assert ready["limits"]["max_text_chars"] == 10_000
    assert s.state == "streaming"


def test_text_without_start_starts_with_defaults() -> None:
    s, _ = make()
    acts = send(s, {"type": "text", "text": "Hello there, this is a whole sentence. And more"})
    assert isinstance(acts[0], Configure) and acts[0].reference is None
    assert messages(acts)[0]["format"] == "pcm_s16le_24000"
    assert [a for a in acts if isinstance(a, Synthesize)] == [Synthesize(0, "Hello there, this is a whole sentence.")]
    acts = send(s, {"type": "flush"})
    assert acts == [Synthesize(1, "And more")]


def test_streamed_tokens_give_the_same_segments_as_whole_text() -> None:
    text = "Streaming text arrives one token at a time, from a language model. It should be cut at the same places! 好的。"
    whole, _ = make()
    want = [a for a in send(whole, {"type": "text", "text": text}) + send(whole, {"type": "end"}) if isinstance(a, Synthesize)]
    s, _ = make()
    got: list[Action] = []
    for i in range(0, len(text), 3):
        got += send(s, {"type": "text", "text": text[i : i + 3]})
    got += send(s, {"type": "end"})
    assert [a for a in got if isinstance(a, Synthesize)] == want
    assert len(want) >= 2


def test_text_flush_flag_flushes() -> None:
    s, _ = make()
    acts = send(s, {"type": "text", "text": "Short", "flush": True})
    assert [a for a in acts if isinstance(a, Synthesize)] == [Synthesize(0, "Short")]


def test_end_flushes_then_audio_segments_done_close() -> None:
    s, clock = make(default_format="pcm_s16le_24000")
    send(s, {"type": "text", "text": "One whole sentence here. Two"})
    acts = send(s, {"type": "end"})
    assert acts == [Synthesize(1, "Two"), EndInput()]
    assert s.state == "ended" and s.busy
    clock.t += 0.25
    pcm = np.full(1920, 0.25, np.float32)
    s.audio(pcm, frames=1)
    (audio,) = s.actions()
    assert isinstance(audio, SendAudio) and audio.data == np.full(1920, 8192, "<i2").tobytes()
    assert audio.seconds == pytest.approx(0.08)
    stats = StreamStats(t_submit=1.0, t_first_audio=1.5, finish_reason="audio_end")
    s.segment_done(0, "One whole sentence here.", 0, 1, stats)
    s.audio(pcm, frames=1)
    s.segment_done(1, "Two", 1, 1, stats)
    acts = s.actions()
    seg = [m for m in messages(acts) if m["type"] == "segment"]
    assert seg[0] == {
        "type": "segment", "index": 0, "text": "One whole sentence here.", "start_frame": 0, "end_frame": 1,
        "start_s": 0.0, "end_s": 0.08, "ttfa_ms": 500.0, "finish_reason": "audio_end",
    }  # fmt: skip
    assert seg[1]["start_frame"] == 1 and seg[1]["end_s"] == 0.16
    assert not s.busy
    clock.t += 1.0
    s.pipeline_finished()
    acts = s.actions()
    (done,) = messages(acts)
    assert done == {
        "type": "done", "reason": "end", "segments": 2, "frames": 2, "audio_s": 0.16,
        "ttfa_ms": 250.0, "rtf": round(0.25 / 0.16, 4), "chars": 28,
    }  # fmt: skip
    assert acts[-1] == Close(CloseCode.NORMAL, "done")
    assert s.closed


def test_resampled_session_flushes_the_resampler_tail() -> None:
    s, _ = make()
    send(s, {"type": "start", "format": "pcm_s16le_16000"})
    send(s, {"type": "text", "text": "Words to say"})
    send(s, {"type": "end"})
    s.audio(np.sin(np.arange(24000) / 10).astype(np.float32), frames=12)
    data = b"".join(a.data for a in s.actions() if isinstance(a, SendAudio))
    s.segment_done(0, "Words to say", 0, 12, None)
    s.pipeline_finished()
    acts = s.actions()
    data += b"".join(a.data for a in acts if isinstance(a, SendAudio))
    assert len(data) == 2 * 16000
    assert decode_audio(data, get_format("pcm_s16le_16000")).size == 16000


def test_cancel_before_start_sends_done_then_closes() -> None:
    s, _ = make()
    acts = send(s, {"type": "cancel"})
    done = messages(acts)
    assert done == [{
        "type": "done", "reason": "cancelled", "segments": 0, "frames": 0, "audio_s": 0.0,
        "ttfa_ms": None, "rtf": None, "chars": 0,
    }]  # fmt: skip
    assert acts[-1] == Close(CloseCode.NORMAL, "cancelled") and s.closed


def test_first_message_timeout() -> None:
    s, _ = make(first_message_timeout_s=2)
    assert not s.heard
    s.first_message_timeout()
    acts = s.actions()
    (err,) = messages(acts)
    assert err["code"] == ErrorCode.FIRST_MESSAGE_TIMEOUT and err["fatal"] and "2 s" in err["message"]
    assert acts[-1] == Close(CloseCode.POLICY, ErrorCode.FIRST_MESSAGE_TIMEOUT)
    s, _ = make()
    s.receive_bytes(b"x")  # any frame counts as the first message
    assert s.heard


def test_cancel_aborts_and_closes() -> None:
    s, _ = make()
    send(s, {"type": "text", "text": "Something long enough to be a segment. More"})
    acts = send(s, {"type": "cancel"})
    assert isinstance(acts[0], Abort)
    assert messages(acts)[0]["reason"] == "cancelled"
    assert acts[-1] == Close(CloseCode.NORMAL, "cancelled")
    # late audio and messages after the close are ignored
    s.audio(np.ones(100, np.float32), 1)
    assert send(s, {"type": "text", "text": "x"}) == [] and s.actions() == []


@pytest.mark.parametrize(
    "raw,code,may_be_start",
    [
        ("{not json", ErrorCode.INVALID_JSON, True),
        ('{"type": "speak", "text": "hi"}', ErrorCode.UNKNOWN_TYPE, False),
        ('{"type": 5}', ErrorCode.UNKNOWN_TYPE, False),
        ('{"text": "hi"}', ErrorCode.INVALID_MESSAGE, True),
        ('{"type": "text", "text": 42}', ErrorCode.INVALID_MESSAGE, False),
        ('{"type": "text"}', ErrorCode.INVALID_MESSAGE, False),
        ('{"type": "text", "text": "hi", "extra": 1}', ErrorCode.INVALID_MESSAGE, False),
        ('{"type": "start", "seed": "seven"}', ErrorCode.INVALID_MESSAGE, True),
        ('{"type": "start", "sampling": {"audio_temperature": "hot"}}', ErrorCode.INVALID_MESSAGE, True),
        ("[1, 2]", ErrorCode.INVALID_MESSAGE, False),
        ('"text"', ErrorCode.INVALID_MESSAGE, False),
        ("[" * 1000, ErrorCode.INVALID_MESSAGE, True),  # nested too deeply to read its type
        ('{"type": "start", "seed": ' + "[" * 30000 + "]" * 30000 + "}", ErrorCode.INVALID_MESSAGE, True),
        ('{"type": "text", "text": "hi", "x": ' + "[" * 30000 + "]" * 30000 + "}", ErrorCode.INVALID_MESSAGE, True),
    ],
)
def test_bad_messages_get_an_error_and_the_session_stays_usable(raw: str, code: str, may_be_start: bool) -> None:
    s, _ = make(max_message_bytes=1 << 20)
    err = only_error(send(s, raw))
    assert err["code"] == code and err["message"] and err["fatal"] is False
    acts = send(s, {"type": "text", "text": "Still works.", "flush": True})
    if may_be_start:
        # It may have been the client's `start`: text does not start the session with defaults.
        assert only_error(acts)["code"] == ErrorCode.NOT_STARTED and s.state == "idle"
        acts = send(s, {"type": "start"}) + send(s, {"type": "text", "text": "Still works.", "flush": True})
    assert Synthesize(0, "Still works.") in acts


def test_deep_nesting_is_named_in_the_error() -> None:
    s, _ = make(max_message_bytes=1 << 20)
    for raw in ("[" * 1000, '{"type": "start", "seed": ' + "[" * 30000 + "]" * 30000 + "}"):
        assert "nested too deeply" in only_error(send(s, raw))["message"]


def test_every_refused_start_leaves_the_session_waiting() -> None:
    """A `start` refused for a wrong field type is handled like one refused for a bad value."""
    for bad in (
        {"type": "start", "seed": "7", "format": "ulaw_8000"},  # wrong type: decoding refuses it
        {"type": "start", "format": "nope"},  # a bad value: the session refuses it
        "x" * 300,  # too large to read: it may have been the start
    ):
        s, _ = make(max_message_bytes=200)
        assert only_error(send(s, bad))["code"] in (
            ErrorCode.INVALID_MESSAGE, ErrorCode.INVALID_FORMAT, ErrorCode.MESSAGE_TOO_LARGE
        )
        for msg in ({"type": "text", "text": "Hello there."}, {"type": "flush"}):
            assert only_error(send(s, msg))["code"] == ErrorCode.NOT_STARTED, (bad, msg)
        assert s.state == "idle" and not any(isinstance(a, Configure) for a in s.actions())
        acts = send(s, {"type": "start", "format": "ulaw_8000"})
        assert messages(acts)[0]["format"] == "ulaw_8000"


@pytest.mark.parametrize("bad", [{"type": "start", "format": "nope"}, "{oops", "x" * 300])
def test_end_while_waiting_for_a_corrected_start_ends_the_session(bad: Any) -> None:
    """The client gives up on its `start`: `end` closes the session cleanly (`done`, 1000)."""
    s, _ = make(max_message_bytes=200)
    send(s, bad)
    send(s, {"type": "text", "text": "Hello there."})  # refused: not started
    acts = send(s, {"type": "end"})
    assert [m["type"] for m in messages(acts)] == ["done"]
    done = messages(acts)[0]
    assert done["reason"] == "end" and done["segments"] == 0 and done["frames"] == 0
    assert acts[-1] == Close(CloseCode.NORMAL, "done") and s.closed
    assert not any(isinstance(a, (Configure, Synthesize)) for a in acts)


def test_a_refused_message_after_the_start_changes_nothing() -> None:
    s, _ = make()
    send(s, {"type": "start", "format": "ulaw_8000"})
    assert only_error(send(s, "{oops"))["code"] == ErrorCode.INVALID_JSON
    assert Synthesize(0, "Still works.") in send(s, {"type": "text", "text": "Still works.", "flush": True})


def test_decoder_is_built_once_and_decodes_every_type() -> None:
    for raw in ('{"type":"start"}', '{"type":"text","text":"a"}', '{"type":"flush"}', '{"type":"end"}', '{"type":"cancel"}'):
        d = decode_client(raw)
        assert d.error is None and d.message is not None and not d.may_be_start


def test_read_then_receive_decodes_a_frame_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The I/O layer reads a frame (to fetch a named voice) and hands the session that same
    decode: the two steps give what receive_text gives, with one decode."""
    from streamtts.server import session as session_module

    seen: list[str] = []

    def counting(data: str) -> Any:
        seen.append(data)
        return decode_client(data)

    monkeypatch.setattr(session_module, "decode_client", counting)
    start = json.dumps({"type": "start", "voice": "v_known"})
    a, _ = make()
    d = a.read_text(start)
    assert d is not None and d.message is not None and seen == [start]
    a.receive_message(d)
    assert seen == [start]
    b, _ = make()
    b.receive_text(start)
    two_steps, one_call = messages(a.actions()), messages(b.actions())
    for m in two_steps + one_call:
        m.pop("session")  # a random id per session
    assert two_steps == one_call and two_steps[0]["type"] == "ready"
    assert seen == [start, start]
    # too large: refused before any decode, nothing left to receive
    small, _ = make(max_message_bytes=200)
    assert small.read_text(json.dumps({"type": "text", "text": "x" * 300})) is None
    assert len(seen) == 2 and only_error(small.actions())["code"] == ErrorCode.MESSAGE_TOO_LARGE
    # closed between the two steps (the voice fetch awaits): the message is dropped
    c, _ = make()
    d = c.read_text(start)
    c.connection_lost()
    c.actions()
    assert d is not None
    c.receive_message(d)
    assert c.actions() == []


def test_binary_frames_are_refused_but_harmless() -> None:
    s, _ = make()
    s.receive_bytes(b"\x00\x01")
    assert only_error(s.actions())["code"] == ErrorCode.BINARY_NOT_SUPPORTED
    assert s.state == "idle"


def test_text_after_end() -> None:
    s, _ = make()
    send(s, {"type": "text", "text": "Done soon."})
    send(s, {"type": "end"})
    assert only_error(send(s, {"type": "text", "text": "more"}))["code"] == ErrorCode.TEXT_AFTER_END
    assert send(s, {"type": "end"}) == []  # a second end is a no-op


def test_limits() -> None:
    s, _ = make(max_message_bytes=200, max_text_chars=50, max_session_chars=80)
    send(s, {"type": "start"})  # (before any start, a message too large to read may be the start)
    assert only_error(send(s, {"type": "text", "text": "x" * 300}))["code"] == ErrorCode.MESSAGE_TOO_LARGE
    assert only_error(send(s, {"type": "text", "text": "e" * 60}))["code"] == ErrorCode.TEXT_TOO_LONG
    send(s, {"type": "text", "text": "y" * 50})
    assert only_error(send(s, {"type": "text", "text": "z" * 40}))["code"] == ErrorCode.SESSION_TEXT_LIMIT
    assert s.n.chars == 50
    # multi-byte characters count as bytes for the message limit
    assert only_error(send(s, {"type": "text", "text": "字" * 60}))["code"] == ErrorCode.MESSAGE_TOO_LARGE


def test_start_errors_leave_the_session_idle() -> None:
    s, _ = make()
    assert only_error(send(s, {"type": "start", "format": "mp3"}))["code"] == ErrorCode.INVALID_FORMAT
    assert only_error(send(s, {"type": "start", "voice": "v_nope"}))["code"] == ErrorCode.UNKNOWN_VOICE
    bad = {"type": "start", "sampling": {"audio_top_p": 2.0}}
    assert only_error(send(s, bad))["code"] == ErrorCode.INVALID_OPTION
    assert only_error(send(s, {"type": "start", "seed": -1}))["code"] == ErrorCode.INVALID_OPTION
    assert only_error(send(s, {"type": "start", "max_new_tokens": 0}))["code"] == ErrorCode.INVALID_OPTION
    assert s.state == "idle"
    # text after a refused start does not silently start with the defaults
    assert only_error(send(s, {"type": "text", "text": "hi"}))["code"] == ErrorCode.NOT_STARTED
    assert messages(send(s, {"type": "start"}))[0]["type"] == "ready"
    assert only_error(send(s, {"type": "start"}))["code"] == ErrorCode.ALREADY_STARTED


def test_server_cap_on_max_new_tokens() -> None:
    s, _ = make(max_new_tokens=100)
    (cfg,) = [a for a in send(s, {"type": "start", "max_new_tokens": 500}) if isinstance(a, Configure)]
    assert cfg.options.max_new_tokens == 100
    s, _ = make(max_new_tokens=100)
    (cfg,) = [a for a in send(s, {"type": "start"}) if isinstance(a, Configure)]
    assert cfg.options.max_new_tokens == 100


@pytest.mark.parametrize(
    "exc,code,fatal,close",
    [
        (InputError("text is empty"), ErrorCode.INVALID_TEXT, False, None),
        (PromptTooLongError("too long"), ErrorCode.PROMPT_TOO_LONG, False, None),
        (OverloadedError("full"), ErrorCode.OVERLOADED, True, CloseCode.TRY_AGAIN_LATER),
        (QueueTimeoutError("waited"), ErrorCode.QUEUE_TIMEOUT, True, CloseCode.TRY_AGAIN_LATER),
        (GenerationError("boom"), ErrorCode.GENERATION_FAILED, True, CloseCode.INTERNAL),
        (CodecError("bad"), ErrorCode.CODEC_ERROR, True, CloseCode.INTERNAL),
        (RuntimeError("bug"), ErrorCode.INTERNAL_ERROR, True, CloseCode.INTERNAL),
    ],
)
def test_segment_failures(exc: BaseException, code: str, fatal: bool, close: int | None) -> None:
    s, _ = make()
    send(s, {"type": "text", "text": "A sentence. Another one"})
    s.segment_failed(0, "A sentence.", exc)
    acts = s.actions()
    (msg,) = messages(acts)
    assert msg["code"] == code and msg["fatal"] is fatal
    if fatal:
        assert isinstance(acts[0], Abort) and acts[-1] == Close(close, code)  # type: ignore[arg-type]
    else:
        assert not s.closed and not any(isinstance(a, Close) for a in acts)


def test_idle_timeout_and_slow_client() -> None:
    s, _ = make(idle_timeout_s=5)
    send(s, {"type": "start"})
    s.idle_timeout()
    acts = s.actions()
    assert messages(acts)[0]["code"] == ErrorCode.IDLE_TIMEOUT
    assert acts[-1] == Close(CloseCode.POLICY, ErrorCode.IDLE_TIMEOUT)

    s, _ = make()
    send(s, {"type": "text", "text": "x"})
    s.send_stalled(3.0)
    acts = s.actions()
    assert isinstance(acts[0], Abort)
    assert messages(acts)[0]["code"] == ErrorCode.SLOW_CLIENT
    assert acts[-1] == Close(CloseCode.POLICY, "client too slow", immediate=True)


def test_connection_lost_aborts_once() -> None:
    s, _ = make()
    send(s, {"type": "text", "text": "x"})
    s.connection_lost()
    assert s.actions() == [Abort()]
    s.connection_lost()
    assert s.actions() == []


# -- the WebSocket layer's send buffer (streamtts.server.ws.Outbox) ---------------------------------


def test_outbox_full_asks_whether_the_client_is_too_slow() -> None:
    import asyncio

    from streamtts.server.ws import Outbox

    async def main() -> tuple[bool, bool, int]:
        box = Outbox(limit_s=1.0)
        box.put("ready")
        for _ in range(3):
            box.put(b"x" * 10, seconds=0.5)  # 1.5 s queued: full
        assert await box.get() == "ready"  # messages do not count as audio
        asked = 0

        def too_slow() -> bool:
            nonlocal asked
            asked += 1
            return asked == 3

        dropped = not await box.wait_room(too_slow, poll_s=0.01)
        for _ in range(2):
            await box.get()  # 0.5 s left: room
        return dropped, await box.wait_room(lambda: True, poll_s=0.01), asked

    assert asyncio.run(main()) == (True, True, 3)


# -- pacing: how far audio runs ahead of the listener (streamtts.server.pacing) ----------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_listener_plays_in_real_time_from_the_first_audio() -> None:
    from streamtts.server.pacing import Listener

    clock = FakeClock()
    li = Listener(lead_s=2.0, acks=True, clock=clock)
    assert li.wait_s() == 0.0
    li.sent(3.0)  # playback starts now
    assert li.wait_s() == 1.0  # 3 s sent, 0 played: 1 s over the lead
    clock.t += 0.5
    assert li.wait_s() == 0.5
    clock.t += 0.5
    assert li.wait_s() == 0.0
    li.sent(2.0)
    clock.t += 10.0  # generation stalled: the player waits at the end of what it has
    assert li.consumed_s == 5.0 and li.wait_s() == 0.0
    li.sent(1.0)
    assert li.consumed_s == 5.0  # it resumes from there, not 10 s further
    clock.t += 0.25
    assert li.consumed_s == 5.25


def test_listener_reading_faster_than_real_time_is_sent_at_its_pace() -> None:
    from streamtts.server.pacing import Listener

    clock = FakeClock()
    li = Listener(lead_s=2.0, acks=True, clock=clock)
    li.sent(30.0)
    assert li.wait_s() == 28.0
    li.acked(30.0)  # a file writer read it all at once
    assert li.wait_s() == 0.0 and li.behind_s() == 0.0
    li.sent(5.0)  # its ping behind these 5 s wakes the sender when answered; else the clock
    assert li.wait_s() == 33.0


def test_listener_at_its_lead_by_a_float_waits_for_the_clock_not_for_rounding() -> None:
    """Acknowledged audio exactly at the lead, up to float rounding: the sender may send,
    or waits for the clock; never a wait of 2e-15 s that ends with nothing changed (the
    sender then spun the event loop, 80,000 turns a second)."""
    from streamtts.server.pacing import Listener

    clock = FakeClock()
    li = Listener(lead_s=4.0, acks=True, clock=clock)
    for _ in range(126):
        li.sent(0.08)  # 10.080000000000002 s
    li.acked(6.08)
    clock.t += 0.6
    assert li.sent_s - li.acked_s - li.lead_s > 0.0  # the rounding this is about
    assert li.wait_s() == 0.0
    li.sent(0.64)
    wait = li.wait_s()
    assert wait == pytest.approx(li.sent_s - li.lead_s - li.played_s)  # the clock's wait
    clock.t += wait
    assert li.wait_s() == 0.0


def test_listener_too_slow_means_behind_real_time() -> None:
    from streamtts.server.pacing import Listener

    clock = FakeClock()
    li = Listener(lead_s=4.0, acks=True, clock=clock)
    for _ in range(60):  # a client reading 1 s per s, 2 s of audio in hand: never behind
        li.sent(1.0)
        li.acked(li.sent_s)
        clock.t += 1.0
        assert li.behind_s() == 0.0
    slow = Listener(lead_s=4.0, acks=True, clock=clock)
    for _ in range(40):  # one reading 0.75 s per s falls behind a quarter second a second
        slow.sent(1.0)
        slow.acked(slow.sent_s * 0.75)
        clock.t += 1.0
    assert 9.0 < slow.behind_s() <= 10.0
    assert slow.too_slow(9.0) and not slow.too_slow(10.0)
    blind = Listener(lead_s=4.0, acks=False, clock=clock)  # no acknowledgements: unknown
    blind.sent(10.0)
    clock.t += 9.0
    assert blind.behind_s() == 0.0 and blind.wait_s() == 0.0 and not blind.too_slow(1.0)


def test_listener_that_reads_nothing_is_too_slow_whatever_the_buffers_hold() -> None:
    from streamtts.server.pacing import Listener

    clock = FakeClock()
    li = Listener(lead_s=4.0, acks=True, clock=clock)
    li.sent(1.0)  # all the socket takes: the sender waits on the socket from here
    clock.t += 5.0
    assert li.behind_s() == 1.0 and li.unread_for_s() == 5.0  # behind only what was sent
    assert li.too_slow(0.5) and not li.too_slow(1.5)  # over stall 0.5 + lead 4, not 1.5 + 4
    li.acked(0.5)  # it read some: the wait starts again
    assert li.unread_for_s() == 0.0
    clock.t += 2.0
    assert li.unread_for_s() == 2.0
    li.acked(1.0)  # all of it
    clock.t += 30.0
    assert li.unread_for_s() == 0.0  # nothing waits: a client with nothing to read is not slow
    li.sent(1.0)
    clock.t += 1.0
    assert li.unread_for_s() == 1.0


def test_outbox_abort_drops_audio_but_keeps_messages() -> None:
    import asyncio

    from streamtts.server.session import Close
    from streamtts.server.ws import Outbox

    async def main() -> list[object]:
        box = Outbox(limit_s=1.0)
        box.put(b"a", 0.5)
        box.put('{"type":"segment"}')
        box.put(b"b", 0.6)
        box.drop_audio()
        box.put(Close(1000, "done"))
        return [await box.get(), await box.get()]

    assert asyncio.run(main()) == ['{"type":"segment"}', Close(1000, "done")]
