"""Load on an engine in this process, Poisson arrivals: continuity, TTFA and refusals.

    python benchmarks/engine_load.py --load 0.5 1 2 --duration 60 --out load.json   # demo model
    python benchmarks/engine_load.py --config gpu-check.yaml --max-streams 256 --load 1 2

``ws_load.py``'s measure without the server, for a model whose streams have no natural length
(the GPU check's random 8B model ends an utterance by chance within a few frames): each stream
speaks a fixed number of frames (``StreamOptions.fixed_frames``) drawn uniformly between
``--min-s`` and ``--max-s`` seconds. The engine admits by measured capacity
(``admission: capacity``, ``first_audio_deadline_s`` = ``--deadline-s``); everything else is
``ws_load.py``'s:

1. a warm-up stream, then ``--calibrate`` streams one after another: the unloaded TTFA (each
   level's p95 is divided by its median: ``ttfa_p95_over_unloaded``);
2. a probe offering streams at the hard cap's rate for ``--probe`` seconds (a stream holds
   its slot until its last frame is made: the calibration's mean-length stream, alone,
   gives the rate): the capacity is the mean of the engine's ``capacity_streams`` over its
   second half (``--capacity`` instead: that many streams);
3. each ``--load X`` level offers X times that capacity (Little's law: arrival rate = X x
   capacity / the time a stream held its slot in the probe, request to last chunk; a stream
   shorter than the engine's read-ahead, ``max_buffered_s``, is made faster than it is
   heard, so its audio length would under-count) for ``--duration`` seconds; each stream
   is read by a real-time listener holding at most ``--ahead`` seconds beyond its playback
   clock.

Per level: sessions done / refused / failed, C50 / C100 / C200 and the p95 of the longest
underrun, TTFA p50 / p95, how long a refusal took (from the request to ``OverloadedError``),
the capacity the engine reported each second and this process's resident memory every five;
``ttfa_parts_ms``: TTFA's two parts, p50 / p95 of the streams done, from the request to its
prompt prefilled (queue, preparation, prefill) and from there to its first chunk made (the
ticks of its first frames and the codec's first call).
The load generator runs in the engine's process, as the server's WebSocket handlers do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _load import arrival_times, hold_s, level_row, pct, rss_mb, seen_row

from streamtts import Engine
from streamtts.constants import FRAME_RATE, SAMPLE_RATE
from streamtts.errors import OverloadedError, QueueTimeoutError, StreamTTSError
from streamtts.request import StreamOptions

TEXT = "The quick brown fox jumps over the lazy dog, and the load goes on."


async def one(engine: Engine, seed: int, frames: int, ahead_s: float | None) -> dict[str, Any]:
    """One stream of ``frames`` frames, read by a listener ``ahead_s`` ahead (None: as it comes)."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"arrivals": [], "outcome": "failed", "t_connect": t0}
    got = 0.0
    try:
        s = engine.stream(TEXT, options=StreamOptions(seed=seed, fixed_frames=frames))
        async with s:
            async for chunk in s:
                now = time.monotonic()
                seconds = chunk.pcm.shape[0] / SAMPLE_RATE
                out.setdefault("t_first", now)
                out.setdefault("ttfa_s", now - t0)
                out["arrivals"].append((now, seconds))
                out["t_last"] = now
                got += seconds
                if ahead_s is not None and (hold := hold_s(got, out["t_first"], now)) > ahead_s:
                    await asyncio.sleep(hold - ahead_s)
        out["outcome"] = "done"
        st = s.stats  # the engine's clock: request, prompt prefilled, first chunk made
        out["to_prefilled_ms"] = 1000 * (st.t_prefilled - st.t_submit)
        out["to_first_chunk_ms"] = 1000 * (st.t_first_made - st.t_prefilled)
    except QueueTimeoutError as exc:  # waited for a slot past its deadline: not a quick refusal
        out["outcome"], out["error"] = "queue_timeout", str(exc)
    except OverloadedError as exc:
        out["outcome"], out["answer_s"], out["error"] = "refused", time.monotonic() - t0, str(exc)
    except StreamTTSError as exc:
        out["outcome"], out["error"] = type(exc).__name__, str(exc)
    out["audio_s"] = got
    return out


async def watch(engine: Engine, into: dict[str, list[float]]) -> None:
    """Every second the engine's capacity, every five this process's memory, until cancelled."""
    k = 0
    while True:
        into["capacity"].append(float(engine.admission_info().get("capacity_streams", 0)))
        if k % 5 == 0 and (mb := rss_mb()) is not None:
            into["rss"].append(mb)
        k += 1
        await asyncio.sleep(1.0)


def frames_between(rng: random.Random, a: argparse.Namespace) -> int:
    return rng.randint(max(1, round(a.min_s * FRAME_RATE)), max(1, round(a.max_s * FRAME_RATE)))


