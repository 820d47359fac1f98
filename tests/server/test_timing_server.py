"""Word times through a real ``streamtts serve``: WebSocket ``alignment`` messages (words and
characters, per context, before their audio), a cancel's ``done`` saying what was sent, SSE
``speech.alignment`` events, ``engine.stream()`` chunks and ``synth --timestamps``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from streamtts.client import Audio, StreamClient
from streamtts.server.protocol import Alignment, Done

GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
TEXT = "Hello there, my friend. How are you today? I hope the weather is fine."


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "2", "--n-threads", "2", "--segment-max-new-tokens", "40")


async def _wire(url: str, start: dict[str, Any], texts: list[dict[str, Any]], cancel_after: int | None = None) -> list[Any]:
    """Every frame of a session: JSON messages as dicts, audio as bytes."""
    out: list[Any] = []
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "start", **start}))
        for t in texts:
            await ws.send(json.dumps(t))
        n_audio = 0
        async for msg in ws:
            if isinstance(msg, bytes):
                out.append(msg)
                n_audio += 1
                if cancel_after is not None and n_audio == cancel_after:
                    await ws.send(json.dumps({"type": "cancel"}))
                continue
            ev = json.loads(msg)
            out.append(ev)
            if ev["type"] == "done" and "context_id" not in ev:
                break
    return out


def test_websocket_alignment_words_before_their_audio_and_chars(server: Any) -> None:
    wire = asyncio.run(
        _wire(server.ws, {"timestamps": "chars", "seed": 3, "sampling": GREEDY},
              [{"type": "text", "text": TEXT}, {"type": "end"}])
    )  # fmt: skip
    assert wire[0]["type"] == "ready"
    sent_s = 0.0  # audio seconds on the wire so far (pcm_s16le_24000)
    words: list[dict[str, Any]] = []
    chars: list[str] = []
    for item in wire[1:]:
        if isinstance(item, bytes):
            sent_s += len(item) / 48000
            continue
        if item["type"] != "alignment":
            continue
        assert item["estimated"] is True
        for w in item["words"]:
            # a word goes out no later than its audio: its start is not in audio already sent
            assert w["start"] >= sent_s - 0.02, (w, sent_s)
            assert w["start"] <= w["end"]
        words += item["words"]
        chars += item["characters"]
        assert len(item["characters"]) == len(item["character_start_times_seconds"]) == len(item["character_end_times_seconds"])
    assert " ".join(w["word"] for w in words) == TEXT
    assert "".join(chars) == TEXT
    flat = [x for w in words for x in (w["start"], w["end"])]
    assert flat == sorted(flat)
    assert words[-1]["end"] <= sent_s + 1e-3
    done = wire[-1]
    assert done["type"] == "done" and done["reason"] == "end" and "sent" not in done


def test_no_alignment_unless_asked_and_a_bad_mode_is_refused(server: Any) -> None:
    wire = asyncio.run(_wire(server.ws, {"seed": 3}, [{"type": "text", "text": "Hello there."}, {"type": "end"}]))
    assert not any(isinstance(m, dict) and m["type"] == "alignment" for m in wire)

    async def bad() -> dict[str, Any]:
        async with websockets.connect(server.ws) as ws:
            await ws.send(json.dumps({"type": "start", "timestamps": "phonemes"}))
            return dict(json.loads(await ws.recv()))

    err = asyncio.run(bad())
    assert err["type"] == "error" and err["code"] == "invalid_option" and "words" in err["message"]


def test_cancel_done_says_which_words_were_sent(server: Any) -> None:
    long = " ".join(f"This is sentence number {i} of a long answer." for i in range(8))
    wire = asyncio.run(
        _wire(server.ws, {"timestamps": "words", "seed": 3, "sampling": GREEDY},
              [{"type": "text", "text": long, "flush": True}], cancel_after=4)
    )  # fmt: skip
    done = wire[-1]
    assert done["type"] == "done" and done["reason"] == "cancelled"
    sent = done["sent"]
    audio = sum(len(m) for m in wire if isinstance(m, bytes)) / 48000
    assert sent["samples"] == round(sent["audio_s"] * 24000) or abs(sent["samples"] - sent["audio_s"] * 24000) <= 24
    assert abs(sent["audio_s"] - audio) <= 0.002  # what the client received
    words = [w for m in wire if isinstance(m, dict) and m["type"] == "alignment" for w in m["words"]]
    heard = [w for w in words if w["end"] <= sent["audio_s"] + 1e-6]
    assert 0 < sent["words"] == len(heard) < len(long.split())
    assert sent["text"] == " ".join(w["word"] for w in heard)
    assert long.startswith(sent["text"])


def test_named_contexts_each_get_their_own_times(server: Any) -> None:
    async def run() -> dict[str, list[Alignment]]:
        client = StreamClient(server.ws, seed=3, sampling=GREEDY, timestamps="words")
        got: dict[str, list[Alignment]] = {"a": [], "b": []}
        async with client.session() as s:
            await s.send_text("First context speaks.", context_id="a")
            await s.send_text("Second one too.", context_id="b")
            await s.end(context_id="a")
            await s.end(context_id="b")
            dones = 0
            async for ev in s:
                if isinstance(ev, Alignment) and ev.context_id is not None:
                    got[ev.context_id].append(ev)
                elif isinstance(ev, Done) and ev.context_id is not None:
                    dones += 1
                    if dones == 2:
                        break
                elif isinstance(ev, Audio):
                    pass
        return got

    got = asyncio.run(run())
    for cid, text in (("a", "First context speaks."), ("b", "Second one too.")):
        words = [w for a in got[cid] for w in a.words]
        assert " ".join(w.word for w in words) == text
        assert words[0].start < 0.5  # each context's own clock


def test_sse_alignment_events(server: Any) -> None:
    body = {"input": "Hello there, my friend.", "voice": "alloy", "seed": 3, "sampling": GREEDY,
            "response_format": "pcm", "stream_format": "sse", "timestamps": "words"}  # fmt: skip
    r = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds.index("speech.alignment") < kinds.index("speech.audio.delta")
    words = [w for e in events if e["type"] == "speech.alignment" for w in e["words"]]
    assert [w["word"] for w in words] == ["Hello", "there,", "my", "friend."]
    assert all(e["estimated"] for e in events if e["type"] == "speech.alignment")
    r = httpx.post(server.http + "/v1/audio/speech", json={**body, "stream_format": "audio"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "timestamps"


def test_synth_writes_timestamps(demo_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    subprocess.run(
        [sys.executable, "-m", "streamtts", "-q", "synth", "--config", str(demo_model_dir / "config.yaml"),
         "--text", "Hello there, my friend.", "--seed", "1", "--out", str(tmp_path / "a.wav"), "--timestamps", str(out)],
        check=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["estimated"] is True
    assert [w["word"] for w in doc["words"]] == ["Hello", "there,", "my", "friend."]
    assert all(w["start"] <= w["end"] for w in doc["words"])
