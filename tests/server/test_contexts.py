"""Contexts: several independent streams on one ``/v1/stream`` WebSocket (docs/protocol.md).

First the sans-I/O session (no sockets), then a real ``streamtts serve`` process: two
contexts interleave, cancelling one leaves the other's bytes identical to a run alone, and
every refusal (a reused id, one context too many, a bad id) is an error the session survives.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest
import websockets

from streamtts.client import Audio, ClientSession, StreamClient
from streamtts.request import StreamStats, Voice
from streamtts.server.protocol import Done, Error, ErrorCode
from streamtts.server.session import (
    Abort,
    Action,
    Close,
    EndInput,
    SendAudio,
    SendText,
    Session,
    SessionSettings,
    Synthesize,
)

VOICE = Voice(codes=np.zeros((10, 32), np.int64), name="v")
STATS = StreamStats(t_submit=1.0, t_first_audio=1.5, finish_reason="audio_end")


def make(**kw: Any) -> Session:
    s = Session(SessionSettings(**kw), voices=lambda vid: VOICE if vid == "v_known" else None)
    s.receive_text(json.dumps({"type": "start", "seed": 1}))
    s.actions()
    return s


def send(s: Session, **msg: Any) -> list[Action]:
    s.receive_text(json.dumps(msg))
    return s.actions()


def messages(actions: list[Action]) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, SendText)]


def pcm(n: int = 1920) -> np.ndarray:
    return np.linspace(-0.5, 0.5, n, dtype=np.float32)


# -- the session state machine ---------------------------------------------------------------------


def test_two_contexts_are_independent_streams_of_one_session() -> None:
    s = make()
    a = send(s, type="text", text="First context, first sentence here. ", context_id="a")
    b = send(s, type="text", text="Second context speaks too.", context_id="b", flush=True)
    assert [(x.index, x.context_id) for x in a if isinstance(x, Synthesize)] == [(0, "a")]
    assert [(x.index, x.context_id) for x in b if isinstance(x, Synthesize)] == [(0, "b")]
    # audio of a named context carries its header; segment messages their context
    s.audio(pcm(), 1, "b")
    (audio,) = [x for x in s.actions() if isinstance(x, SendAudio)]
    assert audio.context_id == "b" and json.loads(audio.header or "") == {
        "type": "audio", "context_id": "b", "bytes": len(audio.data)
    }  # fmt: skip
    s.segment_done(0, "Second context speaks too.", 0, 1, STATS, "b")
    assert messages(s.actions())[0]["context_id"] == "b"
    # `end` of one context: its EndInput, then (pipeline finished) its done; the session stays
    acts = send(s, type="end", context_id="b")
    assert [x for x in acts if isinstance(x, EndInput)] == [EndInput("b")]
    s.pipeline_finished("b")
    acts = s.actions()
    (done,) = messages(acts)
    assert done["type"] == "done" and done["context_id"] == "b" and done["reason"] == "end"
    assert done["segments"] == 1 and done["frames"] == 1 and not any(isinstance(x, Close) for x in acts)
    assert s.state == "streaming" and s.open_contexts == ["a"]
    # the session's end finishes every context still open, then the final done and the close
    acts = send(s, type="end")
    assert {x.context_id for x in acts if isinstance(x, EndInput)} == {None, "a"}
    assert [x.text for x in acts if isinstance(x, Synthesize)] == []  # "a" had nothing pending
    s.segment_done(0, "First context, first sentence here.", 0, 0, STATS, "a")
    s.pipeline_finished("a")
    assert [m["context_id"] for m in messages(s.actions()) if m["type"] == "done"] == ["a"]
    s.pipeline_finished(None)
    acts = s.actions()
    final = messages(acts)[-1]
    assert final["type"] == "done" and "context_id" not in final and final["segments"] == 2
    assert isinstance(acts[-1], Close) and acts[-1].code == 1000


def test_implicit_context_messages_are_unchanged() -> None:
    """A client without contexts sees no `context_id` key and no audio header."""
    s = make()
    send(s, type="text", text="Hello there, this is one sentence.", flush=True)
    s.audio(pcm(), 1)
    s.segment_done(0, "x", 0, 1, STATS)
    acts = s.actions()
    assert [x.header for x in acts if isinstance(x, SendAudio)] == [None]
    assert all("context_id" not in m for m in messages(acts))
    err = messages(send(s, type="bogus"))[0]
    assert "context_id" not in err and err["fatal"] is False


def test_cancelling_one_context_leaves_the_others_running() -> None:
    s = make()
    send(s, type="text", text="Context a has a long sentence to say.", context_id="a", flush=True)
    send(s, type="text", text="Context b has its own sentence too.", context_id="b", flush=True)
    acts = send(s, type="cancel", context_id="a")
    assert acts[0] == Abort("a")
    (done,) = messages(acts)
    assert done["type"] == "done" and done["reason"] == "cancelled" and done["context_id"] == "a"
    assert not any(isinstance(x, Close) for x in acts) and s.state == "streaming"
    # the cancelled context's pipeline may still deliver a late event: nothing comes of it
    s.audio(pcm(), 1, "a")
    s.segment_done(0, "x", 0, 1, STATS, "a")
    assert s.actions() == []
    s.audio(pcm(), 1, "b")
    assert [x.context_id for x in s.actions() if isinstance(x, SendAudio)] == ["b"]
    # a cancel that crosses the context's done is ignored; a reuse of the id is refused
    assert send(s, type="cancel", context_id="a") == []
    for msg in ({"type": "text", "text": "again"}, {"type": "flush"}, {"type": "end"}):
        err = messages(send(s, **msg, context_id="a"))[0]
        assert err["code"] == ErrorCode.CONTEXT_CLOSED and err["context_id"] == "a"
        assert "'a'" in err["message"]
    assert s.open_contexts == ["b"]


def test_the_session_cancel_ends_every_context() -> None:
    s = make()
    send(s, type="text", text="one", context_id="a")
    send(s, type="text", text="two", context_id="b")
    acts = send(s, type="cancel")
    assert acts[0] == Abort(None)
    dones = [m for m in messages(acts) if m["type"] == "done"]
    assert [d.get("context_id") for d in dones] == ["a", "b", None]
    assert all(d["reason"] == "cancelled" for d in dones) and isinstance(acts[-1], Close)


def test_too_many_contexts_is_refused_and_a_slot_frees_when_one_finishes() -> None:
    s = make(max_contexts=2)
    send(s, type="text", text="x", context_id="a")
    send(s, type="text", text="y", context_id="b")
    err = messages(send(s, type="text", text="z", context_id="c"))[0]
    assert err["code"] == ErrorCode.TOO_MANY_CONTEXTS and err["context_id"] == "c" and not err["fatal"]
    assert s.open_contexts == ["a", "b"]
    send(s, type="cancel", context_id="a")
    acts = send(s, type="text", text="Now context c fits in.", context_id="c", flush=True)
    assert [x.context_id for x in acts if isinstance(x, Synthesize)] == ["c"]


def test_ready_states_the_cap_and_bad_context_ids_are_invalid_messages() -> None:
    s = Session(SessionSettings(max_contexts=3))
    s.receive_text(json.dumps({"type": "start"}))
    ready = messages(s.actions())[0]
    assert ready["limits"]["max_contexts"] == 3
    for bad in ("", "x" * 129, 5, None, ["a"]):
        msg = {"type": "text", "text": "hi", "context_id": bad}
        acts = send(s, **msg)
        if bad is None:  # null = the implicit context
            assert not messages(acts)
            continue
        (err,) = messages(acts)
        assert err["code"] == ErrorCode.INVALID_MESSAGE, (bad, err)
    err = messages(send(s, type="start", context_id="a"))[0]
    assert err["code"] == ErrorCode.INVALID_MESSAGE  # start is the session's, never a context's


def test_old_context_ids_are_remembered_up_to_a_bound() -> None:
    s = make(remembered_contexts=2)
    for cid in ("a", "b", "c"):
        send(s, type="cancel", context_id=cid)  # never opened: done at once, id remembered
    assert messages(send(s, type="text", text="hi", context_id="c"))[0]["code"] == ErrorCode.CONTEXT_CLOSED
    assert messages(send(s, type="text", text="hi", context_id="a")) == []  # forgotten: a new one


# -- a real server ---------------------------------------------------------------------------------

MAX_NEW = 44
SERVER_ARGS = [
    "--max-streams", "6", "--max-sessions", "6", "--n-threads", "2", "--max-contexts", "2",
    "--segment-max-new-tokens", str(MAX_NEW), "--idle-timeout", "20",
]  # fmt: skip
GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
A = "Hello there, this is the first context speaking. It has a second sentence as well."
B = "And this is the second context, talking at the same time."


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve(*SERVER_ARGS)


@pytest.fixture(scope="module")
def voice_id(server: Any, voice_wav: Any) -> str:
    client = StreamClient(server.ws)
    return asyncio.run(client.upload_voice(voice_wav.read_bytes(), name="ctx"))


def client(server: Any, voice: str) -> StreamClient:
    return StreamClient(server.ws, seed=4, voice=voice, sampling=GREEDY, format="pcm_s16le_24000")


async def speak(s: ClientSession, texts: dict[str, str], cancel_after: dict[str, int] | None = None) -> dict[str, Any]:
    """Send each context's text and end; read until every context's done. ``cancel_after``:
    cancel a context once that many bytes of it arrived. Returns bytes, events, timings."""
    out: dict[str, Any] = {"audio": {c: bytearray() for c in texts}, "order": [], "done": {}, "t_cancel": {}}
    for cid, text in texts.items():
        await s.send_text(text, context_id=cid)
        await s.end(context_id=cid)
    pending = dict(cancel_after or {})
    async with asyncio.timeout(120):
        async for ev in s:
            if isinstance(ev, Audio):
                cid = ev.context_id
                assert cid in texts, f"audio of {cid!r}"
                assert cid not in out["done"], f"audio of {cid!r} after its done"
                out["audio"][cid] += ev.data
                out["order"].append(cid)
                if cid in pending and len(out["audio"][cid]) >= pending[cid]:
                    del pending[cid]
                    out["t_cancel"][cid] = time.monotonic()
                    await s.cancel(context_id=cid)
            elif isinstance(ev, Done):
                assert ev.context_id is not None
                if ev.context_id not in texts:
                    continue  # another context's (cancelled earlier)
                out["done"][ev.context_id] = ev
                if ev.context_id in out["t_cancel"]:
                    out["t_cancel"][ev.context_id] = time.monotonic() - out["t_cancel"][ev.context_id]
                if set(out["done"]) == set(texts):
                    return out
            elif isinstance(ev, Error):
                raise AssertionError(f"error {ev}")
    raise AssertionError("no done")


async def alone(server: Any, voice: str, cid: str, text: str) -> bytes:
    async with client(server, voice).session() as s:
        return bytes((await speak(s, {cid: text}))["audio"][cid])


def test_two_contexts_interleave_and_each_equals_its_run_alone(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[dict[str, Any], bytes, bytes]:
        async with client(server, voice_id).session() as s:
            both = await speak(s, {"a": A, "b": B})
            await s.end()
            final = [ev async for ev in s]
            assert isinstance(final[-1], Done) and final[-1].context_id is None
            assert final[-1].segments == both["done"]["a"].segments + both["done"]["b"].segments
        return both, await alone(server, voice_id, "a", A), await alone(server, voice_id, "b", B)

    both, a, b = asyncio.run(scenario())
    assert len(a) > 0 and len(b) > 0
    assert bytes(both["audio"]["a"]) == a and bytes(both["audio"]["b"]) == b
    order = both["order"]
    # interleaved: b's audio arrives before a's last frame and a's before b's last
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")
    assert order.index("a") < len(order) - 1 - order[::-1].index("b")
    for cid, text in (("a", A), ("b", B)):
        d = both["done"][cid]
        assert d.reason == "end" and d.chars == len(text) and len(both["audio"][cid]) == d.frames * 1920 * 2
    server.wait_idle()


def test_cancelling_one_context_leaves_the_other_byte_identical(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[dict[str, Any], bytes]:
        async with client(server, voice_id).session() as s:
            cut = await speak(s, {"a": A, "b": B}, cancel_after={"a": 1})
            # the session goes on: a new context on the same socket speaks
            more = await speak(s, {"c": B})
            await s.cancel()
        cut["c"] = bytes(more["audio"]["c"])
        return cut, await alone(server, voice_id, "b", B)

    cut, b = asyncio.run(scenario())
    done_a = cut["done"]["a"]
    assert done_a.reason == "cancelled" and cut["done"]["b"].reason == "end"
    assert bytes(cut["audio"]["b"]) == b, "the other context's audio changed"
    assert cut["c"] == b  # a context opened after the cancel speaks as on a fresh session
    # `speak` asserted no audio of "a" after its done; a is shorter than its whole text
    assert len(cut["audio"]["a"]) < len(cut["audio"]["b"]) * 2
    print(f"\ncancel -> acknowledged in {1000 * cut['t_cancel']['a']:.0f} ms")
    server.wait_idle()


def test_refusals_are_errors_and_the_session_keeps_working(server: Any, voice_id: str) -> None:
    async def scenario() -> tuple[list[Error], bytes]:
        async with client(server, voice_id).session() as s:
            await speak(s, {"a": "Short one."})
            await s.send_text("Again?", context_id="a")  # reused after done
            await s.send_text("one", context_id="x")
            await s.send_text("two", context_id="y")
            await s.send_text("three", context_id="z")  # over the cap of 2
            await s._send({"type": "flush", "context_id": ""})  # not a valid id
            errors: list[Error] = []
            async with asyncio.timeout(30):
                async for ev in s:
                    if isinstance(ev, Error):
                        errors.append(ev)
                        if len(errors) == 3:
                            break
            await s.cancel(context_id="x")
            await s.cancel(context_id="y")
            out = await speak(s, {"z": B})  # a slot is free again: z speaks
            await s.end()
            final = [ev async for ev in s]
            assert isinstance(final[-1], Done) and final[-1].reason == "end"
        return errors, bytes(out["audio"]["z"])

    errors, z = asyncio.run(scenario())
    assert [(e.code, e.context_id, e.fatal) for e in errors] == [
        (ErrorCode.CONTEXT_CLOSED, "a", False),
        (ErrorCode.TOO_MANY_CONTEXTS, "z", False),
        (ErrorCode.INVALID_MESSAGE, None, False),
    ]
    assert z == asyncio.run(alone(server, voice_id, "z", B))
    server.wait_idle()


def test_a_client_without_contexts_sees_no_context_fields(server: Any) -> None:
    async def scenario() -> list[str | bytes]:
        frames: list[str | bytes] = []
        async with websockets.connect(server.ws) as ws:
            for m in ({"type": "start", "seed": 1}, {"type": "text", "text": "Hello, how are you?"}, {"type": "end"}):
                await ws.send(json.dumps(m))
            async for f in ws:
                frames.append(f)
        return frames

    frames = asyncio.run(scenario())
    texts = [json.loads(f) for f in frames if isinstance(f, str)]
    assert [t["type"] for t in texts][0] == "ready" and texts[-1]["type"] == "done"
    assert all("context_id" not in t and t["type"] != "audio" for t in texts)
    assert any(isinstance(f, bytes) for f in frames)
    assert "segment" in [t["type"] for t in texts]


def test_a_cancelled_context_frees_its_engine_streams_at_once(server: Any, voice_id: str) -> None:
    long = " ".join(f"Sentence number {i} of a long answer nobody will hear the end of." for i in range(10))

    async def scenario() -> float:
        async with client(server, voice_id).session() as s:
            out = await speak(s, {"a": long}, cancel_after={"a": 1})
            assert out["done"]["a"].reason == "cancelled"
            t0 = time.monotonic()
            while server.health()["active_streams"] or server.health()["queued_streams"]:
                assert time.monotonic() - t0 < 1.0, server.health()
                await asyncio.sleep(0.005)
            freed = time.monotonic() - t0
            again = await speak(s, {"b": B})  # the session speaks on
            assert again["done"]["b"].reason == "end"
            await s.cancel()
        return freed

    freed = asyncio.run(scenario())
    print(f"\nengine streams free {1000 * freed:.0f} ms after the cancelled context's done")
    server.wait_idle()
