"""What the balancer costs, and how fast a cluster reacts (deploy/local-cluster.sh on loopback).

    python benchmarks/cluster.py                         # demo model, 2 replicas, 20 reps
    python benchmarks/cluster.py --config weights/streamtts.yaml --reps 50 --out cluster.json

Reports (never asserts):

1. TTFA through HAProxy vs straight to a replica: the same text and seed, alternating, one
   session at a time; time from sending ``text`` + ``end`` (session ``ready``) to the first
   audio frame. Medians and the median paired difference.
2. Full -> out of rotation: a replica's slots filled with idle sessions (opened directly), time
   until HAProxy reports it DOWN (its /readyz 503 at the next health check).
3. SIGTERM of an idle replica -> exit (drain with nothing to wait for), and kill -9 -> HAProxy
   DOWN.

On one small machine both replicas share the same cores: this measures the balancer and the
control loop, not scaling (each replica's own throughput is `streamtts bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import websockets

REPO = Path(__file__).resolve().parent.parent
TEXT = "Hello there, this is a latency test."


def up(run: Path, config: str | None, max_sessions: int) -> dict[str, Any]:
    env = dict(os.environ, STREAMTTS_CLUSTER_DIR=str(run), STREAMTTS_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = ["bash", str(REPO / "deploy" / "local-cluster.sh"), "up", "2"]
    if config:
        cmd += ["--config", config]
    cmd += ["--", "--max-sessions", str(max_sessions), "--segment-max-new-tokens", "60"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    info: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    info["env"] = env
    return info


def servers(run: Path) -> dict[str, str]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(run / "haproxy.sock"))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = csv.DictReader(data.decode().lstrip("# ").splitlines())
    return {r["svname"]: r["status"] for r in rows if r["pxname"] == "replicas" and r["svname"].startswith("r")}


def until(run: Path, name: str, status: str) -> float:
    t0 = time.monotonic()
    while not servers(run).get(name, "").startswith(status):
        time.sleep(0.005)
    return time.monotonic() - t0


async def ttfa(url: str, seed: int) -> float:
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "start", "seed": seed}))
        await ws.recv()  # ready
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "text", "text": TEXT}))
        await ws.send(json.dumps({"type": "end"}))
        t = 0.0
        async for frame in ws:
            if isinstance(frame, bytes) and not t:
                t = time.perf_counter() - t0
        return t


def ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/stream"


async def fill(url: str, n: int) -> list[Any]:
    held = [await websockets.connect(url) for _ in range(n)]
    for h in held:
        await h.send(json.dumps({"type": "start"}))
        await h.recv()
    return held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-sessions", type=int, default=4)
    ap.add_argument("--out")
    a = ap.parse_args()
    run = Path(tempfile.mkdtemp(prefix="streamtts-cluster-"))
    info = up(run, a.config, a.max_sessions)
    r1, r2 = info["replicas"]
    out: dict[str, Any] = {}
    try:
        direct, via = [], []
        for i in range(a.reps):
            direct.append(asyncio.run(ttfa(ws(r2["url"]), seed=i)))
            via.append(asyncio.run(ttfa(ws(info["balancer"]), seed=i)))
        out["ttfa_direct_ms_p50"] = round(1000 * statistics.median(direct), 2)
        out["ttfa_balancer_ms_p50"] = round(1000 * statistics.median(via), 2)
        out["ttfa_balancer_minus_direct_ms_p50"] = round(
            1000 * statistics.median(v - d for v, d in zip(via, direct, strict=True)), 2
        )

        async def full() -> float:
            held = await fill(ws(r1["url"]), a.max_sessions)
            try:
                return await asyncio.to_thread(until, run, "r1", "DOWN")
            finally:
                for h in held:
                    await h.close()

        out["full_to_down_s"] = round(asyncio.run(full()), 3)
        out["free_to_up_s"] = round(until(run, "r1", "UP"), 3)
        t0 = time.monotonic()
        os.kill(r1["pid"], signal.SIGTERM)
        while Path(f"/proc/{r1['pid']}").exists() and "Z" not in Path(f"/proc/{r1['pid']}/stat").read_text().split()[2]:
            time.sleep(0.005)
        out["sigterm_idle_to_exit_s"] = round(time.monotonic() - t0, 3)
        os.kill(r2["pid"], signal.SIGKILL)
        out["kill9_to_down_s"] = round(until(run, "r2", "DOWN"), 3)
        out["health_check_interval_s"] = 1.0
    finally:
        subprocess.run(["bash", str(REPO / "deploy" / "local-cluster.sh"), "down"], env=info["env"], capture_output=True)
    print(json.dumps(out, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
