"""Several family members in one server (``serve --model ID=CONFIG``): each request answered by
the model it names, on every surface; models loaded on demand and unloaded when idle (their
memory handed back); a model that cannot load fails its request, not the server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import ServerProcess, start_server, stop_server

from streamtts.demo.model import write_demo_model

MAX_NEW = 48
GREEDY = {"text_temperature": 0, "audio_temperature": 0}
DIALOGUE = "[S1] Hello there. [S2] Hi, how are you?"


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> dict[str, Path]:
    """The default demo (MOSS-TTS, 32 codebooks) and a MOSS-TTSD stand-in (16)."""
    root = tmp_path_factory.mktemp("members")
    return {"tts": demo_model_dir / "config.yaml", "dialog": write_demo_model(root / "ttsd", member="moss-ttsd")}


def _serve(tmp_path_factory: pytest.TempPathFactory, *args: str) -> ServerProcess:
    log = tmp_path_factory.mktemp("server") / "server.log"
    return start_server(["--n-threads", "1", "--segment-max-new-tokens", str(MAX_NEW), "--no-warmup", *args], log)


@pytest.fixture(scope="module")
def two(members: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _serve(tmp_path_factory, "--model", f"tts={members['tts']}", "--model", f"dialog={members['dialog']}", "--on-demand")
    yield srv
    stop_server(srv)


def _speech(srv: ServerProcess, model: str, text: str, **body: Any) -> httpx.Response:
    payload = {"model": model, "input": text, "response_format": "pcm", "seed": 3, **GREEDY, **body}
    return httpx.post(srv.http + "/v1/audio/speech", json=payload, timeout=300)


async def _ws(srv: ServerProcess, start: dict[str, Any], text: str, query: str = "") -> tuple[list[dict[str, Any]], bytes]:
    msgs: list[dict[str, Any]] = []
    audio = b""
    async with websockets.connect(srv.ws + query, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "seed": 3, "sampling": GREEDY, **start}))
        await ws.send(json.dumps({"type": "text", "text": text}))
        await ws.send(json.dumps({"type": "end"}))
        async for m in ws:
            if isinstance(m, bytes):
                audio += m
                continue
            msgs.append(json.loads(m))
            if msgs[-1]["type"] in ("done",) or (msgs[-1]["type"] == "error" and msgs[-1].get("fatal")):
                break
    return msgs, audio


def _models(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in httpx.get(srv.http + "/v1/models", timeout=30).json()["data"]}


def _rss_kib(srv: ServerProcess) -> int:
    for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _wait(cond: Any) -> None:
    """Poll until ``cond()`` holds (the event, not a time margin; the test's timeout bounds it)."""
    while not cond():
        time.sleep(0.1)


def test_each_request_is_answered_by_the_model_it_names(two: ServerProcess, members: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    listed = _models(two)
    assert list(listed) == ["tts", "dialog"]
    assert (listed["tts"]["model_kind"], listed["tts"]["n_vq"], listed["tts"]["loaded"]) == ("moss-tts", 32, True)
    assert (listed["dialog"]["model_kind"], listed["dialog"]["n_vq"], listed["dialog"]["loaded"]) == ("moss-ttsd", 16, False)

    async def interleaved() -> list[Any]:
        return await asyncio.gather(
            asyncio.to_thread(_speech, two, "dialog", DIALOGUE),
            _ws(two, {"model": "tts"}, "Hello there, plain speech."),
            _ws(two, {}, DIALOGUE, query="?model=dialog"),
            asyncio.to_thread(_speech, two, "tts-1", "Hello there, plain speech."),  # OpenAI's name: the first
        )

    http_dialog, (ws_tts_msgs, ws_tts), (ws_dialog_msgs, ws_dialog), http_tts = asyncio.run(interleaved())
    assert http_dialog.status_code == 200 and http_tts.status_code == 200, (http_dialog.text, http_tts.text)
    assert ws_tts_msgs[-1]["type"] == "done" and ws_dialog_msgs[-1]["type"] == "done", (ws_tts_msgs, ws_dialog_msgs)
    assert _models(two)["dialog"]["loaded"]

    # each equals its model served alone, greedy
    alone = {mid: _serve(tmp_path_factory, "--config", str(members[mid])) for mid in ("tts", "dialog")}
    try:
        assert _speech(alone["dialog"], "x", DIALOGUE).content == http_dialog.content
        assert _speech(alone["tts"], "x", "Hello there, plain speech.").content == http_tts.content
        _, ws_alone = asyncio.run(_ws(alone["tts"], {}, "Hello there, plain speech."))
        assert ws_alone == ws_tts and len(ws_tts) > 0
        _, ws_alone = asyncio.run(_ws(alone["dialog"], {}, DIALOGUE))
        assert ws_alone == ws_dialog and len(ws_dialog) > 0
    finally:
        for srv in alone.values():
            stop_server(srv)
    assert http_dialog.content != http_tts.content


def test_a_model_no_server_serves_is_a_clear_error(two: ServerProcess) -> None:
    r = _speech(two, "klingon", "Hello.")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unknown_model", "model")
    assert "tts, dialog" in err["message"]

    async def corrected() -> tuple[list[dict[str, Any]], int]:
        async with websockets.connect(two.ws, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "model": "klingon"}))
            first = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "start", "model": "tts", "max_new_tokens": MAX_NEW}))
            await ws.send(json.dumps({"type": "text", "text": "Now it works."}))
            await ws.send(json.dumps({"type": "end"}))
            msgs, audio = [first], 0
            async for m in ws:
                if isinstance(m, bytes):
                    audio += len(m)
                else:
                    msgs.append(json.loads(m))
            return msgs, audio

    msgs, audio = asyncio.run(corrected())
    assert msgs[0]["type"] == "error" and msgs[0]["code"] == "unknown_model" and not msgs[0]["fatal"], msgs[0]
    assert "tts, dialog" in msgs[0]["message"]
    assert msgs[-1]["type"] == "done" and audio > 0, msgs
    conflict, _ = asyncio.run(_ws(two, {"model": "tts"}, "Hi.", query="?model=dialog"))
    assert conflict[0]["code"] == "unknown_model" and "?model=" in conflict[0]["message"], conflict
    assert two.health()["status"] == "ok"


