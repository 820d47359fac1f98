"""Load over real WebSockets with Poisson arrivals: continuity, TTFA and refusals.

    python benchmarks/ws_load.py --rate 0.5 --duration 120                  # demo model
    python benchmarks/ws_load.py --config /tmp/mid/config.yaml --load 0.5 1 2 --out load.json

1. Start ``streamtts serve`` on loopback (or use ``--server``), with ``--max-streams`` and
   any ``--server-arg``s (e.g. ``--server-arg=--chunk-frames --server-arg=2,4,8``: a chunk
   policy; ``--playback-buffer-ms`` has the sessions declare a playback buffer).
2. Sessions arrive as a Poisson process (exponential gaps, seeded) for ``--duration``
   seconds. Each speaks ``--min-sentences`` to ``--max-sentences`` sentences (drawn
   uniformly; on the demo models a sentence is about 3.5 s of audio): ``start``, the
   text, ``end``, then it listens as a player does: from its first audio it reads only
   while it holds less than ``--ahead`` seconds (2) beyond its playback clock, noting when
   each audio frame arrived (``--fast-reader``: it reads everything as it comes).
3. Per session: TTFA (text sent to first audio), what a real-time listener starting at its
   first audio plus 50 / 100 / 200 ms would hear (streamtts/audio/continuity.py), or the
   refusal (``overloaded``, close 1013) and how long after connecting it came.
4. Report per level: offered and carried load, sessions done / refused / failed, C50 /
   C100 / C200 and the p95 of the longest underrun (of the sessions done), TTFA p50 / p95,
   refusal time p50 / max, and the server's resident memory before and after.

``--rate`` is arrivals per second. ``--load X`` instead sets the rate to X times the
server's measured capacity divided by the mean audio length of a session (Little's law: a
listener holds its session for its audio's length, so sessions in flight = arrival rate x
audio length; each engine stream steps through a whole frame every 80 ms). First a
calibration runs ``--calibrate`` sessions one after another: their audio length, and their
TTFA (the unloaded TTFA each level's p95 is divided by: ``ttfa_p95_over_unloaded``). Then a
probe offers sessions at the hard cap's rate for ``--probe`` seconds: the capacity is the
mean of ``capacity_streams`` in ``/healthz`` (admission by measured capacity) over its second
half, what the server found under load (a fresh server starts low and raises it as it keeps
time). Each level runs in turn on the same server; meanwhile ``/healthz`` is read every
second (``capacity_streams_seen``) and the server's resident memory every five
(``rss_mb_samples``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets
from _common import start_server
from _load import arrival_times, hold_s, level_row, rss_mb, seen_row
from websockets.exceptions import ConnectionClosed

BYTES_PER_S = 2 * 24000  # pcm_s16le_24000


def sentences(n: int, seed: int) -> str:
    return " ".join(f"Session {seed} says sentence number {i}, spoken as its own segment." for i in range(n))


async def session(
    url: str, text: str, seed: int, ahead_s: float | None = 2.0, buffer_ms: float | None = None
) -> dict[str, Any]:
    """One session; ``ahead_s``: a real-time listener holding at most that much audio beyond
    its playback clock (None: it reads everything as it comes); ``buffer_ms``: the playback
    buffer its ``start`` declares (None: none declared)."""
    start: dict[str, Any] = {"type": "start", "seed": seed}
    if buffer_ms is not None:
        start["playback_buffer_ms"] = buffer_ms
    t_connect = time.monotonic()
    out: dict[str, Any] = {"arrivals": [], "events": [], "outcome": "failed", "t_connect": t_connect}
    try:
        async with websockets.connect(url, max_size=None, compression=None, open_timeout=30) as ws:
            await ws.send(json.dumps(start))
            t_text = time.monotonic()
            await ws.send(json.dumps({"type": "text", "text": text}))
            await ws.send(json.dumps({"type": "end"}))
            got = 0.0
            while True:
                if ahead_s is not None:
                    hold = hold_s(got, out.get("t_first"), time.monotonic())  # audio in hand, unplayed
                    if hold > ahead_s:
                        await asyncio.sleep(hold - ahead_s)
                        continue
                try:
                    msg = await ws.recv()
                except ConnectionClosed as exc:
                    out.setdefault("error", f"closed {exc.rcvd.code if exc.rcvd else None}")
                    break
                now = time.monotonic()
                if isinstance(msg, bytes):
                    got += len(msg) / BYTES_PER_S
                    out.setdefault("t_first", now)
                    out["arrivals"].append((now, len(msg) / BYTES_PER_S))
                    out.setdefault("ttfa_s", now - t_text)
                    continue
                ev = json.loads(msg)
                out["events"].append((now, ev))
                if ev["type"] == "done":
                    out["outcome"] = "done"
                    break
                elif ev["type"] == "error" and ev.get("fatal"):
                    out["outcome"] = "refused" if ev["code"] == "overloaded" else ev["code"]
                    out["answer_s"] = now - t_connect
    except ConnectionClosed as exc:  # closed while sending: refused at the session limit
        out["error"] = repr(exc)
        if exc.rcvd is not None and exc.rcvd.code == 1013 and exc.rcvd.reason == "overloaded":
            out["outcome"], out["answer_s"] = "refused", time.monotonic() - t_connect
    except (OSError, TimeoutError) as exc:
        out["error"] = repr(exc)
    out["audio_s"] = sum(s for _, s in out["arrivals"])
    return out


def health(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(http + "/healthz", timeout=10) as r:
        return dict(json.loads(r.read()))


async def watch(http: str, pid: int | None, into: dict[str, list[float]]) -> None:
    """Every second the server's capacity, every five its resident memory, until cancelled."""
    k = 0
    while True:
        h = await asyncio.to_thread(health, http)
        into["capacity"].append(float(h.get("capacity_streams", 0)))
        if k % 5 == 0 and (mb := rss_mb(pid)) is not None:
            into["rss"].append(mb)
        k += 1
        await asyncio.sleep(1.0)


