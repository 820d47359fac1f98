"""Time and memory of ``streamtts convert-hf`` on a checkpoint of a few hundred MB.

    python benchmarks/convert_hf.py [--workdir DIR] [--threads N] [--json OUT]

Writes a bf16 MOSS-TTS-Delay checkpoint with the demo writer (a 512-wide, 12-layer Qwen3
backbone with the real 151936-row vocabulary and 32 audio codebooks: about 450 MB, the
shape of the published one at a smaller width), then converts it twice, each in a fresh
process: to F16 only (reading, the .npy tables, the F16 GGUF), and to Q4_K_M (the same plus
llama.cpp's quantizer). Reports wall time per step, the conversion rate, Q4_K_M time per GB
of F16 input, peak resident memory (VmHWM, and its anonymous part sampled every 20 ms:
llama.cpp's quantizer maps the F16 file, and mapped file pages count as resident while
they are cached), and projects the 8B (16 GB bf16) at the measured rates. Reports, never
asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The published model: H = 4096, 36 layers, FFN 12288, 32 query / 8 KV heads of 128.
BIG = {"n_embd": 4096, "n_layer": 36, "n_ff": 12288, "q": 32 * 128, "kv": 8 * 128}
V_TEXT, N_VQ, AUDIO_ROWS = 151936, 32, 1025


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(src: str, out: str, quants: list[str], threads: int) -> None:
    """One conversion in this (fresh) process; prints its numbers as JSON."""
    from streamtts.convert.hf import convert_hf

    peak_anon = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak_anon[0] = max(peak_anon[0], _status("RssAnon"))

    th = threading.Thread(target=sample, daemon=True)
    base_rss = _status("VmRSS")
    th.start()
    t0 = time.perf_counter()
    res = convert_hf(src, out, quants, keep_f16=True, n_threads=threads, gpu=False)
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    sizes = {p.name: p.stat().st_size for p in Path(out).glob("*.gguf")}
    npy = sum(p.stat().st_size for p in Path(out).rglob("*.npy"))
    print(json.dumps({
        "wall_s": wall, "steps": res.step_seconds, "vmhwm": _status("VmHWM"),
        "peak_anon": max(peak_anon[0], _status("RssAnon")), "rss_before": base_rss,
        "gguf_bytes": sizes, "npy_bytes": npy,
    }))  # fmt: skip


def _run_child(src: Path, out: Path, quants: list[str], threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(src), str(out), ",".join(quants), str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def _big_sizes() -> dict[str, float]:
    """Bytes the 8B conversion reads and writes (bf16 source, f16 outputs)."""
    b = BIG
    layer = 2 * b["q"] * b["n_embd"] + 2 * b["kv"] * b["n_embd"] + 3 * b["n_ff"] * b["n_embd"]
    backbone = b["n_layer"] * layer + 2 * V_TEXT * b["n_embd"]
    tables = 2 * V_TEXT * b["n_embd"] + 2 * N_VQ * AUDIO_ROWS * b["n_embd"]
    audio = 2 * N_VQ * AUDIO_ROWS * b["n_embd"]
    return {"f16_gguf": 2.0 * backbone, "npy": 2.0 * tables, "source": 2.0 * (backbone + audio)}


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", help="where to write (default: a temporary folder, removed)")
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0: all cores)")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args()

    from streamtts.demo.hf_checkpoint import write_demo_hf_checkpoint
    from streamtts.demo.model import DemoPreset

    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        work = Path(tmp)
        preset = DemoPreset(
            name="bench", n_embd=512, n_layer=12, n_head=8, n_head_kv=4, head_dim=64, n_ff=1536
        )
        t0 = time.perf_counter()
        src = write_demo_hf_checkpoint(
            work / "hf", preset, seed=0, dtype="bf16", max_shard_bytes=200_000_000
        )
        src_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        print(f"checkpoint: {_mb(src_bytes)} bf16 in {len(list(src.glob('*.safetensors')))} shards "
              f"(written in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)  # fmt: skip
        f16 = _run_child(src, work / "f16", ["F16"], a.threads)
        q4 = _run_child(src, work / "q4", ["Q4_K_M"], a.threads)

    write_bytes = f16["gguf_bytes"]["MOSS_TTS_F16.gguf"] + f16["npy_bytes"]
    convert_s = f16["steps"]["tables"] + f16["steps"]["f16_gguf"]
    rate = write_bytes / convert_s  # output bytes per second (npy + F16 GGUF)
    q_s = q4["steps"]["quantize_Q4_K_M"]
    f16_gb = q4["gguf_bytes"]["MOSS_TTS_F16.gguf"] / 1e9
    q_per_gb = q_s / f16_gb
    big = _big_sizes()
    big_convert = (big["f16_gguf"] + big["npy"]) / rate
    big_quant = q_per_gb * big["f16_gguf"] / 1e9
    largest = V_TEXT * 512 * 2
    rows = [
        ("checkpoint (bf16)", _mb(src_bytes)),
        ("npy tables + F16 GGUF written", _mb(write_bytes)),
        ("tables (.npy)", f"{f16['steps']['tables']:.1f} s"),
        ("F16 GGUF", f"{f16['steps']['f16_gguf']:.1f} s"),
        ("conversion rate (output)", f"{rate / 1e6:,.0f} MB/s"),
        ("Q4_K_M quantization", f"{q_s:.1f} s for {f16_gb:.2f} GB F16 = {q_per_gb:.1f} s/GB"),
        ("whole run, F16 only", f"{f16['wall_s']:.1f} s"),
        ("whole run, Q4_K_M (+F16 kept)", f"{q4['wall_s']:.1f} s"),
        ("largest tensor (embed, bf16)", _mb(largest)),
        ("peak RSS, F16 run (VmHWM)", _mb(f16["vmhwm"])),
        ("peak anonymous RSS, F16 run", _mb(f16["peak_anon"])),
        ("peak RSS, Q4_K_M run (VmHWM)", _mb(q4["vmhwm"])),
        ("peak anonymous RSS, Q4_K_M run", _mb(q4["peak_anon"])),
        ("RSS after imports (baseline)", _mb(f16["rss_before"])),
        ("8B checkpoint (bf16)", f"{big['source'] / 1e9:.1f} GB"),
        (
            "8B projection: npy + F16 GGUF",
            f"{big_convert / 60:.1f} min ({(big['f16_gguf'] + big['npy']) / 1e9:.1f} GB written)",
        ),
        (
            "8B projection: Q4_K_M",
            f"{big_quant / 60:.1f} min ({big['f16_gguf'] / 1e9:.1f} GB F16 in)",
        ),
    ]
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(f"\n({os.cpu_count()} CPUs; quantizer threads: {a.threads or 'all'})")
    if a.json:
        Path(a.json).write_text(
            json.dumps({"f16": f16, "q4_k_m": q4, "src_bytes": src_bytes}, indent=2)
        )


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4].split(","), int(sys.argv[5]))
    else:
        main()
