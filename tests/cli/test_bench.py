"""`streamtts bench` runs end to end and reports what it claims (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "streamtts", "bench", "--frames", "6", "--n-threads", "1", "--json", str(out), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TTFA p95 ms" in r.stdout and "RTF: real-time factor" in " ".join(r.stdout.split())  # table, legend
    assert "{" not in r.stdout  # the JSON went to the file only
    return json.loads(out.read_text())


def test_bench_output_fits_the_terminal_and_explains_itself(demo_model_dir: Path) -> None:
    import os

    cmd = [sys.executable, "-m", "streamtts", "bench", "--config", str(demo_model_dir / "config.yaml"),
           "--frames", "4", "--n-threads", "1", "--concurrency", "1", "2", "--kernel-bound"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80, r.stdout
    for word in ("frame: 80 ms", "TTFA: time to first audio", "RTF: real-time factor", "engine/kernel", "engine/(kernel+codec)"):
        assert word in " ".join(r.stdout.split()), word
    assert "{" not in r.stdout and '"levels"' not in r.stdout  # no JSON without --json
    r2 = subprocess.run([*cmd, "--json", "-"], capture_output=True, text=True, timeout=300)
    assert json.loads(r2.stdout[r2.stdout.index("\n{") :])["levels"][0]["concurrency"] == 1


def test_bench_with_kernel_bound(demo_model_dir: Path, tmp_path: Path) -> None:
    res = bench(tmp_path, "--config", str(demo_model_dir / "config.yaml"), "--concurrency", "1", "3", "--kernel-bound")
    levels = {lv["concurrency"]: lv for lv in res["levels"]}
    assert set(levels) == {1, 3}
    assert levels[1]["throughput_vs_1"] == 1.0
    for lv in levels.values():
        assert lv["realtime_streams"] <= lv["concurrency"]
        assert lv["prefill_rows_computed"] > 0
        assert 0 <= lv["c50"] <= lv["c100"] <= lv["c200"] <= 1  # a longer buffer never hurts
        assert 0 <= lv["underrun_ms_p95"] <= lv["underrun_ms_max"]
        assert lv["ttfa_ms_p50"] <= lv["ttfa_ms_p95"]
        assert 0 < lv["engine_vs_kernel_throughput"]
    kb = res["kernel_bound"]
    assert kb["prefill_ms"] > 0 and kb["prefill_rows"] == levels[3]["prefill_rows_computed"]
    steps = {lv["concurrency"]: lv["step_ms"] for lv in kb["levels"]}
    assert set(steps) == {1, 3} and all(v > 0 for v in steps.values())
    assert levels[3]["kernel_throughput_vs_1"] > 0 and levels[3]["kernel_ttfa_vs_1"] > 0
    # the codec's bare work on the same frames, timed (the demo's tone codec: about 1 ms
    # whether one stream or three share a call, so no order between the levels); with it the
    # bound is lower, so the engine's share of it is higher
    kbl = {lv["concurrency"]: lv for lv in kb["levels"]}
    assert kbl[1]["codec_ms"] > 0 and kbl[3]["codec_ms"] > 0
    for n, lv in levels.items():
        assert kbl[n]["frames_per_s_with_codec"] < kbl[n]["frames_per_s"]
        assert lv["engine_vs_kernel_codec_throughput"] >= lv["engine_vs_kernel_throughput"]


def test_kernel_bound_repeated_pairs_each_run_with_its_own_kernel_side(demo_model_dir: Path, tmp_path: Path) -> None:
    res = bench(tmp_path, "--config", str(demo_model_dir / "config.yaml"), "--concurrency", "1", "2",
                "--kernel-bound", "--repeat", "2")  # fmt: skip
    kb = res["kernel_bound"]
    assert len(kb["sessions"]) == 2 and len(res["runs"]) == 4
    for run in res["runs"]:
        assert run["engine_vs_kernel_throughput"] > 0 and run["engine_vs_kernel_codec_throughput"] > 0
    for lv in res["levels"]:
        ratios = sorted(r["engine_vs_kernel_throughput"] for r in res["runs"] if r["concurrency"] == lv["concurrency"])
        assert ratios[0] - 0.01 <= lv["engine_vs_kernel_throughput"] <= ratios[-1] + 0.01  # their median
    steps = [s["levels"][0]["step_ms"] for s in kb["sessions"]]
    assert kb["levels"][0]["step_ms"] == pytest.approx(sum(steps) / 2, abs=1e-3)  # median of two


def test_bench_null_backbone_has_no_kernel_bound(demo_model_dir: Path, tmp_path: Path) -> None:
    res = bench(
        tmp_path, "--config", str(demo_model_dir / "config.yaml"), "--concurrency", "1", "2", "--null-backbone",
        "--kernel-bound", "--repeat", "3",
    )  # fmt: skip
    assert res["null_backbone"] is True and "kernel_bound" not in res
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    assert [r["concurrency"] for r in res["runs"]] == [1, 2] * 3  # interleaved
    two = [r["aggregate_frames_per_s"] for r in res["runs"] if r["concurrency"] == 2]
    assert res["levels"][1]["repeats"] == 3 and res["levels"][1]["aggregate_frames_per_s"] == sorted(two)[1]


def test_bench_joining_arrival(demo_model_dir: Path, tmp_path: Path) -> None:
    res = bench(
        tmp_path, "--config", str(demo_model_dir / "config.yaml"), "--concurrency", "1", "3",
        "--arrival", "joining", "--joiners", "3", "--kernel-bound",
    )  # fmt: skip
    assert res["arrival"] == "joining" and "kernel_bound" not in res  # the bound models bursts
    for lv in res["levels"]:
        assert lv["arrival"] == "joining" and lv["late_background_chunks"] >= 0
        assert 0 <= lv["realtime_streams"] <= lv["concurrency"]
        assert lv["ttfa_ms_p50"] > 0 and lv["aggregate_frames_per_s"] > 0


def test_bench_null_codec_and_tick_threads(demo_model_dir: Path, tmp_path: Path) -> None:
    """The tick's CPU side alone: 40 streams (enough to cut a step) on 2 tick threads, nothing decoded."""
    res = bench(
        tmp_path, "--config", str(demo_model_dir / "config.yaml"), "--concurrency", "40",
        "--null-backbone", "--null-codec", "--tick-threads", "2",
    )  # fmt: skip
    assert res["null_backbone"] is True and res["null_codec"] is True
    assert res["engine"]["codec"] == "null" and res["engine"]["tick_threads"] == 2
    assert res["engine"]["logits"] == "lent"  # the null backbone lends, as the bridge with fused heads
    lv = res["levels"][0]
    assert lv["concurrency"] == 40 and lv["ms_per_tick_p50"] > 0 and lv["ms_per_step_p50"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--null-codec", "--kernel-bound"], "--kernel-bound times the real codec"),
        (["--tick-threads", "-1"], "--tick-threads must be >= 0"),
    ],
)
def test_bench_refuses_what_it_cannot_measure(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "streamtts", "bench", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
