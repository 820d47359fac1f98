"""Replicas serving different model sets behind HAProxy routing on the model: real processes on
loopback, started by ``deploy/local-cluster.sh up --replica ...``.

Replica 1 serves ``tts`` (the default demo, 32 codebooks), replica 2 ``dialog`` (a MOSS-TTSD
stand-in, 16) and ``tts``. A request names its model in the URL's ``?model=`` or the
``X-Model`` header (deploy/haproxy.cfg); which replica served it is read from the replicas'
``/metrics``, which model answered from its audio (equal to that model's, asked directly).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from conftest import haproxy_stat, need_binary
from test_deploy_cluster import Result, finished, get, say, talk, talk_sync
from websockets.exceptions import InvalidStatus

from streamtts.demo.model import write_demo_model

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "local-cluster.sh"
MAX_NEW = 44
ARGS = [
    "--n-threads", "1", "--max-sessions", "3", "--admission", "slots", "--segment-max-new-tokens", str(MAX_NEW),
    "--idle-timeout", "60", "--send-buffer", "1", "--no-warmup",
]  # fmt: skip
DIALOGUE = "[S1] Hello there. [S2] Hi, how are you?"
TEXT = "Hello there, this is the first voice test."


class ModelCluster:
    def __init__(self, run: Path, env: dict[str, str], info: dict[str, Any]) -> None:
        self.run, self.env, self.info = run, env, info
        self.balancer = str(info["balancer"])
        self.ws = self.balancer.replace("http://", "ws://") + "/v1/stream"
        self.urls = [str(r["url"]) for r in info["replicas"]]

    def replica_ws(self, i: int, query: str = "") -> str:
        return self.urls[i].replace("http://", "ws://") + "/v1/stream" + query

    def servers(self) -> dict[tuple[str, str], str]:
        """HAProxy's view: (backend, server) -> UP / DOWN."""
        rows = haproxy_stat(self.run)
        return {
            (r["pxname"], r["svname"]): r["status"].split()[0]
            for r in rows
            if r["pxname"].startswith("model-") and r["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_servers(self, want: dict[tuple[str, str], str]) -> None:
        """Until HAProxy reports each (backend, server) as given (the test's timeout bounds it)."""
        while any(self.servers().get(k) != v for k, v in want.items()):
            time.sleep(0.02)

    def sessions(self, kind: str) -> list[float]:
        out = []
        for url in self.urls:
            body = get(url + "/metrics")[1].decode()
            name = f'streamtts_sessions_total{{kind="{kind}"}} '
            out.append(next((float(ln.split()[-1]) for ln in body.splitlines() if ln.startswith(name)), 0.0))
        return out


def speech(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    data = json.dumps({"response_format": "pcm", "seed": 3, "text_temperature": 0, "audio_temperature": 0, **body})
    req = urllib.request.Request(url, data=data.encode(), method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def mc(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelCluster]:
    need_binary("haproxy")
    need_binary("redis-server")
    tts = demo_model_dir / "config.yaml"
    dialog = write_demo_model(tmp_path_factory.mktemp("ttsd"), member="moss-ttsd")
    run = tmp_path_factory.mktemp("models-cluster")
    env = dict(os.environ, STREAMTTS_CLUSTER_DIR=str(run), STREAMTTS_PYTHON=sys.executable, STREAMTTS_LB_CHECK_INTER="1s")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = ["bash", str(SCRIPT), "up", "--replica", f"tts={tts}", "--replica", f"dialog={dialog} tts={tts}", "--", *ARGS]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    if p.returncode != 0:
        logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in run.glob("*.log"))
        raise RuntimeError(f"local-cluster.sh up failed ({p.returncode}):\n{p.stderr}\n{logs}")
    c = ModelCluster(run, env, json.loads(p.stdout.strip().splitlines()[-1]))
    yield c
    down = subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr


def test_up_prints_the_models_and_haproxy_has_a_backend_per_model(mc: ModelCluster) -> None:
    assert mc.info["models"] == ["tts", "dialog"]
    assert [r["models"] for r in mc.info["replicas"]] == [["tts"], ["dialog", "tts"]]
    assert mc.servers() == {
        ("model-tts", "r1"): "UP", ("model-tts", "r2"): "UP", ("model-dialog", "r2"): "UP",
    }  # fmt: skip
    # each replica's readiness per model: 404 for a model it does not serve
    assert get(mc.urls[0] + "/readyz?model=dialog")[0] == 404
    assert get(mc.urls[1] + "/readyz?model=dialog")[0] == 200


def test_requests_reach_a_replica_serving_the_model_they_name(mc: ModelCluster) -> None:
    # what each model says, asked directly
    want_dialog = talk_sync(mc.replica_ws(1, "?model=dialog"), say(DIALOGUE, seed=3))
    want_tts = talk_sync(mc.replica_ws(0), say(TEXT, seed=3))
    assert finished(want_dialog) and finished(want_tts) and want_dialog.audio != want_tts.audio
    before = mc.sessions("ws")

    async def sessions() -> list[Result]:
        dialog = [talk(mc.ws + "?model=dialog", say(DIALOGUE, seed=3)) for _ in range(3)]
        return await asyncio.gather(*dialog)

    got = asyncio.run(sessions())
    served = [a - b for a, b in zip(mc.sessions("ws"), before, strict=True)]
    assert served == [0, 3], served  # only replica 2 serves dialog
    assert all(finished(r) and r.audio == want_dialog.audio for r in got), [r.errors for r in got]
    # no model named: the default (tts), on either replica, answered by tts
    plain = [talk_sync(mc.ws, say(TEXT, seed=3)) for _ in range(2)]
    assert all(finished(r) and r.audio == want_tts.audio for r in plain)

    # HTTP: the X-Model header (the body's OpenAI name defers to it), or ?model=
    direct = speech(mc.urls[1] + "/v1/audio/speech?model=dialog", {"input": DIALOGUE})
    before = mc.sessions("http")
    by_header = speech(mc.balancer + "/v1/audio/speech", {"input": DIALOGUE, "model": "tts-1"}, {"X-Model": "dialog"})
    by_url = speech(mc.balancer + "/v1/audio/speech?model=dialog", {"input": DIALOGUE})
    served = [a - b for a, b in zip(mc.sessions("http"), before, strict=True)]
    assert direct[0] == by_header[0] == by_url[0] == 200
    assert by_header[1] == by_url[1] == direct[1]
    assert served == [0, 2], served


def test_an_unknown_model_is_a_clear_error(mc: ModelCluster) -> None:
    status, body = speech(mc.balancer + "/v1/audio/speech?model=klingon", {"input": TEXT})
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "unknown_model" and err["param"] == "model", err
    assert "'klingon'" in err["message"] and "tts, dialog" in err["message"]
    status, body = speech(mc.balancer + "/v1/audio/speech", {"input": TEXT}, {"X-Model": "klingon"})
    assert status == 400 and json.loads(body)["error"]["code"] == "unknown_model"

    async def ws_refused() -> InvalidStatus:
        with pytest.raises(InvalidStatus) as info:
            async with websockets.connect(mc.ws + "?model=klingon", open_timeout=30):
                pass
        return info.value

    refused = asyncio.run(ws_refused())
    assert refused.response.status_code == 400
    assert json.loads(refused.response.body or b"{}")["error"]["code"] == "unknown_model"
    # a model named only in the body is not routed on: it meets the default the balancer
    # passed on, and the replica says so instead of answering with another model
    status, body = speech(mc.balancer + "/v1/audio/speech", {"input": DIALOGUE, "model": "dialog"})
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "unknown_model" and "X-Model header 'tts'" in err["message"], err
    # the same on the WebSocket: a non-fatal error naming both
    msgs = talk_sync(mc.ws, say(TEXT, model="dialog"))
    assert msgs.errors and msgs.errors[0]["code"] == "unknown_model", msgs.errors


def test_a_voice_uploaded_through_the_balancer_works_with_both_models(mc: ModelCluster, voice_wav: Path) -> None:
    status, body = get(mc.balancer + "/v1/voices?name=probe", data=voice_wav.read_bytes())
    assert status in (200, 201), body
    vid = json.loads(body)["voice_id"]
    plain = talk_sync(mc.ws + "?model=tts", say(TEXT, seed=5))
    voiced = [talk_sync(mc.replica_ws(i, "?model=tts"), say(TEXT, seed=5, voice=vid)) for i in (0, 1)]
    assert all(finished(v) for v in voiced), [v.errors for v in voiced]
    assert voiced[0].audio == voiced[1].audio != plain.audio  # both replicas took the voice's codes
    dialog_plain = talk_sync(mc.ws + "?model=dialog", say(DIALOGUE, seed=5))
    dialog_voiced = talk_sync(mc.ws + "?model=dialog", say(DIALOGUE, seed=5, speakers={"S1": vid}))
    assert finished(dialog_plain) and finished(dialog_voiced), dialog_voiced.errors
    assert dialog_voiced.audio != dialog_plain.audio  # the 16-codebook member spoke with it too


def test_a_full_replica_leaves_the_backend_of_every_model_it_serves(mc: ModelCluster) -> None:
    """Replica 2 full (3 idle sessions opened directly): it is DOWN in model-dialog and in
    model-tts; tts still has replica 1, dialog has nobody (HAProxy's 503); a slot freed, it is
    back in both."""

    async def scenario() -> tuple[int, list[float], Result]:
        holders = [await websockets.connect(mc.replica_ws(1), open_timeout=30) for _ in range(3)]
        try:
            for h in holders:
                await h.send(json.dumps({"type": "start"}))
                json.loads(await h.recv())
            ready = await asyncio.to_thread(get, mc.urls[1] + "/readyz?model=dialog")
            assert ready[0] == 503 and json.loads(ready[1])["status"] == "full", ready
            await asyncio.to_thread(mc.wait_servers, {("model-dialog", "r2"): "DOWN", ("model-tts", "r2"): "DOWN"})
            status, _ = await asyncio.to_thread(speech, mc.balancer + "/v1/audio/speech?model=dialog", {"input": DIALOGUE})
            before = await asyncio.to_thread(mc.sessions, "ws")
            r = await talk(mc.ws + "?model=tts", say(TEXT, seed=1))
            after = await asyncio.to_thread(mc.sessions, "ws")
            return status, [a - b for a, b in zip(after, before, strict=True)], r
        finally:
            for h in holders:
                await h.close()

    status, served, r = asyncio.run(scenario())
    assert status == 503  # no replica for dialog has a free slot: HAProxy says so
    assert finished(r) and served == [1, 0], (served, r.errors)
    mc.wait_servers({("model-dialog", "r2"): "UP", ("model-tts", "r2"): "UP"})
