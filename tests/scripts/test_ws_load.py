"""benchmarks/ws_load.py end to end on the demo model: calibration, the capacity probe and one
level over real WebSockets against a real server (seconds each, not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ws_load_calibrates_probes_and_runs_a_level(demo_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [
        sys.executable, "benchmarks/ws_load.py", "--config", str(demo_model_dir / "config.yaml"),
        "--max-streams", "4", "--load", "1", "--calibrate", "1", "--probe", "4", "--duration", "4",
        "--pause", "0", "--max-sentences", "2", "--out", str(out),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(out.read_text())
    cal = d["calibration"]
    assert len(cal["ttfa_ms"]) == 1 and cal["ttfa_ms_median"] > 0 and cal["session_audio_s"] > 0
    probe = d["probe"]
    assert probe["load"] == "probe" and probe["capacity_streams_seen"]["max"] >= 1
    assert cal["capacity_streams"] == max(1.0, probe["capacity_streams_seen"]["last_half_mean"])
    (level,) = d["levels"]
    assert level["load"] == 1.0 and level["done"] + level["refused"] + level["failed"] == level["sessions"]
    assert 1 <= level["capacity_streams_seen"]["min"] <= level["capacity_streams_seen"]["max"] <= 4
    assert level["rss_mb_samples"] and all(mb > 0 for mb in level["rss_mb_samples"])
    if level["done"]:
        assert level["ttfa_p95_over_unloaded"] == round(level["ttfa_ms_p95"] / cal["ttfa_ms_median"], 2)
