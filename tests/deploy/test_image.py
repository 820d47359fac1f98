"""scripts/test_image.sh: the container image, built from Debian packages alone, serves.

The script builds a Debian 12 base with mmdebstrap, builds deploy/Dockerfile on it with
buildah (cached outside the checkout by a hash of its inputs; scripts/test.sh builds it first,
with progress, so this test finds it), runs the image's own ENTRYPOINT + CMD with
``buildah run`` and a weights folder mounted read-only, and checks /healthz, /readyz, the
image's HEALTHCHECK command, speech over loopback and a SIGTERM drain that finishes the
request in flight and exits 0. A cold cache compiles llama.cpp's CPU variants inside the
image (docs/deploy.md: the measured time).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import need_binary

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test_image.sh"


@pytest.mark.slow
def test_image_builds_serves_speech_and_drains_on_sigterm(tmp_path: Path) -> None:
    need_binary("buildah")
    need_binary("mmdebstrap")
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
    m = re.search(r"^==> \[4/4\] ok: (.*)$", res.stdout, re.M)
    assert m, out[-2000:]
    fields = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
    assert fields["image"].startswith("localhost/streamtts:cpu-")
    assert float(fields["start_s"]) > 0 and float(fields["speech_s"]) > 0
    # what the script checked, each said on its own line
    for line in ("/readyz 200 after", "HEALTHCHECK command passed inside the image",
                 "after SIGTERM: /readyz 503", "the request in flight finished",
                 "exit status 0 after the drain"):  # fmt: skip
        assert line in res.stdout, line
    assert re.search(r"runs as uid [1-9]\d*", res.stdout)
    after = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert after == before, "the image test wrote into the checkout"