async def level(engine: Engine, rate: float, a: argparse.Namespace, seed: int, duration: float) -> dict[str, Any]:
    rng = random.Random(seed * 7919 + 1)  # the lengths: apart from the arrival times
    seen: dict[str, list[float]] = {"capacity": [], "rss": []}
    watcher = asyncio.create_task(watch(engine, seen))
    tasks = []
    t0 = time.monotonic()
    for i, t in enumerate(arrival_times(rate, duration, seed)):
        await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
        tasks.append(asyncio.create_task(one(engine, seed * 10_000 + i, frames_between(rng, a), a.ahead)))
    res = await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    watcher.cancel()
    row = level_row(res, rate, wall)
    row.update(seen_row(seen["capacity"], seen["rss"]))
    done = [r for r in res if r["outcome"] == "done"]
    held = [r["t_last"] - r["t_connect"] for r in done]
    row["slot_held_s_mean"] = round(statistics.mean(held), 3) if held else None  # request to last chunk
    row["ttfa_parts_ms"] = {
        part: [pct([r[part] for r in done], q) for q in (50, 95)] for part in ("to_prefilled_ms", "to_first_chunk_ms")
    }
    return row


async def main(a: argparse.Namespace) -> dict[str, Any]:
    engine = Engine.from_config(
        a.config, max_streams=a.max_streams, admission="capacity", first_audio_deadline_s=a.deadline_s,
        n_threads=a.n_threads,
    )
    mean_s = (a.min_s + a.max_s) / 2
    out: dict[str, Any] = {"config": a.config, "max_streams": a.max_streams, "deadline_s": a.deadline_s,
                           "duration_s": a.duration, "stream_s": [a.min_s, a.max_s], "levels": []}  # fmt: skip
    async with engine:
        await one(engine, 1, 25, None)  # warm-up
        engine.forget_ticks()
        ttfa, made = [], []
        for i in range(max(1, a.calibrate)):  # mean-length streams, alone, read as they come
            r = await one(engine, 900 + i, max(1, round(mean_s * FRAME_RATE)), None)
            if r["outcome"] != "done":
                raise RuntimeError(f"calibration stream ended with {r['outcome']}: {r.get('error')}")
            ttfa.append(round(1000 * r["ttfa_s"], 1))
            made.append(r["t_last"] - r["t_connect"])
        unloaded = statistics.median(ttfa)
        out["calibration"] = {"ttfa_ms": ttfa, "ttfa_ms_median": unloaded, "stream_audio_s_mean": mean_s,
                              "made_alone_s": round(statistics.median(made), 3)}  # fmt: skip
        cap, held = a.capacity, mean_s
        if cap is None:
            probe = await level(engine, a.max_streams / statistics.median(made), a, seed=999, duration=a.probe)
            probe["load"] = "probe"
            out["probe"] = probe
            print(json.dumps(probe), flush=True)
            cap = max(1.0, probe["capacity_streams_seen"]["last_half_mean"])
            held = probe["slot_held_s_mean"] or mean_s
            await asyncio.sleep(a.pause)
        out["calibration"]["capacity_streams"] = cap
        out["calibration"]["slot_held_s"] = held
        for k, load in enumerate(a.load):
            before = rss_mb()
            row = await level(engine, load * cap / held, a, seed=k + 1, duration=a.duration)
            row["load"] = load
            if unloaded and row["ttfa_ms_p95"] is not None:
                row["ttfa_p95_over_unloaded"] = round(row["ttfa_ms_p95"] / unloaded, 2)
            row["rss_mb_before"], row["rss_mb_after"] = before, rss_mb()
            row["capacity_streams_after"] = engine.admission_info().get("capacity_streams")
            row["threads_chosen"] = engine.threads_chosen()  # rows -> llama.cpp threads
            out["levels"].append(row)
            print(json.dumps(row), flush=True)
            await asyncio.sleep(a.pause)
        out["admission"] = engine.admission_info()
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="model config (default: the demo model)")
    p.add_argument("--max-streams", type=int, default=16, help="the hard cap (max_streams)")
    p.add_argument("--n-threads", type=int, default=None, help="llama.cpp's threads (default: the config's)")
    p.add_argument("--deadline-s", type=float, default=0.5, help="first_audio_deadline_s: the longest a stream may wait for a slot")
    p.add_argument("--load", type=float, nargs="*", default=[0.5, 1.0, 2.0], help="levels as multiples of the capacity")
    p.add_argument("--capacity", type=float, help="--load in multiples of this many streams instead of the probe's")
    p.add_argument("--probe", type=float, default=30.0, help="seconds of streams offered at the hard cap's rate")
    p.add_argument("--calibrate", type=int, default=3, help="mean-length streams timed alone: the unloaded TTFA")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per level")
    p.add_argument("--pause", type=float, default=5.0, help="seconds between levels")
    p.add_argument("--min-s", type=float, default=3.0, help="shortest stream (audio seconds)")
    p.add_argument("--max-s", type=float, default=60.0, help="longest stream (audio seconds)")
    p.add_argument("--ahead", type=float, default=2.0, help="a listener's read-ahead beyond its playback clock (s)")
    p.add_argument("--fast-reader", dest="ahead", action="store_const", const=None, help="read everything as it comes")
    p.add_argument("--out", help="write the results as JSON")
    a = p.parse_args(argv)
    if not 0 < a.min_s <= a.max_s:
        p.error(f"need 0 < --min-s <= --max-s, got {a.min_s} and {a.max_s}")
    if a.capacity is None and a.probe <= 0:
        p.error("--probe must be > 0 unless --capacity is given")
    return a


if __name__ == "__main__":
    args = parse()
    result = asyncio.run(main(args))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0)