async def level(
    url: str, rate: float, a: argparse.Namespace, seed: int, duration: float | None = None,
    http: str | None = None, pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed * 7919 + 1)  # the sentences: apart from the arrival times
    tasks = []
    seen: dict[str, list[float]] = {"capacity": [], "rss": []}
    watcher = asyncio.create_task(watch(http, pid, seen)) if http else None
    t0 = time.monotonic()
    for i, t in enumerate(arrival_times(rate, a.duration if duration is None else duration, seed)):
        await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
        n = rng.randint(a.min_sentences, a.max_sentences)
        sid = seed * 10_000 + i
        tasks.append(asyncio.create_task(session(url, sentences(n, sid), sid, a.ahead, a.playback_buffer_ms)))
    res = await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    if watcher is not None:
        watcher.cancel()
    row = level_row(res, rate, wall)
    row.update(seen_row(seen["capacity"], seen["rss"]))
    if a.detail:  # every session: when it connected, its outcome, TTFA and audio arrivals
        row["detail"] = [
            {"t": round(r["t_connect"] - t0, 3), "outcome": r["outcome"], "ttfa_s": r.get("ttfa_s"),
             "events": [(round(t - r["t_connect"], 3), ev) for t, ev in r["events"]],
             "arrivals": [(round(t - r["t_connect"], 3), round(s, 3)) for t, s in r["arrivals"]]}
            for r in res
        ]  # fmt: skip
    return row


async def calibrate(url: str, a: argparse.Namespace) -> tuple[float, list[float]]:
    """Mean audio seconds of a session and each one's TTFA in ms (sessions one after
    another, read as they come: the unloaded TTFA)."""
    spans, ttfa = [], []
    for i in range(a.calibrate):
        n = (a.min_sentences + a.max_sentences) // 2 if a.calibrate == 1 else a.min_sentences + i * (a.max_sentences - a.min_sentences) // (a.calibrate - 1)
        r = await session(url, sentences(n, 900 + i), 900 + i, None)
        if r["outcome"] != "done":
            raise RuntimeError(f"calibration session ended with {r['outcome']}: {r.get('error')}")
        spans.append(r["audio_s"])
        ttfa.append(round(1000 * r["ttfa_s"], 1))
    return statistics.mean(spans), ttfa


