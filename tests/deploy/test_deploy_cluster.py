"""Several replicas behind HAProxy, voices in Redis: real processes on loopback.

Every cluster here is started by ``deploy/local-cluster.sh up`` (Redis, two ``streamtts
serve`` replicas on the tiny demo model, HAProxy with ``deploy/haproxy.cfg``) and
stopped by ``down``. The scenarios that stop a replica (SIGTERM, kill -9) get a cluster
of their own. Which replica served a session is read from the replicas' ``/metrics``.

Comparisons of audio across concurrent sessions use greedy sampling: llama.cpp's last
bits vary with the batch's composition, which can flip a sampled draw (see
tests/server/test_server.py); seeded sampled sessions are compared one at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
from conftest import haproxy_stat, need_binary
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "local-cluster.sh"
MAX_NEW = 44  # steps per segment: 13 frames (about 1 s of audio)
GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
# --admission slots: by the server's default (admission by measured capacity) how many
# sessions run at once depends on how busy this machine is; these tests check the balancer
BASE_ARGS = [
    "--n-threads", "1", "--max-streams", "16", "--max-sessions", "12", "--admission", "slots",
    "--segment-max-new-tokens", str(MAX_NEW), "--idle-timeout", "60", "--send-buffer", "1",
    "--send-stall", "20",
]  # fmt: skip
TEXTS = [
    "Hello there, this is the first voice test.",
    "A second sentence speaks here. And one more follows it.",
    "Numbers like three and four are spoken too.",
    "The last of the four texts is this one.",
]
# Long enough (6 segments) to be still streaming when a replica is stopped; read at real-time pace.
LONG = " ".join(f"This is sentence number {i}, spoken as its own segment." for i in range(6))
LONGER = " ".join(f"This is sentence number {i}, spoken as its own segment." for i in range(24))


# -- the cluster --------------------------------------------------------------------------------


@dataclass
class Cluster:
    run: Path
    env: dict[str, str]
    info: dict[str, Any]

    @property
    def balancer(self) -> str:
        return str(self.info["balancer"])

    @property
    def ws(self) -> str:
        return self.balancer.replace("http://", "ws://") + "/v1/stream"

    @property
    def replicas(self) -> list[dict[str, Any]]:
        return list(self.info["replicas"])

    def replica_ws(self, i: int) -> str:
        return str(self.replicas[i]["url"]).replace("http://", "ws://") + "/v1/stream"

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def servers(self) -> dict[str, str]:
        """HAProxy's view: server name (r1, r2, ...) -> UP / DOWN."""
        rows = haproxy_stat(self.run)
        return {
            r["svname"]: r["status"].split()[0]
            for r in rows
            if r["pxname"] == "replicas" and r["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_server(self, name: str, status: str, timeout: float = 15.0) -> float:
        """Seconds until HAProxy reports ``name`` as ``status``."""
        t0 = time.monotonic()
        while self.servers().get(name) != status:
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{name} not {status} after {timeout} s: {self.servers()}")
            time.sleep(0.02)
        return time.monotonic() - t0

    def metric(self, i: int, name: str) -> float:
        body = get(str(self.replicas[i]["url"]) + "/metrics")[1].decode()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def ws_sessions(self) -> list[float]:
        return [self.metric(i, 'streamtts_sessions_total{kind="ws"}') for i in range(len(self.replicas))]


def get(url: str, data: bytes | None = None, timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_cluster(run: Path, config: Path, *extra: str, check_inter: str = "1s", gpus: str = "") -> Cluster:
    need_binary("haproxy")
    need_binary("redis-server")
    env = dict(os.environ)
    env.update(STREAMTTS_CLUSTER_DIR=str(run), STREAMTTS_PYTHON=sys.executable, STREAMTTS_LB_CHECK_INTER=check_inter)
    if gpus:
        env["STREAMTTS_CLUSTER_GPUS"] = gpus
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = ["bash", str(SCRIPT), "up", "2", "--config", str(config), "--", *BASE_ARGS, *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    if p.returncode != 0:
        logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in run.glob("*.log"))
        raise RuntimeError(f"local-cluster.sh up failed ({p.returncode}):\n{p.stderr}\n{logs}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return Cluster(run, env, info)


def stop_cluster(c: Cluster) -> list[int]:
    """``down``; returns the PIDs it recorded, every one of which must be gone."""
    pids = [int(line.split()[1]) for line in (c.run / "pids").read_text().splitlines()]
    p = c.script("down")
    assert p.returncode == 0, p.stderr
    for pid in pids:
        assert not _alive(pid), f"pid {pid} still running after down"
    return pids


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture(scope="module")
def cluster(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # GPU ids are only handed out here (CUDA_VISIBLE_DEVICES; the CPU build ignores them)
    c = start_cluster(tmp_path_factory.mktemp("cluster"), demo_model_dir / "config.yaml", gpus="3,5")
    yield c
    stop_cluster(c)


@pytest.fixture
def fresh_cluster(demo_model_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """Factory: a cluster of this test's own (for scenarios that stop a replica)."""
    made: list[Cluster] = []

    def make(*extra: str, check_inter: str = "1s") -> Cluster:
        c = start_cluster(tmp_path / f"run{len(made)}", demo_model_dir / "config.yaml", *extra, check_inter=check_inter)
        made.append(c)
        return c

    yield make
    for c in made:
        c.script("down")


# -- sessions ------------------------------------------------------------------------------------


@dataclass
class Result:
    audio: bytes = b""
    ready: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    first_audio: asyncio.Event = field(default_factory=asyncio.Event)


def say(text: str, seed: int = 1, greedy: bool = True, **start: Any) -> list[dict[str, Any]]:
    if greedy:
        start["sampling"] = GREEDY
    return [{"type": "start", "seed": seed, **start}, {"type": "text", "text": text}, {"type": "end"}]


async def talk(url: str, msgs: list[Any], *, pace: float = 0.0, timeout: float = 120.0, r: Result | None = None) -> Result:
    """Send ``msgs``, read until the server closes. ``pace`` > 0: after each audio frame,
    sleep ``pace`` x its duration (a listener playing it; the session stays open longer)."""
    r = r or Result()
    async with asyncio.timeout(timeout):
        async with websockets.connect(url, max_size=None, compression=None, open_timeout=30) as ws:
            try:
                for m in msgs:
                    await ws.send(json.dumps(m))
            except ConnectionClosed:
                pass
            try:
                async for frame in ws:
                    if isinstance(frame, bytes):
                        r.audio += frame
                        r.first_audio.set()
                        if pace:
                            await asyncio.sleep(pace * len(frame) / 48000)
                        continue
                    msg = json.loads(frame)
                    if msg["type"] == "ready":
                        r.ready = msg
                    elif msg["type"] == "done":
                        r.done = msg
                    elif msg["type"] == "error":
                        r.errors.append(msg)
            except ConnectionClosed:
                pass
            r.close_code = ws.close_code
    return r


async def first_message(url: str, msg: dict[str, Any]) -> dict[str, Any]:
    async with websockets.connect(url, open_timeout=30) as ws:
        await ws.send(json.dumps(msg))
        reply: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 30))
        return reply


def talk_sync(url: str, msgs: list[Any], **kw: Any) -> Result:
    return asyncio.run(talk(url, msgs, **kw))


def finished(r: Result) -> bool:
    return r.errors == [] and r.close_code == 1000 and r.done is not None and r.done["reason"] == "end"


# -- the balancer ------------------------------------------------------------------------------


def test_sessions_through_the_balancer_equal_a_single_replicas_and_both_serve(cluster: Cluster) -> None:
    # What one replica says for each text, asked directly, one at a time.
    want = [talk_sync(cluster.replica_ws(1), say(t, seed=3)) for t in TEXTS]
    assert all(finished(w) and w.audio for w in want)
    before = cluster.ws_sessions()

    async def sixteen() -> list[Result]:
        return await asyncio.gather(*(talk(cluster.ws, say(TEXTS[i % 4], seed=100 + i)) for i in range(16)))

    got = asyncio.run(sixteen())
    after = cluster.ws_sessions()
    for i, r in enumerate(got):
        assert finished(r), (i, r.errors, r.close_code)
        assert r.audio == want[i % 4].audio, f"session {i}: audio differs from the single replica's"
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == 16 and min(served) > 0, served
    # Seeded sampling, one session at a time: the seed gives the same audio on either replica.
    for seed in (11, 12):
        direct = talk_sync(cluster.replica_ws(0), say(TEXTS[3], seed=seed, greedy=False))
        via = talk_sync(cluster.ws, say(TEXTS[3], seed=seed, greedy=False))
        assert finished(direct) and finished(via) and via.audio == direct.audio
    assert talk_sync(cluster.ws, say(TEXTS[3], seed=12, greedy=False)).audio != talk_sync(
        cluster.ws, say(TEXTS[3], seed=11, greedy=False)
    ).audio


def test_a_voice_uploaded_through_the_balancer_works_on_every_replica(cluster: Cluster, voice_wav: Path) -> None:
    status, body = get(cluster.balancer + "/v1/voices?name=probe", data=voice_wav.read_bytes())
    assert status in (200, 201), body
    vid = json.loads(body)["voice_id"]
    text = TEXTS[0]
    plain = talk_sync(cluster.replica_ws(0), say(text, seed=5))
    direct = [talk_sync(cluster.replica_ws(i), say(text, seed=5, voice=vid)) for i in (0, 1)]
    assert all(finished(d) for d in direct), [d.errors for d in direct]
    assert direct[0].audio == direct[1].audio != plain.audio  # the voice's codes were used
    before = cluster.ws_sessions()

    async def four() -> list[Result]:
        return await asyncio.gather(*(talk(cluster.ws, say(text, seed=5, voice=vid)) for _ in range(4)))

    got = asyncio.run(four())
    served = [a - b for a, b in zip(cluster.ws_sessions(), before, strict=True)]
    assert min(served) > 0, served  # sessions landed on each replica ...
    for r in got:  # ... and every one spoke with the uploaded voice
        assert finished(r) and r.audio == direct[0].audio, r.errors
    # HTTP speech names the voice too, through the balancer
    req = json.dumps({"input": text, "voice": vid, "response_format": "pcm", "max_new_tokens": MAX_NEW}).encode()
    assert get(cluster.balancer + "/v1/audio/speech", data=req)[0] == 200


def test_up_and_status_print_one_json_line_and_give_each_replica_its_gpu(cluster: Cluster) -> None:
    st = cluster.script("status")
    assert st.returncode == 0 and json.loads(st.stdout.strip().splitlines()[-1]) == cluster.info
    assert cluster.balancer.startswith("http://127.0.0.1:") and cluster.info["redis"].startswith("redis://127.0.0.1:")
    for replica, gpu in zip(cluster.replicas, ("3", "5"), strict=True):
        environ = Path(f"/proc/{replica['pid']}/environ").read_bytes().split(b"\0")
        assert f"CUDA_VISIBLE_DEVICES={gpu}".encode() in environ
        assert get(replica["url"] + "/readyz")[0] == 200


def test_admin_endpoints_are_not_reachable_through_the_balancer(cluster: Cluster) -> None:
    status, _ = get(cluster.balancer + "/admin/drain", data=b"")
    assert status == 403
    assert get(str(cluster.replicas[0]["url"]) + "/readyz")[0] == 200  # still serving, not draining


def test_a_full_replica_is_taken_out_and_the_next_session_goes_to_the_other(cluster: Cluster) -> None:
    """Replica 1 full (12 idle sessions, opened directly: HAProxy counts none of them): its
    /readyz says 503, HAProxy marks it DOWN, and sessions through the balancer all go to
    replica 2 although plain leastconn (0 connections each) would send one of two there."""

    async def scenario() -> tuple[list[Result], list[float]]:
        holders = [await websockets.connect(cluster.replica_ws(0), open_timeout=30) for _ in range(12)]
        try:
            for h in holders:  # `start` without text: an idle session holding a slot
                await h.send(json.dumps({"type": "start"}))
                json.loads(await h.recv())
            status, body = await asyncio.to_thread(get, str(cluster.replicas[0]["url"]) + "/readyz")
            ready = json.loads(body)
            assert status == 503 and ready["status"] == "full" and ready["free_slots"] == 0, ready
            await asyncio.to_thread(cluster.wait_server, "r1", "DOWN")
            before = await asyncio.to_thread(cluster.ws_sessions)
            got = await asyncio.gather(*(talk(cluster.ws, say(TEXTS[1], seed=1)) for _ in range(2)))
            after = await asyncio.to_thread(cluster.ws_sessions)
            return got, [a - b for a, b in zip(after, before, strict=True)]
        finally:
            for h in holders:
                await h.close()

    got, served = asyncio.run(scenario())
    assert all(finished(r) for r in got), [r.errors for r in got]
    assert served == [0, 2]
    cluster.wait_server("r1", "UP")  # slots free again: back in rotation
    assert get(str(cluster.replicas[0]["url"]) + "/readyz")[0] == 200


def test_redis_down_then_back(cluster: Cluster, voice_wav: Path, tmp_path: Path) -> None:
    known_status, body = get(cluster.balancer + "/v1/voices", data=voice_wav.read_bytes())
    assert known_status in (200, 201)
    known = json.loads(body)["voice_id"]
    redis_pid = int((cluster.run / "redis.pid").read_text())
    os.kill(redis_pid, signal.SIGTERM)
    while _alive(redis_pid):
        time.sleep(0.05)
    restarted: subprocess.Popen[bytes] | None = None
    try:
        clip = voice_wav.read_bytes()[:-4800]  # another clip (a new upload, not a cached one)
        status, body = get(cluster.balancer + "/v1/voices", data=clip)
        err = json.loads(body)["error"]
        assert status == 503 and err["code"] == "voice_store_unavailable", body
        # plain synthesis still works, over HTTP and WebSocket
        req = json.dumps({"input": TEXTS[2], "response_format": "pcm", "max_new_tokens": MAX_NEW}).encode()
        status, audio = get(cluster.balancer + "/v1/audio/speech", data=req)
        assert status == 200 and len(audio) > 0
        assert finished(talk_sync(cluster.ws, say(TEXTS[2])))
        # an id no replica holds: the store is needed, and says it is unavailable
        err = asyncio.run(first_message(cluster.ws, {"type": "start", "voice": "v_" + "0" * 24}))
        assert err["type"] == "error" and err["code"] == "voice_store_unavailable", err
        ready = json.loads(get(str(cluster.replicas[0]["url"]) + "/readyz")[1])
        assert ready["voice_store_up"] is False and ready["status"] == "ready"
        # Redis back (same config and data folder): uploads work without restarting replicas
        restarted = subprocess.Popen(
            [need_binary("redis-server"), str(cluster.run / "redis.conf")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            status, body = get(cluster.balancer + "/v1/voices", data=clip)
            if status in (200, 201) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status in (200, 201), body
        assert json.loads(body)["voice_id"] != known
        # the voice stored before the outage is still there (Redis's append-only file)
        assert finished(talk_sync(cluster.replica_ws(1), say(TEXTS[0], voice=known)))
    finally:
        if restarted is not None:  # the cluster's `down` knows only the first Redis's PID
            restarted.terminate()
            restarted.wait(timeout=20)


# -- stopping a replica ----------------------------------------------------------------------


def test_sigterm_drains_a_replica_then_it_exits_0(fresh_cluster: Any) -> None:
    # the drain's limit, far above the ~20 s the longest session below is read for (a listener
    # at 0.8x real time): every session must end by itself, not at the limit
    drain_s = 60.0
    # small buffers: a replica cannot push a session's audio ahead into the sockets, so the
    # sessions on replica 1 are still streaming when it gets SIGTERM (else it may drain at once)
    c = fresh_cluster("--drain-timeout", str(drain_s), "--socket-send-buffer", "16384", "--send-buffer", "2")
    want = talk_sync(c.replica_ws(1), say(LONG, seed=2))
    assert finished(want)

    async def scenario() -> tuple[list[Result], Result, list[Result], float, dict[str, Any], float]:
        results = [Result() for _ in range(5)]
        # four through the balancer, and one straight to replica 1 with a text four times as
        # long, so that replica 1 is surely still generating when it gets SIGTERM: the demo
        # model makes LONG's few seconds of audio in well under one, the sessions' audio was
        # then all written out (the transport buffers it), they had sometimes all ended within
        # 0.2 s of SIGTERM, the replica drained and exited, and /readyz found no listener
        urls = [c.ws] * 4 + [c.replica_ws(0)]
        texts = [LONG] * 4 + [LONGER]
        tasks = [
            asyncio.create_task(talk(u, say(t, seed=2), pace=0.8, r=r))
            for u, t, r in zip(urls, texts, results, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(r.first_audio.wait() for r in results)), 60)
        # and one idle session on replica 1 (connected, nothing asked yet)
        idle = Result()
        idle_task = asyncio.create_task(talk(c.replica_ws(0), [{"type": "start"}], r=idle))
        await asyncio.sleep(0.3)
        on_r1 = await asyncio.to_thread(c.metric, 0, "streamtts_sessions")
        pid = int(c.replicas[0]["pid"])
        os.kill(pid, signal.SIGTERM)
        t_term = time.monotonic()
        await asyncio.sleep(0.2)
        status, body = await asyncio.to_thread(get, str(c.replicas[0]["url"]) + "/readyz")
        draining_metric = await asyncio.to_thread(c.metric, 0, "streamtts_draining")
        ready = json.loads(body) | {"status_code": status, "draining_metric": draining_metric}
        await asyncio.wait_for(idle_task, 10)
        # new sessions, once HAProxy has seen the drain, all go to replica 2
        await asyncio.to_thread(c.wait_server, "r1", "DOWN")
        before = await asyncio.to_thread(c.metric, 1, 'streamtts_sessions_total{kind="ws"}')
        new = await asyncio.gather(*(talk(c.ws, say(TEXTS[0], seed=4)) for _ in range(3)))
        after = await asyncio.to_thread(c.metric, 1, 'streamtts_sessions_total{kind="ws"}')
        assert after - before == 3
        running = await asyncio.gather(*tasks)
        while _alive(pid):
            await asyncio.sleep(0.05)
        return running, idle, new, on_r1, ready, time.monotonic() - t_term

    running, idle, new, on_r1, ready, exit_after = asyncio.run(scenario())
    assert on_r1 >= 2  # 1 idle + at least one of the streaming sessions was on replica 1
    assert ready["status_code"] == 503 and ready["draining"] is True and ready["draining_metric"] == 1
    for r in running[:4]:  # every running session finished completely (those on replica 1 too)
        assert finished(r) and r.audio == want.audio, (r.errors, r.close_code)
    assert finished(running[4]) and len(running[4].audio) > 3 * len(want.audio), (running[4].errors, running[4].close_code)
    assert [e["code"] for e in idle.errors] == ["server_draining"] and idle.close_code == 1001
    assert all(finished(r) for r in new), [r.errors for r in new]
    assert exit_after <= drain_s + 2.0
    assert (c.run / "replica-1.exit").read_text().strip() == "0"
    log = " ".join((c.run / "replica-1.log").read_text().split())  # the log handler wraps lines
    assert "drained (SIGTERM): 1 quiet session(s) closed, 0 stream(s) cut" in log
    # status: the JSON line, and the stopped replica named; down: every recorded PID gone
    st = c.script("status")
    assert st.returncode == 1 and json.loads(st.stdout.strip().splitlines()[-1]) == c.info
    assert f"pid {c.replicas[0]['pid']}" in st.stderr
    stop_cluster(c)


def test_kill_9_closes_its_clients_and_the_balancer_moves_on(fresh_cluster: Any) -> None:
    inter = 2.0
    c = fresh_cluster(check_inter=f"{inter:g}s")

    async def scenario() -> tuple[list[Result], float, list[Result]]:
        results = [Result() for _ in range(4)]
        tasks = [asyncio.create_task(talk(c.ws, say(LONG, seed=2), pace=0.8, r=r, timeout=60)) for r in results]
        await asyncio.wait_for(asyncio.gather(*(r.first_audio.wait() for r in results)), 60)
        assert await asyncio.to_thread(c.metric, 0, "streamtts_sessions") >= 1
        os.kill(int(c.replicas[0]["pid"]), signal.SIGKILL)
        down_after = await asyncio.to_thread(c.wait_server, "r1", "DOWN", 30)
        got = await asyncio.gather(*tasks)  # talk's timeout: a hung client fails the test
        later = await asyncio.gather(*(talk(c.ws, say(TEXTS[1], seed=6)) for _ in range(3)))
        return got, down_after, later

    got, down_after, later = asyncio.run(scenario())
    cut = [r for r in got if not finished(r)]
    assert 1 <= len(cut) <= 3 and all(r.close_code not in (None, 1000) and r.done is None for r in cut)
    assert down_after <= inter + 1.0  # within one health-check interval (+1 s to notice)
    assert all(finished(r) for r in later), [r.errors for r in later]
    assert (c.run / "replica-1.exit").read_text().strip() == "137"
    stop_cluster(c)


def test_an_up_that_fails_leaves_nothing_running(tmp_path: Path) -> None:
    need_binary("haproxy")
    need_binary("redis-server")
    bad = tmp_path / "bad.yaml"
    bad.write_text("backbone_gguf: [\n")  # not YAML: every replica exits while starting
    run = tmp_path / "run"
    env = dict(os.environ, STREAMTTS_CLUSTER_DIR=str(run), STREAMTTS_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    p = subprocess.run(
        ["bash", str(SCRIPT), "up", "2", "--config", str(bad)], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode != 0 and "exited while starting" in p.stderr, p.stderr
    pids = [int(f.read_text()) for f in run.glob("*.pid")]
    assert len(pids) >= 2  # Redis and at least one replica were started ...
    time.sleep(1.5)  # (cleanup sends SIGTERM, then SIGKILL after 1 s)
    assert not [pid for pid in pids if _alive(pid)]  # ... and all are gone
    assert not (run / "pids").exists() and not (run / "cluster.json").exists()
