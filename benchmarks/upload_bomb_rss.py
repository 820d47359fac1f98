"""Server memory while it refuses decompression bombs on ``POST /v1/voices`` (issue #18).

    python benchmarks/upload_bomb_rss.py                  # demo model
    python benchmarks/upload_bomb_rss.py --repeat 10 --out bomb.json

Starts a ``streamtts serve`` process, then uploads, one at a time:

- ``clip``: a legitimate 29 s 48 kHz stereo WAV (the largest kind of clip that is accepted);
- ``bomb``: 16 MiB of FLAC (the upload cap) holding ~25 hours of a constant 48 kHz stereo
  signal, its length in its header (refused from the header, before decoding);
- ``bomb-no-length``: the same with no length in its header (refused after decoding 30 s);
- the last one ``--repeat`` times more (memory must not grow per upload).

For each: the server's RSS before, and its peak during the upload (Linux: the kernel's peak
VmHWM, reset through /proc/PID/clear_refs before each upload, so it is that upload's peak).
Reports numbers only; the test (tests/server/test_server_hardening.py) holds the < 50 MiB bound.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
from _common import MAX_VOICE_BYTES, flac_bomb, peak_rss_during, proc_status_mib, start_server


def wav_clip(seconds: float = 29.0) -> bytes:
    t = np.arange(int(48000 * seconds)) / 48000
    x = (0.2 * np.sin(2 * np.pi * 220 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([x, x], axis=1), 48000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="model config (default: the demo model)")
    ap.add_argument("--repeat", type=int, default=5, help="extra uploads of the last bomb")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    server_args = ["--max-streams", "2", "--no-warmup"] + (["--config", args.config] if args.config else [])
    proc, port, _log = start_server(server_args)
    uploads = [
        ("clip", wav_clip()),
        ("bomb", flac_bomb(MAX_VOICE_BYTES)),
        ("bomb-no-length", flac_bomb(MAX_VOICE_BYTES, known_length=False)),
    ]
    uploads += [(f"bomb-no-length again {i + 1}", uploads[-1][1] + bytes([i])) for i in range(args.repeat)]
    rows = []
    try:
        start_rss = proc_status_mib(proc.pid, "VmRSS")
        for name, body in uploads:
            def post(body: bytes = body) -> httpx.Response:
                return httpx.post(f"http://127.0.0.1:{port}/v1/voices", content=body, timeout=300)

            t0 = time.perf_counter()
            idle, peak, r = peak_rss_during(proc.pid, post)
            row = {
                "upload": name,
                "bytes": len(body),
                "status": r.status_code,
                "answer": r.json().get("error", {}).get("message", "accepted") if r.status_code >= 400 else "accepted",
                "rss_before_mib": round(idle, 1),
                "rss_peak_mib": round(peak, 1),
                "peak_over_before_mib": round(peak - idle, 1),
                "seconds": round(time.perf_counter() - t0, 3),
            }
            rows.append(row)
            print(f"{name:24s} {len(body) / 2**20:5.1f} MiB -> {r.status_code}  RSS before {idle:6.1f} MiB, "
                  f"peak {peak:6.1f} MiB (+{peak - idle:4.1f})  {row['seconds']:.2f} s")
        end_rss = proc_status_mib(proc.pid, "VmRSS")
        print(f"server RSS at start {start_rss:.1f} MiB, after all uploads {end_rss:.1f} MiB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.out:
        Path(args.out).write_text(json.dumps({"uploads": rows, "rss_start_mib": start_rss, "rss_end_mib": end_rss}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
