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

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
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


@pytest.mark.slow
def test_local_cluster_runs_its_replicas_from_the_image(demo_model_dir: Path, tmp_path: Path) -> None:
    """``deploy/local-cluster.sh up --image``: Redis and HAProxy as usual, the replicas the image
    run with its own ENTRYPOINT (buildah here), weights mounted read-only; speech through the
    balancer; ``down`` drains each replica's tini and every one exits 0."""
    need_binary("buildah")
    need_binary("haproxy")
    need_binary("redis-server")
    env = dict(os.environ, CI="true", TMPDIR=str(tmp_path))
    built = subprocess.run(
        ["bash", str(SCRIPT), "--build"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=4 * 3600,
    )  # fmt: skip
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    image = built.stdout.strip().splitlines()[-1]
    # the weights folder as a user mounts it: readable by the image's unprivileged user
    models = tmp_path / "models"
    shutil.copytree(demo_model_dir, models)
    for p in [models, *models.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    run = tmp_path / "run"
    env.update(STREAMTTS_CLUSTER_DIR=str(run), STREAMTTS_PYTHON=sys.executable, STREAMTTS_LB_CHECK_INTER="1s")
    cluster = ["bash", str(REPO / "deploy" / "local-cluster.sh")]
    try:
        up = subprocess.run(
            [*cluster, "up", "2", "--image", image, "--config", str(models / "config.yaml"), "--",
             "--n-threads", "1", "--max-sessions", "4", "--drain-timeout", "20"],
            env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in run.glob("*.log"))
        assert up.returncode == 0, up.stderr + logs
        assert f"replicas from the image {image} (buildah)" in up.stderr
        info = json.loads(up.stdout.strip().splitlines()[-1])
        pids = [int(r["pid"]) for r in info["replicas"]]
        for pid in pids:  # the recorded PID is the replica's tini, run as the image's user
            assert Path(f"/proc/{pid}/comm").read_text().strip() == "tini"
            uid = next(int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
            assert uid != 0
        body = json.dumps({"input": "Hello through the balancer.", "response_format": "wav"}).encode()
        for _ in range(2):
            req = urllib.request.Request(info["balancer"] + "/v1/audio/speech", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=120) as r:
                audio = r.read()
            assert r.status == 200 and audio[:4] == b"RIFF" and len(audio) > 44 + 4800
        for rep in info["replicas"]:
            with urllib.request.urlopen(rep["url"] + "/readyz", timeout=10) as r:
                assert r.status == 200
    finally:
        down = subprocess.run([*cluster, "down"], env=env, capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stderr
    for i in (1, 2):
        assert (run / f"replica-{i}.exit").read_text().strip() == "0"
    log = " ".join((run / "replica-1.log").read_text().split())
    assert "drained (SIGTERM)" in log
    assert not (run / "containers").exists()  # down removed the containers it made
