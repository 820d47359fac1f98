"""What the server costs on top of the engine, and how many sessions it holds at real time.

    python benchmarks/ws_ttfa.py                     # demo model, 20 reps, sessions 1..16
    python benchmarks/ws_ttfa.py --config weights/config.yaml --max-streams 8 --out ws.json

1. TTFA over WebSocket minus TTFA in-process. The same text and seed, ``--reps`` times,
   alternating: (a) a session on a ``streamtts serve`` process on loopback: time from sending
   ``text`` + ``end`` (session already ``ready``) to the first binary frame; (b) ``engine.stream``
   in this process: time from the call to the first chunk. Reported: both medians, their
   difference, and the median of (WS TTFA - the engine's own TTFA of that same request, from the
   ``segment`` message), which is the server's overhead alone, free of run-to-run engine noise.
2. Sessions held at real time. n sessions start at once, each speaking ``--session-text``
   (several segments) through a simulated player: playback starts ``--preroll-ms`` after a
   session's first audio, and every chunk must arrive before its samples are due. A session is
   held at real time when no chunk is late; n is held when every session is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import websockets
from _common import start_server

TEXT = "Hello there, this is a latency test."
SESSION_TEXT = (
    "The first sentence of this session is here. A second sentence follows right after it. "
    "And the third sentence ends the test."
)


async def ws_once(url: str, text: str, seed: int) -> tuple[float, float]:
    """(client TTFA, the engine's TTFA of the same request), in seconds."""
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "start", "seed": seed, "format": "pcm_f32le_24000"}))
        assert json.loads(await ws.recv())["type"] == "ready"
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "text", "text": text}))
        await ws.send(json.dumps({"type": "end"}))
        ttfa = None
        engine_ttfa = None
        async for msg in ws:
            if isinstance(msg, bytes):
                if ttfa is None:
                    ttfa = time.perf_counter() - t0
            else:
                ev = json.loads(msg)
                if ev["type"] == "segment" and engine_ttfa is None:
                    engine_ttfa = ev["ttfa_ms"] / 1000
                elif ev["type"] == "error":
                    raise RuntimeError(ev)
    assert ttfa is not None and engine_ttfa is not None
    return ttfa, engine_ttfa


async def local_once(engine: Any, text: str, seed: int) -> float:
    from streamtts.request import StreamOptions

    t0 = time.perf_counter()
    s = engine.stream(text, options=StreamOptions(seed=seed))
    ttfa = None
    async with s:
        async for _chunk in s:
            if ttfa is None:
                ttfa = time.perf_counter() - t0
    assert ttfa is not None
    return ttfa


async def player_session(url: str, text: str, seed: int, preroll_s: float) -> dict[str, float]:
    """One session through a simulated real-time player: how late was the latest chunk?"""
    rate = 24000
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "start", "seed": seed, "format": "pcm_f32le_24000"}))
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "text", "text": text}))
        await ws.send(json.dumps({"type": "end"}))
        t_first = None
        samples = 0
        worst_late = 0.0
        done: dict[str, Any] = {}
        async for msg in ws:
            now = time.perf_counter()
            if isinstance(msg, bytes):
                if t_first is None:
                    t_first = now
                due = t_first + preroll_s + samples / rate  # when a player needs these samples
                worst_late = max(worst_late, now - due)
                samples += len(msg) // 4
            else:
                ev = json.loads(msg)
                if ev["type"] == "done":
                    done = ev
                elif ev["type"] == "error":
                    raise RuntimeError(ev)
    assert t_first is not None
    return {
        "ttfa_s": t_first - t0,
        "late_s": max(0.0, worst_late),
        "audio_s": samples / rate,
        "rtf": float(done.get("rtf") or "nan"),
    }


async def concurrency(url: str, n: int, text: str, preroll_s: float) -> dict[str, Any]:
    res = await asyncio.gather(*(player_session(url, text, 1000 + i, preroll_s) for i in range(n)))
    late = [r["late_s"] for r in res]
    return {
        "sessions": n,
        "held": all(x == 0.0 for x in late),
        "late_sessions": sum(x > 0 for x in late),
        "worst_late_ms": round(1000 * max(late), 1),
        "ttfa_median_ms": round(1000 * statistics.median(r["ttfa_s"] for r in res), 1),
        "ttfa_max_ms": round(1000 * max(r["ttfa_s"] for r in res), 1),
        "rtf_median": round(statistics.median(r["rtf"] for r in res), 3),
    }


async def main(a: argparse.Namespace) -> dict[str, Any]:
    from streamtts.engine.frontend import Engine

    server_args = ["--max-streams", str(a.max_streams), "--max-sessions", str(max(a.sessions))]
    if a.config:
        server_args += ["--config", a.config]
    proc, port, log = start_server(server_args)
    url = f"ws://127.0.0.1:{port}/v1/stream"
    out: dict[str, Any] = {"text": a.text, "reps": a.reps, "max_streams": a.max_streams}
    try:
        engine = Engine.from_config(a.config, max_streams=a.max_streams)
        async with engine:
            await local_once(engine, a.text, a.seed)  # warm-up, both sides
            await ws_once(url, a.text, a.seed)
            ws_t, eng_t, local_t = [], [], []
            for _ in range(a.reps):
                w, e = await ws_once(url, a.text, a.seed)
                ws_t.append(w)
                eng_t.append(e)
                local_t.append(await local_once(engine, a.text, a.seed))
        med = statistics.median
        out["ttfa"] = {
            "ws_median_ms": round(1000 * med(ws_t), 2),
            "in_process_median_ms": round(1000 * med(local_t), 2),
            "ws_minus_in_process_ms": round(1000 * (med(ws_t) - med(local_t)), 2),
            "ws_minus_same_request_engine_median_ms": round(
                1000 * med(w - e for w, e in zip(ws_t, eng_t, strict=True)), 2
            ),
            "ws_ms": [round(1000 * x, 2) for x in ws_t],
            "in_process_ms": [round(1000 * x, 2) for x in local_t],
        }
        print(json.dumps(out["ttfa"], indent=2), flush=True)
        rows = []
        for n in a.sessions:
            row = await concurrency(url, n, a.session_text, a.preroll_ms / 1000)
            rows.append(row)
            print(json.dumps(row), flush=True)
        out["concurrency"] = rows
        held = [r["sessions"] for r in rows if r["held"]]
        out["sessions_held_at_real_time"] = max(held) if held else 0
        out["preroll_ms"] = a.preroll_ms
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.unlink(missing_ok=True)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="model config (default: the demo model)")
    p.add_argument("--max-streams", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--text", default=TEXT)
    p.add_argument("--session-text", default=SESSION_TEXT)
    p.add_argument(
        "--sessions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 12, 16]
    )
    p.add_argument(
        "--preroll-ms",
        type=float,
        default=200.0,
        help="the simulated player's buffer before playback",
    )
    p.add_argument("--out", help="write the results as JSON")
    args = p.parse_args()
    result = asyncio.run(main(args))
    print(
        f"TTFA over WebSocket minus in-process: {result['ttfa']['ws_minus_in_process_ms']} ms (median of {args.reps})"
    )
    print(
        f"  server overhead on the same request: {result['ttfa']['ws_minus_same_request_engine_median_ms']} ms"
    )
    print(
        f"sessions held at real time: {result['sessions_held_at_real_time']} (preroll {args.preroll_ms:.0f} ms)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
