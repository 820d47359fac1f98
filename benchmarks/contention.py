"""Time to first audio of ``streamtts synth`` with and without a competing busy process.

    python benchmarks/contention.py --config /tmp/mid/config.yaml [--pairs 4] [--busy-core 0]

For each setting (llama.cpp threads and their polling level) runs ``streamtts synth`` alone,
then again while ``python -c 'while True: pass'`` is pinned with ``taskset`` to one core (a
neighbour that wants a whole core). Same seed and text every time; settings and conditions
alternate within each pair, so slow drift of the machine hits all of them alike. Prints one
table (TTFA median and range per setting and condition) and a JSON line. A benchmark: it
asserts nothing, and on a shared machine its numbers are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TEXT = "The quick brown fox jumps over the lazy dog."
# (label, n_threads, thread_poll): 0 threads = one per physical core; poll -1 = llama.cpp's own pool
SETTINGS = [
    ("old default: 2 threads (poll 0)", 2, 0),
    ("2 threads, llama.cpp's pool (poll 50)", 2, -1),
    ("1 thread", 1, 0),
    ("new default: auto (idle cores)", 0, 0),
]


def write_config(base: Path, tmp: Path, n_threads: int, poll: int) -> Path:
    cfg = yaml.safe_load(base.read_text())
    for key in ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir",
                "audio_encoder_onnx", "audio_decoder_onnx"):  # fmt: skip
        if cfg.get(key) and not Path(cfg[key]).is_absolute():
            cfg[key] = str(base.parent / cfg[key])
    cfg.update(n_threads=n_threads, thread_poll=poll)
    path = tmp / f"t{n_threads}-p{poll}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def ttfa_ms(config: Path, out: Path, seed: int) -> tuple[float, int]:
    """(TTFA in ms, llama.cpp threads the engine used) of one `streamtts synth` run."""
    cmd = [sys.executable, "-m", "streamtts", "-v", "synth", "--config", str(config),
           "--text", TEXT, "--seed", str(seed), "--out", str(out), "--max-new-tokens", "40"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"TTFA (\d+) ms", res.stdout)
    t = re.search(r"threads=(\d+)", res.stderr)
    if res.returncode != 0 or not m or not t:
        raise RuntimeError(f"synth failed ({res.returncode}): {res.stdout}\n{res.stderr}")
    return float(m.group(1)), int(t.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="the demo mid preset's config.yaml")
    ap.add_argument("--pairs", type=int, default=4, help="runs per setting and condition")
    ap.add_argument("--busy-core", type=int, default=0, help="core the busy loop is pinned to")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if shutil.which("taskset") is None:
        sys.exit("contention.py: needs taskset (util-linux)")
    base = Path(args.config).resolve()
    results: dict[tuple[str, bool], list[float]] = {}
    threads: dict[tuple[str, bool], list[int]] = {}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        configs = [(label, write_config(base, tmp, n, p)) for label, n, p in SETTINGS]
        for _ in range(args.pairs):
            for label, cfg in configs:
                for busy_on in (False, True):
                    busy = None
                    if busy_on:
                        busy = subprocess.Popen(
                            ["taskset", "-c", str(args.busy_core), sys.executable, "-c", "while True: pass"]
                        )
                        time.sleep(0.5)  # let it take its core
                    try:
                        ms, n = ttfa_ms(cfg, tmp / "o.wav", args.seed)
                    finally:
                        if busy is not None:
                            busy.kill()
                            busy.wait()
                    results.setdefault((label, busy_on), []).append(ms)
                    threads.setdefault((label, busy_on), []).append(n)
    load1 = os.getloadavg()
    print(f"TTFA of `streamtts synth` (ms; median [min-max] of {args.pairs}; threads used), "
          f"cores: {os.cpu_count()}, load average {load0[0]:.1f} at start, {load1[0]:.1f} at end")  # fmt: skip
    print(f"{'setting':40} {'alone':>26} {'with a busy core':>26}")
    for label, _ in configs:
        cells = []
        for busy_on in (False, True):
            v, n = results[(label, busy_on)], threads[(label, busy_on)]
            used = "/".join(str(x) for x in sorted(set(n)))
            cells.append(f"{statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] t={used}")
        print(f"{label:40} {cells[0]:>26} {cells[1]:>26}")
    print(json.dumps({f"{k[0]}|{'busy' if k[1] else 'alone'}": v for k, v in results.items()}))


if __name__ == "__main__":
    main()
