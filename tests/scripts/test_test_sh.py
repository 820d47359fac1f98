"""scripts/test.sh: the quick tests install only what they need (README, step 2)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def plan(*args: str) -> str:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), *args], capture_output=True, text=True,
                       env={**os.environ, "STREAMTTS_TEST_PLAN": "1"}, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("args", [["tests/core", "tests/text"], ["tests/text/test_segmenter.py", "-x", "-q"]])
def test_the_quick_tests_get_the_quick_setup(args: list[str]) -> None:
    assert plan(*args) == "bash scripts/setup.sh --quick-test"


@pytest.mark.parametrize("args", [[], ["tests/server"], ["tests/core", "tests/deploy"]])
def test_anything_else_gets_the_whole_setup(args: list[str]) -> None:
    assert plan(*args) == "bash scripts/setup.sh --test"


def test_the_quick_extra_is_what_the_setup_installs() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["quicktest"]] == ["pytest", "hypothesis"]
    assert ',quicktest"' in (ROOT / "scripts" / "setup.sh").read_text()


def test_the_native_build_shows_its_counters_off_a_terminal(tmp_path: Path) -> None:
    """native/build.sh's step 4: CMake's [n/N] counters, a line every 10 % (not every file),
    with the time left at the pace so far; every line of cmake's output still in the log."""
    script = (ROOT / "native" / "build.sh").read_text()
    fn = script[script.index("build_progress() {") : script.index("\n}\n", script.index("build_progress() {")) + 3]
    log = tmp_path / "build.log"
    lines = "".join(f"[{i}/87] Building CXX object ggml/src/f{i}.o\n" for i in range(1, 88))
    r = subprocess.run(["bash", "-c", f"{fn}\nLOG={log}\nbuild_progress"], input="-- noise\n" + lines,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shown = r.stdout.splitlines()
    assert len(shown) == 11, shown  # 0 %, 10 %, ..., 100 %
    assert shown[0].startswith("    [1/87] 1 %") and shown[-1].startswith("    [87/87] 100 %")
    assert all("min left" in s for s in shown[1:-1]) and "left" not in shown[-1]
    assert log.read_text() == "-- noise\n" + lines
