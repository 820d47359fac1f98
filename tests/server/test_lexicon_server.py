"""Pronunciation lexicons through a real server (issue 38 item 5): its own (``--lexicon FILE``),
stored ones shared through a real redis-server (``POST /v1/lexicons``), and a request's
(``lexicon`` on the WebSocket ``start`` and the speech body), over real sockets on the demo
model.

The prompt is observed through the audio: with a seed, the demo model's sampled audio follows
the prompt's text, so a request read with ``{"tomato": "toe may toe, or tomahto"}`` sounds
exactly like the text written so and unlike "tomato"; its word times and its ``segment``
still say "tomato". Every bad lexicon is refused naming the entry at fault, and the server carries on.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import websockets
from conftest import RedisServer, free_port

from streamtts.client import StreamClient
from streamtts.server.lexicon_store import LexiconStore
from streamtts.server.voice_redis import RedisVoices
from streamtts.server.voice_store import VoiceStoreSettings

MAX_NEW = 40
SERVER_LEX = {"nginx": "engine x"}
TEXT = "I like tomato soup."
RESPELLED = "I like toe may toe, or tomahto soup."
LEX = {"tomato": "toe may toe, or tomahto"}
# sampled at temperature 1: the demo model's audio then follows the prompt's text
SAMPLED = {"seed": 3, "sampling": {"text_temperature": 1.0, "audio_temperature": 1.0}}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    srv = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    srv.start()
    yield srv.url
    srv.stop()


@pytest.fixture(scope="module")
def server(serve: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    lex = tmp_path_factory.mktemp("lexicon") / "server.json"
    lex.write_text(json.dumps(SERVER_LEX), encoding="utf-8")
    return serve("--max-streams", "2", "--n-threads", "2", "--segment-max-new-tokens", str(MAX_NEW),
                 "--lexicon", str(lex), "--voice-store", redis_url)  # fmt: skip


async def ws_session(server: Any, start: dict[str, Any], text: str | None) -> tuple[list[dict[str, Any]], bytes]:
    """One session: its JSON messages and its audio (``text`` None: the start is refused)."""
    msgs: list[dict[str, Any]] = []
    audio = b""
    async with websockets.connect(server.ws, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "format": "pcm_s16le_24000", **start}))
        if text is not None:
            await ws.send(json.dumps({"type": "text", "text": text}))
            await ws.send(json.dumps({"type": "end"}))
        async for m in ws:
            if isinstance(m, bytes):
                audio += m
                continue
            msgs.append(json.loads(m))
            if msgs[-1]["type"] == "done" or (msgs[-1]["type"] == "error" and text is None):
                break
    return msgs, audio


def ws_run(server: Any, start: dict[str, Any], text: str | None = None) -> tuple[list[dict[str, Any]], bytes]:
    return asyncio.run(ws_session(server, start, text))


def speech(server: Any, **body: Any) -> httpx.Response:
    body = {"input": TEXT, "response_format": "pcm", **SAMPLED, **body}
    return httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120)


def words_of(msgs: list[dict[str, Any]]) -> list[str]:
    return [w["word"] for m in msgs if m["type"] == "alignment" for w in m["words"]]


def test_ws_lexicon_changes_the_prompt_not_the_words(server: Any) -> None:
    start = {**SAMPLED, "timestamps": "words"}
    msgs, read = ws_run(server, {**start, "lexicon": LEX}, TEXT)
    assert [m for m in msgs if m["type"] == "error"] == []
    _, respelled = ws_run(server, start, RESPELLED)
    _, plain = ws_run(server, start, TEXT)
    assert read and read == respelled != plain  # the prompt said "tomahto"
    assert words_of(msgs) == TEXT.split()  # ... the words reported are as written
    assert [m["text"] for m in msgs if m["type"] == "segment"] == [TEXT]


def test_stream_client_lexicon(server: Any) -> None:
    def pcm(text: str, **kw: Any) -> Any:
        client = StreamClient(server.ws, seed=3, sampling=SAMPLED["sampling"], **kw)
        return asyncio.run(client.synthesize(text))

    assert np.array_equal(pcm(TEXT, lexicon=LEX), pcm(RESPELLED))


def test_the_servers_lexicon_applies_to_every_request_under_the_requests(server: Any) -> None:
    _, by_server = ws_run(server, SAMPLED, "The nginx admin.")
    _, written = ws_run(server, SAMPLED, "The engine x admin.")
    assert by_server == written
    _, overridden = ws_run(server, {**SAMPLED, "lexicon": {"nginx": "N G I N X"}}, "The nginx admin.")
    _, spelled = ws_run(server, SAMPLED, "The N G I N X admin.")
    assert overridden == spelled != by_server


def test_a_stored_lexicon_by_id_and_name_shared_through_redis(server: Any, redis_url: str) -> None:
    r = httpx.post(server.http + "/v1/lexicons?name=food", json=LEX, timeout=30)
    assert r.status_code == 201, r.text
    lid = r.json()["lexicon_id"]
    assert r.json() == {"lexicon_id": lid, "name": "food", "size": 1} and lid.startswith("lx_")
    again = httpx.post(server.http + "/v1/lexicons?name=food", json=LEX, timeout=30)
    assert (again.status_code, again.json()["lexicon_id"]) == (200, lid)
    listed = httpx.get(server.http + "/v1/lexicons", timeout=30).json()
    assert {"lexicon_id": lid, "name": "food", "size": 1} in listed["lexicons"]
    assert listed["server"] == {"size": 1} and listed["store"] == "redis"
    assert httpx.get(server.http + "/v1/lexicons/food", timeout=30).json()["entries"] == LEX

    respelled = speech(server, input=RESPELLED)
    assert respelled.status_code == 200 and respelled.content
    for ref in (lid, "food"):
        got = speech(server, lexicon=ref)
        assert got.status_code == 200 and got.content == respelled.content, ref
    _, by_ws = ws_run(server, {**SAMPLED, "lexicon": "food"}, TEXT)
    _, ws_respelled = ws_run(server, SAMPLED, RESPELLED)
    assert by_ws == ws_respelled

    # in Redis beside the voices: another replica finds it by name
    assert redis.Redis.from_url(redis_url).exists(f"streamtts:lexicon:{lid}")

    async def other_replica() -> Any:
        shared = RedisVoices(VoiceStoreSettings(url=redis_url))
        try:
            return await LexiconStore(shared=shared).fetch("food")
        finally:
            await shared.aclose()

    found = asyncio.run(other_replica())
    assert found is not None and found.entries == LEX and found.id == lid

    assert httpx.delete(server.http + f"/v1/lexicons/{lid}", timeout=30).status_code == 200
    assert httpx.delete(server.http + f"/v1/lexicons/{lid}", timeout=30).status_code == 404
    assert httpx.get(server.http + "/v1/lexicons/food", timeout=30).status_code == 404
    gone = speech(server, lexicon="food")
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "lexicon"
    assert "no stored lexicon 'food'" in gone.json()["error"]["message"]


CYCLE = {"tomato": "tomahto", "tomahto": "tomato"}
TOO_MANY = {f"w{i}": "x" for i in range(10_001)}


@pytest.mark.parametrize(
    ("lexicon", "code", "needle"),
    [
        (["tomato", "tomahto"], "invalid_message", "`$.lexicon`"),  # not a map
        ({"tomato": 3}, "invalid_option", 'lexicon["tomato"]: the replacement must be a string'),
        ({"tomato": ""}, "invalid_option", 'lexicon["tomato"]: the replacement is empty'),
        (CYCLE, "invalid_option", 'lexicon["tomato"]: a cycle: "tomato" -> "tomahto" -> "tomato"'),
        ({"tomato": "x" * 201}, "invalid_option", "the replacement is 201 characters; the limit is 200"),
        ("lx_000000000000000000000000", "invalid_option", "no stored lexicon"),
        ("", "invalid_option", "lexicon"),
    ],
)
def test_ws_bad_lexicons_are_named(server: Any, lexicon: Any, code: str, needle: str) -> None:
    msgs, _ = ws_run(server, {"lexicon": lexicon}, None)
    err = msgs[-1]
    assert (err["type"], err["code"]) == ("error", code), err
    assert needle in err["message"], err
    assert server.health()["status"] == "ok"


@pytest.mark.parametrize(
    ("lexicon", "code", "needle"),
    [
        ({"a": 1}, "invalid_option", 'lexicon["a"]: the replacement must be a string'),
        (CYCLE, "invalid_option", "a cycle"),
        (TOO_MANY, "invalid_option", "lexicon has 10001 entries; the limit is 10000"),
        ("no-such-lexicon", "invalid_option", "no stored lexicon 'no-such-lexicon'"),
    ],
)
def test_http_bad_lexicons_are_named(server: Any, lexicon: Any, code: str, needle: str) -> None:
    r = speech(server, lexicon=lexicon)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, "lexicon") and needle in err["message"], err
    # the same map refused by the store's endpoint
    if isinstance(lexicon, dict):
        r = httpx.post(server.http + "/v1/lexicons", json=lexicon, timeout=30)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert server.health()["status"] == "ok"


def test_http_bad_bodies(server: Any) -> None:
    r = speech(server, lexicon=[1, 2])  # not a map: the body does not decode
    assert r.status_code == 400 and "$.lexicon" in r.json()["error"]["message"], r.text
    for body, needle in [
        (b"[1, 2]", "lexicon must be a JSON object"),
        (b"{not json", "the body is not JSON"),
    ]:
        r = httpx.post(server.http + "/v1/lexicons", content=body, timeout=30)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    r = httpx.post(server.http + "/v1/lexicons?name=lx_000000000000000000000000", json=LEX, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"
    # and the server carries on
    ok = speech(server)
    assert ok.status_code == 200 and ok.content and server.health()["status"] == "ok"


def test_serve_refuses_a_bad_lexicon_file_before_loading(demo_model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(CYCLE), encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "streamtts", "serve", "--config", str(demo_model_dir / "config.yaml"),
         "--port", "0", "--lexicon", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode != 0
    assert f'--lexicon {bad}["tomato"]: a cycle' in res.stderr, res.stderr
