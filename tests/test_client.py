"""streamtts.client and ``streamtts say`` against a real server process."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from streamtts.client import Audio, ServerError, StreamClient, stream_url
from streamtts.config import SamplingParams
from streamtts.server.protocol import Done, SegmentInfo

TEXT = "Hello from the client, this is a test. It has two sentences in it."


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "4", "--max-sessions", "2", "--segment-max-new-tokens", "44")


def test_stream_url() -> None:
    assert stream_url("ws://h:1") == "ws://h:1/v1/stream"
    assert stream_url("http://h:1/") == "ws://h:1/v1/stream"
    assert stream_url("https://h") == "wss://h/v1/stream"
    assert stream_url("h:8000") == "ws://h:8000/v1/stream"
    assert stream_url("ws://h:1/custom/path?x=1") == "ws://h:1/custom/path?x=1"


def test_stream_text_and_token_stream_give_the_same_audio(server: Any) -> None:
    # greedy: two segments may run at once (see GREEDY in server/test_server.py)
    client = StreamClient(server.http, seed=8, sampling=SamplingParams.greedy())

    async def whole() -> np.ndarray:
        return await client.synthesize(TEXT)

    async def tokens() -> np.ndarray:
        async def llm() -> AsyncIterator[str]:
            for word in TEXT.split(" "):
                await asyncio.sleep(0.005)
                yield word + " "

        parts = [pcm async for pcm in client.stream(llm())]
        return np.concatenate(parts)

    a = asyncio.run(whole())
    b = asyncio.run(tokens())
    assert a.dtype == np.float32 and a.size > 0 and a.size % 1920 == 0
    assert np.array_equal(a, b)
    assert float(np.sqrt(np.mean(a**2))) > 1e-3
    server.wait_idle()


def test_session_events(server: Any) -> None:
    async def main() -> tuple[list[Any], Any]:
        client = StreamClient(server.ws, format="pcm_s16le_16000", seed=1)
        async with client.session() as s:
            await s.send_text(TEXT)
            await s.end()
            events = [ev async for ev in s]
        return events, s

    events, s = asyncio.run(main())
    assert s.ready is not None and s.ready.sample_rate == 16000
    segs = [e for e in events if isinstance(e, SegmentInfo)]
    assert [x.text for x in segs] == ["Hello from the client, this is a test.", "It has two sentences in it."]
    audio = [e for e in events if isinstance(e, Audio)]
    assert all(a.sample_rate == 16000 for a in audio)
    assert isinstance(events[-1], Done) and s.done is not None
    assert sum(a.pcm.size for a in audio) == s.done.frames * 1920 * 2 // 3
    server.wait_idle()


def test_cancel_from_the_client(server: Any) -> None:
    async def main() -> Done | None:
        client = StreamClient(server.ws)
        async with client.session() as s:
            await s.send_text(TEXT * 4)
            await s.end()
            async for ev in s:
                if isinstance(ev, Audio):
                    await s.cancel()
                    break
            async for _ in s:
                pass
            return s.done

    done = asyncio.run(main())
    assert done is not None and done.reason == "cancelled"
    server.wait_idle()


def test_fatal_errors_raise(server: Any) -> None:
    async def main() -> None:
        client = StreamClient(server.ws)
        async with client.session(), client.session():  # max 2 sessions
            with pytest.raises(ServerError) as exc:
                await client.synthesize("One too many.")
            assert exc.value.code == "overloaded" and exc.value.close_code == 1013

    asyncio.run(main())
    server.wait_idle()
    with pytest.raises(ServerError) as exc:  # a refused start raises at once
        asyncio.run(StreamClient(server.ws, format="mp3").synthesize("x"))
    assert exc.value.code == "invalid_format" and "mp3" in exc.value.message


def test_upload_voice(server: Any) -> None:
    t = np.arange(24000 * 2) / 24000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000, format="WAV")
    client = StreamClient(server.ws)

    async def main() -> tuple[str, np.ndarray]:
        vid = await client.upload_voice(buf.getvalue(), name="hum")
        return vid, await client.synthesize("With my own voice.", voice=vid)

    vid, pcm = asyncio.run(main())
    assert vid.startswith("v_") and pcm.size > 0
    with pytest.raises(ServerError) as exc:
        asyncio.run(client.upload_voice(b"not audio"))
    assert exc.value.code == "invalid_reference_audio"
    server.wait_idle()


def test_say_cli_saves_without_a_sound_card(server: Any, tmp_path: Path) -> None:
    out = tmp_path / "said.wav"
    cmd = [sys.executable, "-m", "streamtts.cli.main", "say", "--server", server.ws, "--seed", "3", "--save", str(out), TEXT]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    x, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and x.size > 0 and x.size % 1920 == 0
    server.wait_idle()


def test_say_cli_reports_an_unreachable_server(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "streamtts.cli.main", "say", "--server", "ws://127.0.0.1:9", "--save", str(tmp_path / "x.wav"), "hi"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot reach" in r.stderr and "Traceback" not in r.stderr
