"""``n_threads: 0``: the physical cores other processes leave idle (streamtts/model/threads.py),
and ``--profile``'s warning when steps run far slower than the fastest one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streamtts.model import threads


def write_stat(path: Path, busy: list[int], idle: list[int]) -> None:
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for i, (b, d) in enumerate(zip(busy, idle, strict=True)):
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines.append(f"cpu{i} {b} 0 0 {d} 0 0 0 0 0 0")
    path.write_text("\n".join(lines) + "\nintr 1 2 3\n")


def test_busy_ticks_count_every_column_but_idle_and_iowait(tmp_path: Path, monkeypatch: Any) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9\ncpu0 1 2 3 100 50 4 5 6 7 8\ncpu1 10 0 0 0 0 0 0 0\n")
    monkeypatch.setattr(threads, "PROC_STAT", stat)
    assert threads._busy_ticks({0}) == 1 + 2 + 3 + 4 + 5 + 6  # guest is inside user already
    assert threads._busy_ticks({0, 1}) == 21 + 10
    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "missing")
    assert threads._busy_ticks({0}) is None


def test_other_processes_load_is_measured_without_our_own(tmp_path: Path, monkeypatch: Any) -> None:
    """Two samples of a fake /proc/stat: one core's worth busy over the window, none of it ours."""
    from types import SimpleNamespace

    stat = tmp_path / "stat"
    hz = 100
    write_stat(stat, [0, 0], [0, 0])
    monkeypatch.setattr(threads, "PROC_STAT", stat)
    own = iter([SimpleNamespace(user=1.0, system=0.5), SimpleNamespace(user=1.05, system=0.5)])
    fake_os = SimpleNamespace(sched_getaffinity=lambda pid: {0, 1}, sysconf=lambda name: hz, times=own.__next__)
    monkeypatch.setattr(threads, "os", fake_os)

    def sleep(s: float) -> None:  # the window passes: core 0 busy throughout, 0.05 s of it ours
        write_stat(stat, [int(hz * s), 0], [0, int(hz * s)])

    monkeypatch.setattr(threads, "time", SimpleNamespace(sleep=sleep, monotonic=iter([0.0, 0.25]).__next__))
    assert threads.busy_cores_elsewhere(0.25) == pytest.approx((0.25 - 0.05) / 0.25)


@pytest.mark.parametrize(("cores", "busy", "want"), [(2, 0.0, 2), (2, 0.3, 2), (2, 1.0, 1), (2, 2.0, 1), (8, 2.6, 5), (1, 0.0, 1)])
def test_auto_threads_leaves_the_busy_cores(monkeypatch: Any, cores: int, busy: float, want: int) -> None:
    monkeypatch.setattr(threads, "physical_cores", lambda: cores)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda window_s=0.25: busy)
    c = threads.auto_threads()
    assert c.threads == want and c.reduced == (want < cores)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_busy_neighbour_gets_its_core(tmp_path: Path) -> None:
    """A real busy loop pinned to one core: the automatic count leaves that core to it."""
    if threads.physical_cores() < 2:
        pytest.skip("one core: nothing to leave")
    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        c = threads.auto_threads(window_s=0.5)
    finally:
        busy.kill()
        busy.wait()
    # the loop alone is one core's worth; other jobs on a shared machine only add to it
    assert c.busy_elsewhere >= 0.6 and c.threads < c.physical_cores, c


class FakeEngine:
    info = {"threads": 2}

    def __init__(self, mean_ms: float, fastest_ms: float) -> None:
        self.mean, self.fastest = mean_ms, fastest_ms

    def step_profile(self) -> dict[str, float]:
        return {"embed": 0.1, "backbone": self.mean, "heads": 1.0, "sampling": 0.2, "other": 0.1}

    def fastest_backbone_ms(self) -> float:
        return self.fastest


class FakeStats:
    def as_dict(self) -> dict[str, Any]:
        return {"prepare_ms": 1.0, "prefill_ms": 10.0, "steps": 40, "ms_per_step": 12.0, "decode_windows": 4,
                "decode_ms": 8.0, "ttfa_ms": 400.0, "audio_s": 1.0, "rtf": 0.5}  # fmt: skip


@pytest.mark.parametrize(("mean", "fastest", "warns"), [(40.0, 9.0, True), (10.0, 9.0, False)])
def test_profile_warns_when_steps_run_far_above_their_cost(capsys: Any, mean: float, fastest: float, warns: bool) -> None:
    from streamtts.cli.speech import _print_profile

    _print_profile(FakeEngine(mean, fastest), FakeStats())
    err = " ".join(capsys.readouterr().err.split())
    assert ("another process is probably using the CPU" in err) == warns
    if warns:
        assert "--n-threads 1" in err and "4.4x the fastest" in err


# -- codec_nice: the codec's threads at a lower priority (Linux) --------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_lower_priority_changes_only_the_given_threads() -> None:
    import os
    import threading

    from streamtts.engine.priority import lower_priority, thread_ids

    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    before = thread_ids()
    t = threading.Thread(target=worker)
    t.start()
    ready.wait(10)
    assert thread_ids() - before == {tid[0]}
    me = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert lower_priority([tid[0], 2**30], 7) == 1  # an id that is no thread is skipped
    assert os.getpriority(os.PRIO_PROCESS, tid[0]) == 7
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == me  # not the caller
    done.set()
    t.join()


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_engine_runs_its_codec_thread_at_codec_nice(demo_model_dir: Path) -> None:
    import asyncio
    import os

    from streamtts import Engine
    from streamtts.errors import ConfigError

    async def nice_of_decode_thread() -> int:
        async with Engine.from_config(demo_model_dir / "config.yaml", codec_nice=5) as e:
            async for _ in e.stream("Hi there."):
                pass
            worker = e._decoder
            return os.getpriority(os.PRIO_PROCESS, worker._thread.native_id)

    assert asyncio.run(nice_of_decode_thread()) == 5
    with pytest.raises(ConfigError, match="codec_nice must be 0..19"):
        Engine.from_config(demo_model_dir / "config.yaml", codec_nice=20)
