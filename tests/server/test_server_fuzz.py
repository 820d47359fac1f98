"""Fuzzing the sans-I/O session: whatever a client sends, in whatever order, the session
answers with well-formed actions and never raises.

Random JSON values, random text and bytes, messages with random fields, deep nesting, and
random sequences of them interleaved with the I/O layer's events (audio, segment results,
timeouts, a stalled reader, a lost connection), with and without ``context_id``s (several
contexts on one session, some past the cap, some reused after their ``done``). The example count is bounded (CI runs it on
every push); ``STREAMTTS_FUZZ_EXAMPLES`` raises it for a longer hunt.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from streamtts.errors import (
    CodecError,
    EngineClosedError,
    GenerationError,
    InputError,
    OverloadedError,
    PromptTooLongError,
    QueueTimeoutError,
)
from streamtts.request import StreamStats, Voice
from streamtts.server.protocol import CLIENT_TYPES, CloseCode, ErrorCode, decode_client
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

EXAMPLES = int(os.environ.get("STREAMTTS_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a loaded CI machine must not turn slowness into a failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
VOICE = Voice(codes=np.zeros((4, 32), np.int64), name="v")
ERROR_CODES = {v for k, v in vars(ErrorCode).items() if k.isupper()}
CLOSE_CODES = {v for k, v in vars(CloseCode).items() if k.isupper()}
SERVER_TYPES = {"ready", "segment", "done", "error"}
START_FIELDS = [
    "voice", "language", "instruction", "quality", "seed", "sampling", "format", "min_chars",
    "clause_min_chars", "max_new_tokens", "normalize",
]  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
# plausible values for the fields the server reads, so fuzzing reaches past decoding
field_values = st.one_of(
    json_values,
    st.sampled_from(["v_known", "v_nope", "ulaw_8000", "pcm", "mp3", "en", ""]),
    st.integers(-5, 2**64),
    st.dictionaries(st.sampled_from(["audio_temperature", "audio_top_p", "text_top_k", "bogus"]), json_values, max_size=3),
)


CONTEXTS = [None, "a", "b", "c", "d", "e"]  # more than the cap (3) of new_session()
context_ids = st.sampled_from(CONTEXTS)
some_context = st.one_of(
    st.sampled_from(["a", "b", "c", "d", "e", "", "x" * 200]), st.text(max_size=5), json_values
)


@st.composite
def client_messages(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*CLIENT_TYPES, "speak", "", "START"]))
    msg: dict[str, Any] = {"type": kind}
    if kind == "text" and draw(st.booleans()):
        msg["text"] = draw(st.text(max_size=80))
        if draw(st.booleans()):
            msg["flush"] = draw(st.one_of(st.booleans(), json_values))
    if draw(st.booleans()):
        msg["context_id"] = draw(some_context)
    names = START_FIELDS + ["text", "flush", "extra", "context_id"]
    for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        msg[name] = draw(field_values)
    if draw(st.integers(0, 9)) == 0:
        del msg["type"]
    return msg


words = st.text(alphabet="abc xyz.,!?\n字", min_size=1, max_size=40)
valid_messages = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("start")},
        optional={
            "format": st.sampled_from(["pcm", "ulaw_8000", "pcm_s16le_16000", "pcm_f32le_24000", "nope"]),
            "voice": st.sampled_from(["v_known", "v_nope"]),
            "seed": st.integers(-1, 100),
            "min_chars": st.integers(-1, 30),
            "max_new_tokens": st.integers(0, 50),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("text"), "text": words},
        optional={"flush": st.booleans(), "context_id": st.sampled_from(CONTEXTS[1:])},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["flush", "end", "cancel"])},
        optional={"context_id": st.sampled_from(CONTEXTS[1:])},
    ),
)


def deep(n: int) -> str:
    return '{"type": "start", "seed": ' + "[" * n + "]" * n + "}"


frames = st.one_of(
    valid_messages.map(lambda m: ("text", json.dumps(m))),
    valid_messages.map(lambda m: ("text", json.dumps(m))),  # twice: most of a session is valid
    client_messages().map(lambda m: ("text", json.dumps(m))),
    json_values.map(lambda v: ("text", json.dumps(v))),
    st.text(max_size=200).map(lambda t: ("text", t)),
    st.integers(1, 40_000).map(lambda n: ("text", "[" * n)),
    st.integers(1, 20_000).map(lambda n: ("text", deep(n))),
    st.binary(max_size=64).map(lambda b: ("bytes", b)),
)

exceptions = st.sampled_from(
    [
        InputError("empty"),
        PromptTooLongError("long"),
        OverloadedError("full"),
        QueueTimeoutError("waited"),
        EngineClosedError("closed"),
        GenerationError("boom"),
        CodecError("codec"),
        RuntimeError("bug"),
    ]
)

events = st.one_of(
    frames,
    st.tuples(st.just("audio"), st.integers(0, 4000), st.integers(0, 3), context_ids),
    st.tuples(st.just("segment_done"), st.integers(-1, 5), st.integers(0, 20), context_ids),
    st.tuples(st.just("segment_failed"), st.integers(-1, 5), exceptions, context_ids),
    st.tuples(st.just("pipeline_finished"), context_ids),
    st.sampled_from(
        [
            ("idle_timeout",),
            ("first_message_timeout",),
            ("send_stalled",),
            ("connection_lost",),
        ]
    ),
)


def apply(s: Session, ev: tuple[Any, ...]) -> None:
    kind = ev[0]
    if kind == "text":
        s.receive_text(ev[1])
    elif kind == "bytes":
        s.receive_bytes(ev[1])
    elif kind == "audio":
        s.audio(np.linspace(-1, 1, ev[1], dtype=np.float32), ev[2], ev[3])
    elif kind == "segment_done":
        stats = StreamStats(t_submit=1.0, t_first_audio=1.25, finish_reason="audio_end")
        s.segment_done(ev[1], "text", 0, ev[2], stats, ev[3])
    elif kind == "segment_failed":
        s.segment_failed(ev[1], "text", ev[2], ev[3])
    elif kind == "pipeline_finished":
        s.pipeline_finished(ev[1])
    elif kind == "send_stalled":
        s.send_stalled(10.0)
    else:
        getattr(s, kind)()


class Checker:
    """What must hold of every action a session emits, over its whole life."""

    def __init__(self) -> None:
        self.closed = False
        self.configured = False
        self.ready = 0
        self.next_segment: dict[str | None, int] = {}  # per context
        self.done: set[str] = set()  # named contexts whose `done` was sent
        self.ended: set[str | None] = set()  # contexts sent EndInput

    def check(self, actions: list[Action]) -> None:
        for a in actions:
            assert not self.closed or isinstance(a, Abort), f"{a} after the close"
            if isinstance(a, SendText):
                msg = json.loads(a.data)
                assert isinstance(msg, dict) and msg["type"] in SERVER_TYPES, msg
                cid = msg.get("context_id")
                assert "context_id" not in msg or isinstance(cid, str), msg  # absent, never null
                if msg["type"] == "error":
                    assert msg["code"] in ERROR_CODES and msg["message"], msg
                    assert a.error_code == msg["code"]
                if msg["type"] == "ready":
                    self.ready += 1
                    assert self.ready == 1, "a second ready"
                if msg["type"] == "segment":
                    assert cid not in self.done, f"segment of {cid!r} after its done"
                if msg["type"] == "done" and cid is not None:
                    assert cid not in self.done, f"a second done for {cid!r}"
                    self.done.add(cid)
            elif isinstance(a, Configure):
                assert not self.configured, "configured twice"
                self.configured = True
            elif isinstance(a, Synthesize):
                cid = a.context_id
                assert self.configured and a.text.strip()
                assert cid not in self.done and cid not in self.ended, f"segment for {cid!r} after its end"
                assert a.index == self.next_segment.get(cid, 0)
                self.next_segment[cid] = a.index + 1
            elif isinstance(a, EndInput):
                assert self.configured and a.context_id not in self.ended and a.context_id not in self.done
                self.ended.add(a.context_id)
            elif isinstance(a, SendAudio):
                assert self.configured and a.data and a.seconds > 0
                assert a.context_id not in self.done, f"audio of {a.context_id!r} after its done"
                if a.context_id is None:
                    assert a.header is None
                else:
                    assert a.header is not None
                    head = json.loads(a.header)
                    assert head == {"type": "audio", "context_id": a.context_id, "bytes": len(a.data)}
            elif isinstance(a, Close):
                assert a.code in CLOSE_CODES
                self.closed = True
            else:
                assert isinstance(a, Abort), a


def new_session() -> Session:
    limits = SessionSettings(
        max_message_bytes=1 << 20, max_text_chars=60, max_session_chars=300, max_contexts=3
    )
    return Session(limits, voices=lambda vid: VOICE if vid == "v_known" else None)


@FUZZ
@given(st.lists(events, max_size=25))
def test_random_event_sequences_never_raise_and_stay_well_formed(seq: list[tuple[Any, ...]]) -> None:
    s = new_session()
    checker = Checker()
    for ev in seq:
        apply(s, ev)  # raising anything at all fails the test
        checker.check(s.actions())
        if ev[0] == "connection_lost":
            checker.closed = True  # nobody to send a close to
    assert s.closed == checker.closed
    # what the examples reached (pytest --hypothesis-show-statistics)
    segments = sum(checker.next_segment.values())
    event(f"state {s.state}, {segments} segment(s), close {s.close_code}")
    event(f"{len(checker.next_segment)} context(s) spoke, {len(checker.done)} named done")


@FUZZ
@given(st.one_of(st.text(max_size=300), json_values.map(json.dumps), client_messages().map(json.dumps)))
def test_decoding_never_raises(raw: str) -> None:
    d = decode_client(raw)
    assert (d.message is None) != (d.error is None)
    if d.error is not None:
        assert d.error.code in ERROR_CODES and d.error.message
    for data in (raw.encode("utf-8", "surrogatepass"), raw):
        decode_client(data)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_as_a_text_frame_are_refused_cleanly(data: bytes) -> None:
    s = new_session()
    s.receive_text(data.decode("utf-8", "replace"))
    Checker().check(s.actions())
    d = decode_client(data)
    assert (d.message is None) != (d.error is None)


context_events = st.one_of(
    valid_messages.map(lambda m: ("text", json.dumps(m))),
    valid_messages.map(lambda m: ("text", json.dumps(m))),
    valid_messages.map(lambda m: ("text", json.dumps(m))),  # mostly messages, on contexts
    st.tuples(st.just("audio"), st.integers(1, 4000), st.integers(0, 3), context_ids),
    st.tuples(st.just("segment_done"), st.integers(0, 5), st.integers(0, 20), context_ids),
    st.tuples(st.just("pipeline_finished"), context_ids),
)


@FUZZ
@given(st.lists(context_events, max_size=40))
def test_sessions_with_contexts_stay_well_formed(seq: list[tuple[Any, ...]]) -> None:
    """A started session driven mostly by well-formed messages on several contexts (the
    random sequences above rarely get that far): every context's segments in order, nothing
    of a context after its done, never a second done, never a raise."""
    s = new_session()
    checker = Checker()
    s.receive_text(json.dumps({"type": "start", "voice": "v_known"}))
    checker.check(s.actions())
    for ev in seq:
        apply(s, ev)
        checker.check(s.actions())
    assert len(s.open_contexts) <= 3
    event(f"{len(checker.next_segment)} context(s) spoke, {len(checker.done)} named done, {s.state}")
