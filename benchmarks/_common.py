"""What several benchmarks and the tests share: a ``streamtts serve`` process on loopback, the
decompression-bomb uploads and the server's memory while it takes one.

Benchmarks import it as ``_common`` (a script's folder is on its path); the tests as
``benchmarks._common`` through ``tests/conftest.py`` (pytest puts the checkout on the path).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf


def __getattr__(name: str) -> Any:
    # MAX_VOICE_BYTES: the server's upload cap (POST /v1/voices), read from its settings only
    # when asked for (importing the server takes seconds)
    if name == "MAX_VOICE_BYTES":
        from streamtts.server.app_state import ServerSettings

        return ServerSettings().max_voice_bytes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def start_server(
    args: list[str], log_path: Path | None = None, timeout: float = 300.0
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Start ``streamtts serve --port 0 ARGS`` (output to ``log_path``, default a temporary
    file); return (process, port, log path) once ``/healthz`` answers 200."""
    log = log_path or Path(tempfile.mkstemp(prefix="streamtts-bench-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "streamtts.cli.main", "serve", "--host", "127.0.0.1", "--port", "0", *args]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    port = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if not port and (m := re.search(r"serving on http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))):
            port = int(m.group(1))
        if port:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                    if r.status == 200:
                        return proc, port, log
            except OSError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server not ready after {timeout} s:\n{log.read_text(errors='replace')}")


def flac_bomb(size: int, known_length: bool = True) -> bytes:
    """A FLAC file of at most ``size`` bytes: a constant 48 kHz stereo signal, the frames of
    its 20 minutes repeated (about 25 hours in 16 MiB, tens of GB decoded). Without
    ``known_length`` its header gives no length, as a streamed FLAC's does."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 48000, 2, format="FLAC", subtype="PCM_16") as f:
        block = np.full((48000 * 10, 2), 0.25, np.float32)
        for _ in range(6 * 20):
            f.write(block)
    data = buf.getvalue()
    pos = 4  # after "fLaC": the metadata blocks, the last one flagged
    while True:
        last, length = data[pos] & 0x80, int.from_bytes(data[pos + 1 : pos + 4], "big")
        pos += 4 + length
        if last:
            break
    frames = data[pos:]
    bomb = bytearray(data[:pos] + frames * max(1, (size - pos) // len(frames)))
    if not known_length:  # STREAMINFO's 36-bit total-samples field = 0: unknown
        bomb[8 + 13] &= 0xF0
        bomb[8 + 14 : 8 + 18] = bytes(4)
    return bytes(bomb)


def proc_status_mib(pid: int, key: str) -> float:
    """One ``kB`` line of ``/proc/PID/status`` (VmRSS, VmHWM, ...), in MiB (Linux)."""
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    if m is None:
        raise RuntimeError(f"no {key} in /proc/{pid}/status")
    return int(m.group(1)) / 1024


def peak_rss_during(pid: int, action: Callable[[], Any]) -> tuple[float, float, Any]:
    """(RSS before, peak RSS while ``action()`` ran, its result), in MiB (Linux): the kernel's
    peak VmHWM, reset through /proc/PID/clear_refs first, so it is that action's peak."""
    idle = proc_status_mib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    result = action()
    return idle, proc_status_mib(pid, "VmHWM"), result
