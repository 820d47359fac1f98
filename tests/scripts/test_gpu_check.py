"""scripts/gpu_check.sh --dry-run-cpu: the GPU check's whole pipeline on a tiny model on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run-cpu", "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    for needle in (
        "bare llama.cpp step, fused GGUF",
        "bare llama.cpp step, original GGUF",
        "engine 1 stream, fused: TTFA p50",
        "engine 1 stream, numpy heads",
        "bench concurrency   1",
        "bench concurrency   2",
        "bench joining   2",
        "(kernel ",
        "targets",
        "pytest -m gpu",
    ):
        assert needle in out, out
    assert "(fused: 32802 output rows)" in out
    assert (tmp_path / "gpu-check.json").is_file()