def test_the_url_or_the_header_names_the_model_a_balancer_routes_on(two: ServerProcess) -> None:
    """?model= and X-Model on HTTP speech (and X-Model on the WebSocket) choose the model as the
    body does; OpenAI's names in the body defer to them; two places naming different models are
    unknown_model; /readyz?model=ID answers for that model."""
    want = _speech(two, "dialog", DIALOGUE)
    assert want.status_code == 200
    body = {"model": "tts-1", "input": DIALOGUE, "response_format": "pcm", "seed": 3, **GREEDY}
    by_url = httpx.post(two.http + "/v1/audio/speech?model=dialog", json=body, timeout=300)
    by_header = httpx.post(two.http + "/v1/audio/speech", json=body, headers={"X-Model": "dialog"}, timeout=300)
    assert by_url.status_code == by_header.status_code == 200
    assert by_url.content == by_header.content == want.content
    clash = httpx.post(two.http + "/v1/audio/speech", json={**body, "model": "tts"}, headers={"X-Model": "dialog"}, timeout=60)
    err = clash.json()["error"]
    assert clash.status_code == 400 and err["code"] == "unknown_model" and err["param"] == "model", err
    assert "X-Model header 'dialog'" in err["message"] and "body's model 'tts'" in err["message"]
    unknown = httpx.post(two.http + "/v1/audio/speech?model=nope", json=body, timeout=60)
    assert unknown.status_code == 400 and "tts, dialog" in unknown.json()["error"]["message"]

    async def ws_header() -> tuple[list[dict[str, Any]], bytes]:
        audio = b""
        msgs: list[dict[str, Any]] = []
        async with websockets.connect(two.ws, max_size=None, additional_headers={"X-Model": "dialog"}) as ws:
            await ws.send(json.dumps({"type": "start", "seed": 3, "sampling": GREEDY}))
            await ws.send(json.dumps({"type": "text", "text": DIALOGUE}))
            await ws.send(json.dumps({"type": "end"}))
            async for m in ws:
                if isinstance(m, bytes):
                    audio += m
                else:
                    msgs.append(json.loads(m))
        return msgs, audio

    msgs, audio = asyncio.run(ws_header())
    ref_msgs, ref_audio = asyncio.run(_ws(two, {"model": "dialog"}, DIALOGUE))
    assert msgs[-1]["type"] == "done" and audio == ref_audio, msgs
    for model, code in (("dialog", 200), ("tts", 200), ("nope", 404)):
        r = httpx.get(two.http + f"/readyz?model={model}", timeout=30)
        assert r.status_code == code and r.json()["model"] == model, r.text
    assert httpx.get(two.http + "/readyz?model=nope", timeout=30).json()["status"] == "unknown_model"