async def main(a: argparse.Namespace) -> dict[str, Any]:
    proc = log = None
    if a.server:
        http = a.server.rstrip("/")
    else:
        args = ["--max-streams", str(a.max_streams), *a.server_arg]
        if a.config:
            args += ["--config", a.config]
        proc, port, log = start_server(args)
        http = f"http://127.0.0.1:{port}"
    url = http.replace("http", "ws", 1) + "/v1/stream"
    pid = proc.pid if proc is not None else None
    out: dict[str, Any] = {"config": a.config, "max_streams": a.max_streams, "server_args": a.server_arg,
                           "duration_s": a.duration, "sentences": [a.min_sentences, a.max_sentences], "levels": []}  # fmt: skip
    try:
        await session(url, sentences(1, 1), 1, None)  # warm-up
        rates = [(r, None) for r in a.rate]
        unloaded = None
        if a.load:
            span, ttfa = await calibrate(url, a)
            unloaded = statistics.median(ttfa)
            out["calibration"] = {"session_audio_s": round(span, 2), "ttfa_ms": ttfa, "ttfa_ms_median": unloaded}
            cap = a.capacity
            if cap is None and a.probe > 0:
                # the capacity found under load: sessions offered at the hard cap's rate
                probe = await level(url, a.max_streams / span, a, seed=999, duration=a.probe, http=http, pid=pid)
                probe["load"] = "probe"
                out["probe"] = probe
                print(json.dumps(probe), flush=True)
                cap = max(1.0, probe["capacity_streams_seen"]["last_half_mean"])
                await asyncio.sleep(a.pause)
            if cap is None:
                cap = health(http).get("capacity_streams")
                if cap is None:
                    raise SystemExit("streamtts: the server reports no capacity_streams in /healthz: use --rate")
            out["calibration"]["capacity_streams"] = cap
            rates = [(x * cap / span, x) for x in a.load]
        for k, (rate, load) in enumerate(rates):
            before = rss_mb(pid)
            row = await level(url, rate, a, seed=k + 1, http=http, pid=pid)
            row["load"] = load
            if unloaded and row["ttfa_ms_p95"] is not None:
                row["ttfa_p95_over_unloaded"] = round(row["ttfa_ms_p95"] / unloaded, 2)
            row["rss_mb_before"], row["rss_mb_after"] = before, rss_mb(pid)
            h = health(http)
            row["capacity_streams_after"] = h.get("capacity_streams")
            out["levels"].append(row)
            print(json.dumps(row), flush=True)
            await asyncio.sleep(a.pause)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
            out["server_log_tail"] = log.read_text(errors="replace").splitlines()[-20:] if log else []
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="model config (default: the demo model)")
    p.add_argument("--server", help="an already running server's base URL (http://HOST:PORT) instead of starting one")
    p.add_argument("--server-arg", action="append", default=[], help="an extra `streamtts serve` argument (repeat)")
    p.add_argument("--max-streams", type=int, default=16)
    p.add_argument("--rate", type=float, nargs="*", default=[0.5], help="arrivals per second, one level each")
    p.add_argument("--load", type=float, nargs="*", help="levels as multiples of the measured capacity (instead of --rate)")
    p.add_argument(
        "--capacity", type=float,
        help="--load in multiples of this many streams (e.g. the capacity an earlier run found) instead of "
        "the capacity the probe finds",
    )  # fmt: skip
    p.add_argument(
        "--probe", type=float, default=30.0,
        help="--load: seconds of a first level offered at the hard cap's rate; the capacity the server "
        "reports over its second half is the one --load multiplies (0: what /healthz says after the "
        "calibration, sessions alone)",
    )  # fmt: skip
    p.add_argument("--calibrate", type=int, default=3, help="sessions timed alone to learn a session's length (--load)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per level")
    p.add_argument("--pause", type=float, default=5.0, help="seconds between levels")
    p.add_argument("--min-sentences", type=int, default=1)
    p.add_argument("--max-sentences", type=int, default=12)
    p.add_argument("--ahead", type=float, default=2.0, help="a listener's read-ahead beyond its playback clock (s)")
    p.add_argument("--fast-reader", dest="ahead", action="store_const", const=None, help="read everything as it comes")
    p.add_argument(
        "--playback-buffer-ms", type=float,
        help="the playback buffer each session's `start` declares (playback_buffer_ms; default: none)",
    )  # fmt: skip
    p.add_argument("--detail", action="store_true", help="keep every session's events and audio arrivals in --out")
    p.add_argument("--out", help="write the results as JSON")
    args = p.parse_args()
    result = asyncio.run(main(args))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
