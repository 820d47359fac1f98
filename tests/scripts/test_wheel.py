"""scripts/test_wheel.sh: the CPU wheel, installed with no compiler on PATH, synthesizes.

The script builds the wheel with pip (scikit-build-core, every ggml x86-64 CPU variant),
repairs it with auditwheel, installs it into a fresh virtualenv whose PATH has no compiler,
and runs ``streamtts synth`` from a fresh HOME, checking that the bridge came from the wheel
and that ggml picked a CPU variant at run time. The wheel is cached outside the checkout by
a hash of its inputs (scripts/test.sh builds it first, with progress, so this test finds it);
a cold cache compiles llama.cpp's 13 CPU variants (about 10 min on 2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test_wheel.sh"


@pytest.mark.slow
def test_wheel_installs_without_a_compiler_and_synthesizes(tmp_path: Path) -> None:
    before = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
    ).stdout
    env = dict(os.environ, CI="true", TMPDIR=str(tmp_path))
    res = subprocess.run(
        ["bash", str(SCRIPT)], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=4 * 3600,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    m = re.search(r"^==> ok: (.*)$", res.stdout, re.M)
    assert m, out[-2000:]
    fields = dict(kv.split("=", 1) for kv in m.group(1).split())
    assert re.fullmatch(r"streamtts-.*-py3-none-manylinux_\d+_\d+_x86_64\.whl", fields["wheel"])
    assert re.fullmatch(r"libggml-cpu-[a-z0-9_]+\.so", fields["cpu_variant"])
    assert float(fields["wheel_mb"]) > 1
    after = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert after == before, "the wheel test wrote into the checkout"