def test_an_idle_model_is_unloaded_and_loads_again(members: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = _serve(tmp_path_factory, "--model", f"tts={members['tts']}", "--model", f"dialog={members['dialog']}",
                 "--on-demand", "--idle-unload", "1")  # fmt: skip
    try:
        _wait(lambda: not any(m["loaded"] for m in _models(srv).values()))  # nothing asked for: both unloaded
        before = _rss_kib(srv)
        first = _speech(srv, "dialog", DIALOGUE)
        assert first.status_code == 200
        loaded = _rss_kib(srv)
        _wait(lambda: not _models(srv)["dialog"]["loaded"])
        grew = loaded - before
        assert grew > 0, (before, loaded)
        # most of it comes back: at the unload, or at one of the idle watch's next rounds (what
        # the finished request still held is collected and trimmed then); the server's own
        # rounds, not a time margin, decide it: 8 of them, 0.25 s apart here
        for _ in range(40):
            unloaded = _rss_kib(srv)
            if unloaded - before < grew / 2:
                break
            time.sleep(0.25)
        assert unloaded - before < grew / 2, (before, loaded, unloaded)
        again = _speech(srv, "dialog", DIALOGUE)
        assert again.status_code == 200 and again.content == first.content
        metrics = httpx.get(srv.http + "/metrics", timeout=30).text
        assert 'streamtts_model_loaded{model="dialog"}' in metrics
        log = srv.log_path.read_text()
        assert log.count("loading model dialog") == 2 and "model dialog unloaded" in log, log
    finally:
        stop_server(srv)


def test_a_model_that_cannot_load_fails_its_request_only(members: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("broken")
    broken = write_demo_model(root / "m", member="moss-ttsd")
    gguf = next((root / "m").rglob("*.gguf"))
    gguf.write_bytes(gguf.read_bytes()[: 4096])  # cut short: llama.cpp cannot read it
    srv = _serve(tmp_path_factory, "--model", f"tts={members['tts']}", "--model", f"broken={broken}", "--on-demand")
    try:
        r = _speech(srv, "broken", DIALOGUE)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("model_unavailable", "model") and "'broken'" in err["message"], err
        msgs, _ = asyncio.run(_ws(srv, {"model": "broken"}, DIALOGUE))
        assert msgs[-1]["type"] == "error" and msgs[-1]["code"] == "model_unavailable" and msgs[-1]["fatal"], msgs
        assert _speech(srv, "tts", "The other model speaks on.").status_code == 200
        assert srv.health()["status"] == "ok" and not _models(srv)["broken"]["loaded"]
    finally:
        stop_server(srv)


def test_a_server_config_names_the_models(members: dict[str, Path], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``serve --config server.yaml`` with a ``models:`` map (paths relative to the file)."""
    import os
    import subprocess
    import sys

    (tmp_path / "server.yaml").write_text(
        "models:\n"
        f"  dialog: {os.path.relpath(members['dialog'], tmp_path)}\n"
        f"  tts: {members['tts']}\n"
        "on_demand: true\n",
        encoding="utf-8",
    )
    srv = _serve(tmp_path_factory, "--config", str(tmp_path / "server.yaml"))
    try:
        listed = _models(srv)
        assert list(listed) == ["dialog", "tts"] and listed["dialog"]["loaded"] and not listed["tts"]["loaded"]
        assert _speech(srv, "tts", "Hello there.").status_code == 200
    finally:
        stop_server(srv)
    (tmp_path / "bad.yaml").write_text("models: [tts]\n", encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "streamtts", "serve", "--port", "0", "--config", str(tmp_path / "bad.yaml")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "a server config (it has `models:`)" in res.stderr, res.stderr
