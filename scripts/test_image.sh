#!/usr/bin/env bash
# The container image end to end, with Debian's buildah (no daemon, no registry): build a
# Debian 12 base image from Debian's packages (mmdebstrap), build deploy/Dockerfile on it (the
# CPU image; its BASE argument names this local base instead of debian:bookworm-slim), then run
# the image's own command (ENTRYPOINT + CMD, a weights folder mounted read-only at /models)
# with `buildah run`, and check that it serves: /healthz and /readyz answer, the image's
# HEALTHCHECK command passes inside the image, a request over loopback gets speech, and SIGTERM
# to tini (the image's PID 1 on docker / Kubernetes) drains the server, which finishes the
# request in flight and exits 0.
#
#   bash scripts/test_image.sh            build (or reuse) the image, run it, check it
#   bash scripts/test_image.sh --build    only build (or reuse) the base and the image; print its name
#   bash scripts/test_image.sh --clean    remove the image cache (every image and layer below)
#
# Everything lands outside the checkout, in
#   ${STREAMTTS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts/image}/
#     storage-overlay/, runroot-overlay/   buildah's image store (overlay driver; storage/ and
#                               runroot/ with vfs), used through --root/--runroot: the system's
#                               store is not touched; store.env names the driver in use
#     base-<key>.log            the base image's mmdebstrap log
#     build-<key>.log           the image build's log; build-<key>.txt its measurements
#     report.txt                the last run's measurements (sizes, build and start times)
# The image is tagged localhost/streamtts:cpu-<key> (and localhost/streamtts:cpu), <key> a hash
# of everything that goes into it: deploy/Dockerfile, the build context's files (pyproject.toml,
# README.md, CMakeLists.txt, cmake/, native/, streamtts/) and the base image. With nothing
# changed the build is skipped (seconds); a change to streamtts/ alone reuses the cached layers
# with the llama.cpp compile (a few minutes); a change to the build files compiles llama.cpp again
# (every ggml CPU variant: the longest step, see docs/deploy.md for the measured times).
#
# Needs root (buildah's chroot isolation, as here) and buildah + mmdebstrap (Debian:
# apt-get install buildah mmdebstrap; scripts/setup.sh --test installs them).
# Environment: STREAMTTS_BUILD_JOBS (parallel compile jobs in the image build),
# STREAMTTS_IMAGE_DRIVER (buildah's storage driver: auto, the default, overlay or vfs),
# STREAMTTS_IMAGE_MIRROR (the Debian mirror, default http://deb.debian.org).
set -Eeuo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${STREAMTTS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts/image}"
MIRROR="${STREAMTTS_IMAGE_MIRROR:-http://deb.debian.org}"
PY="${PYTHON:-python3}"
ACTION=test
for a in "$@"; do
    case "$a" in
        --build) ACTION=build ;;
        --clean) ACTION=clean ;;
        -h|--help) sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$a' (see --help)" >&2; exit 2 ;;
    esac
done

trap 'echo "error: scripts/test_image.sh line $LINENO failed: $BASH_COMMAND" >&2' ERR
say() { echo "==> $*"; }
note() { echo "    $*"; }
die() { echo "error: $*" >&2; exit 1; }

if [[ $ACTION == clean ]]; then
    # vfs layers may hold files buildah made read-only: plain rm copes as root
    [[ -d "$CACHE" ]] && { say "removing $CACHE"; rm -rf -- "$CACHE"; } || say "nothing to clean ($CACHE does not exist)"
    exit 0
fi

[[ "$(id -u)" == 0 ]] || die "buildah's chroot isolation needs root here (run as root, or in a root CI job)"
for tool in buildah mmdebstrap; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install buildah mmdebstrap, or bash scripts/setup.sh --test)"
done
command -v "$PY" >/dev/null || die "$PY not found (set PYTHON)"
mkdir -p "$CACHE"

# The storage driver: STREAMTTS_IMAGE_DRIVER (overlay or vfs), else overlay when the kernel
# mounts a container's root with it here (layers share their files: a few GB in all), else vfs
# (every layer a full copy of the tree: tens of GB for one build's layers)
store_for() {
    local suffix=""
    [[ $1 == vfs ]] || suffix="-$1"
    B=(buildah --root "$CACHE/storage$suffix" --runroot "$CACHE/runroot$suffix" --storage-driver "$1")
}
DRIVER="${STREAMTTS_IMAGE_DRIVER:-auto}"
if [[ "$DRIVER" == auto ]]; then
    DRIVER=vfs
    if grep -qw overlay /proc/filesystems 2>/dev/null; then
        store_for overlay
        if probe="$("${B[@]}" from scratch 2>/dev/null)"; then
            "${B[@]}" mount "$probe" >/dev/null 2>&1 && DRIVER=overlay
            "${B[@]}" rm "$probe" >/dev/null 2>&1 || true
        fi
    fi
fi
case "$DRIVER" in overlay|vfs) ;; *) die "STREAMTTS_IMAGE_DRIVER=$DRIVER: overlay, vfs or auto" ;; esac
store_for "$DRIVER"
# one run at a time per store
exec 9>"$CACHE/.lock-$DRIVER"
command -v flock >/dev/null && { flock -n 9 || { say "waiting for another test_image.sh on $CACHE ($DRIVER)"; flock 9; }; }
# (deploy/local-cluster.sh --image reads this to find the image)
printf 'STREAMTTS_IMAGE_DRIVER=%s\n' "$DRIVER" >"$CACHE/store.env"
have_image() { "${B[@]}" inspect --type image "$1" >/dev/null 2>&1; }
hash_text() { sha256sum | cut -c1-16; }

# -- 1. the base: Debian 12 from its packages --------------------------------------------------
# What debian:bookworm-slim is (minbase, no man pages, docs or locales; the same sources), made
# here with mmdebstrap since no registry is reachable. Its key is this recipe: a new recipe (or
# --clean) makes a new base; `buildah rmi` of the tag refreshes it with today's packages.
SUITE=bookworm
DPKG_OPTS=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
           --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
           --dpkgopt='path-exclude=/usr/share/info/*')
SOURCES=("deb $MIRROR/debian $SUITE main" "deb $MIRROR/debian $SUITE-updates main"
         "deb $MIRROR/debian-security $SUITE-security main")
BASE_KEY="$(printf '%s|' base-1 "$SUITE" minbase "${DPKG_OPTS[@]}" "${SOURCES[@]}" | hash_text)"
BASE="localhost/streamtts-base:$SUITE-$BASE_KEY"
if have_image "$BASE"; then
    say "[1/4] base image (cached): $BASE"
else
    say "[1/4] building the base image $BASE from Debian packages (mmdebstrap; about a minute)"
    T0=$(date +%s)
    TAR="$CACHE/base-$BASE_KEY.tar"
    nice mmdebstrap --variant=minbase "${DPKG_OPTS[@]}" "$SUITE" "$TAR" "${SOURCES[@]}" \
        >"$CACHE/base-$BASE_KEY.log" 2>&1 \
        || { tail -n 30 "$CACHE/base-$BASE_KEY.log" >&2; rm -f -- "$TAR"; die "mmdebstrap failed (log: $CACHE/base-$BASE_KEY.log)"; }
    ctr="$("${B[@]}" from scratch)"
    "${B[@]}" add "$ctr" "$TAR" / >/dev/null
    "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd bash --label "org.opencontainers.image.description=Debian $SUITE minbase (mmdebstrap)" "$ctr"
    "${B[@]}" commit -q "$ctr" "$BASE" >/dev/null
    "${B[@]}" rm "$ctr" >/dev/null
    rm -f -- "$TAR"
    note "done in $(( $(date +%s) - T0 )) s"
fi
BASE_ID="$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$BASE")"

# Only this build's images stay in the store (its steps, which the next build may reuse, and
# the base): older builds' layers would take gigabytes each time the inputs change.
prune_store() {
    local keep id pass removed
    keep="$( { grep -oE '^--> (Using cache )?[0-9a-f]{11,}' "$BUILD_LOG" | grep -oE '[0-9a-f]{11,}$'
               "${B[@]}" images -q --no-trunc "$IMAGE"; "${B[@]}" images -q --no-trunc "$BASE"; } | sed 's/^sha256://' | cut -c1-11 | sort -u)"
    for pass in 1 2 3 4 5 6 7 8 9 10; do
        removed=0
        for id in $("${B[@]}" images -a -q --no-trunc | sed 's/^sha256://'); do
            grep -qxF "${id:0:11}" <<<"$keep" && continue
            "${B[@]}" rmi "$id" >/dev/null 2>&1 && removed=1
        done
        (( removed )) || break
    done
}

# -- 2. the image --------------------------------------------------------------------------------
# the key: the Dockerfile, the .dockerignore, the files the context sends, the base and the args
BUILD_ARGS=(--build-arg "BASE=$BASE" --build-arg STREAMTTS_VARIANT=cpu)
[[ -n "${STREAMTTS_BUILD_JOBS:-}" ]] && BUILD_ARGS+=(--build-arg "STREAMTTS_BUILD_JOBS=$STREAMTTS_BUILD_JOBS")
# a machine behind a TLS-inspecting proxy (this project's, for one) trusts its CA through
# /usr/local/share/ca-certificates: the build stage is given the same (deploy/Dockerfile)
CA_DIR=/usr/local/share/ca-certificates
VOLUMES=()
compgen -G "$CA_DIR/*.crt" >/dev/null && VOLUMES+=(--volume "$CA_DIR:/run/extra-ca:ro")
CONTEXT_KEY="$(cd "$REPO" && find deploy/Dockerfile .dockerignore pyproject.toml README.md CMakeLists.txt \
    cmake native streamtts -type f -not -path '*/__pycache__/*' -not -path 'streamtts/lib/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | hash_text)"
KEY="$(printf '%s|' "$CONTEXT_KEY" "$BASE_ID" "${BUILD_ARGS[@]}" | hash_text)"
IMAGE="localhost/streamtts:cpu-$KEY"
BUILD_LOG="$CACHE/build-$KEY.log"
if have_image "$IMAGE"; then
    say "[2/4] image (cached): $IMAGE"
else
    say "[2/4] building $IMAGE (buildah bud, deploy/Dockerfile; cached layers reused)"
    note "from scratch this compiles llama.cpp with every ggml CPU variant inside the image:"
    note "the longest step of the suite (docs/deploy.md: the measured time); log: $BUILD_LOG"
    T0=$(date +%s)
    # --layers: each step's result is kept, so the next build redoes only what changed;
    # --format docker: the HEALTHCHECK is part of the Docker image format, not of OCI's
    # (its steps shown as they start; the whole output in the log)
    (cd "$REPO" && nice "${B[@]}" bud --isolation chroot --layers --force-rm --format docker \
        "${BUILD_ARGS[@]}" "${VOLUMES[@]}" -f deploy/Dockerfile -t "$IMAGE" -t localhost/streamtts:cpu . ) 2>&1 \
        | tee "$BUILD_LOG" | { grep --line-buffered -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+: (FROM|RUN|COPY)' \
        | sed -u -E 's/^(.{0,100}).*/    \1/' || true; } \
        || { tail -n 40 "$BUILD_LOG" >&2; die "the image build failed (log: $BUILD_LOG)"; }
    BUILD_S=$(( $(date +%s) - T0 ))
    printf 'build_s=%s\n' "$BUILD_S" >"$CACHE/build-$KEY.txt"
    note "built in $BUILD_S s"
    prune_store
fi
"${B[@]}" tag "$IMAGE" localhost/streamtts:cpu
SIZE="$("${B[@]}" images --format '{{.Size}}' "$IMAGE" | sed -n 1p)"
BASE_SIZE="$("${B[@]}" images --format '{{.Size}}' "$BASE" | sed -n 1p)"
note "image: $SIZE (the base: $BASE_SIZE), uncompressed"
if [[ $ACTION == build ]]; then
    echo "$IMAGE"
    exit 0
fi

# -- 3. run the image's own command ----------------------------------------------------------
TMP="$(mktemp -d "${TMPDIR:-/tmp}/streamtts-image-test.XXXXXX")"
CTR=""
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    [[ -n "$CTR" ]] && "${B[@]}" rm "$CTR" >/dev/null 2>&1 || true
    rm -rf -- "$TMP"
}
trap cleanup EXIT
T0=$(date +%s%N)
CTR="$("${B[@]}" from --name "streamtts-test-$$" "$IMAGE")"
FROM_MS=$(( ($(date +%s%N) - T0) / 1000000 ))
# buildah run (chroot isolation) puts an empty volume of its own over an image's VOLUME
# (/models), hiding a bind mount there: this container forgets the declaration, and the
# weights folder is bound at /models as docker -v / Kubernetes mount it
"${B[@]}" config --volume /models- "$CTR"
# a weights folder as `streamtts download` leaves one (DEST/streamtts.yaml, paths relative to
# it), here the demo model written by the image's own CLI, then mounted read-only at /models
mkdir -p "$TMP/models" && chmod 0777 "$TMP/models"
"${B[@]}" run --isolation chroot --volume "$TMP/models:/out" "$CTR" -- \
    streamtts demo-model /out >"$TMP/demo-model.log" 2>&1 \
    || { cat "$TMP/demo-model.log" >&2; die "streamtts demo-model failed in the image"; }
cp "$TMP/models/config.yaml" "$TMP/models/streamtts.yaml"
chmod -R go-w "$TMP/models"

# ENTRYPOINT + CMD exactly as the image has them (what docker run / Kubernetes start), with
# a free port through $STREAMTTS_PORT (the image's default 8000 may be taken on this machine),
# and the settings of a drain worth watching: small send buffers, so that a request is still
# streaming when SIGTERM comes (a demo model makes seconds of audio in well under one)
mapfile -t CMDLINE < <("${B[@]}" inspect --type image "$IMAGE" \
    | "$PY" -c 'import json, sys; c = json.load(sys.stdin)["Docker"]["config"]; [print(a) for a in (c.get("Entrypoint") or []) + (c.get("Cmd") or [])]')
[[ "${CMDLINE[0]:-}" == tini ]] || die "the image's entrypoint does not start with tini: ${CMDLINE[*]}"
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
EXTRA=(--drain-timeout 60 --socket-send-buffer 16384 --send-buffer 2)
say "[3/4] buildah run: ${CMDLINE[*]} ${EXTRA[*]} (STREAMTTS_PORT=$PORT, /models read-only)"
T0=$(date +%s%N)
# TINI_SUBREAPER: chroot isolation has no PID namespace, so tini is not PID 1 here; as a
# subreaper it still reaps and forwards signals as it does as PID 1
"${B[@]}" run --isolation chroot --env "STREAMTTS_PORT=$PORT" --env TINI_SUBREAPER=1 \
    --volume "$TMP/models:/models:ro" "$CTR" -- "${CMDLINE[@]}" "${EXTRA[@]}" \
    </dev/null >"$TMP/server.log" 2>&1 &
SERVER_PID=$!

# the server's readiness, then the checks; SIGTERM goes to tini, found under `buildah run`
"$PY" - "$PORT" "$SERVER_PID" "$T0" "$TMP/result.txt" "$CTR" "$IMAGE" "${B[@]}" <<'PYEOF' || { echo "--- server log:" >&2; tail -n 40 "$TMP/server.log" >&2; die "the image did not serve as it should (above)"; }
import http.client, json, os, signal, subprocess, sys, time, wave, io

port, server_pid, t0_ns, result, ctr, image = sys.argv[1:7]
buildah = sys.argv[7:]
server_pid = int(server_pid)
url = f"127.0.0.1:{port}"


def fail(msg: str) -> None:
    sys.exit(f"error: {msg}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except OSError:
        return False


def get(path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(url, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# 1. ready: /readyz 200 (the model loaded and warmed up) within 10 minutes
deadline = time.monotonic() + 600
while True:
    if not alive(server_pid):
        fail("the server exited while starting")
    try:
        status, body = get("/readyz")
        if status == 200:
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        fail("/readyz did not answer 200 within 600 s")
    time.sleep(0.1)
start_s = (time.time_ns() - int(t0_ns)) / 1e9
ready = json.loads(body)
print(f"    /readyz 200 after {start_s:.1f} s: {ready}")
status, _ = get("/healthz")
if status != 200:
    fail(f"/healthz answered {status}")
# who runs it: not root, under tini
tini = [p for p in descendants(server_pid) if comm(p) == "tini"]
if len(tini) != 1:
    fail(f"expected one tini under buildah run, found {tini}")
with open(f"/proc/{tini[0]}/status") as f:
    uid = next(int(l.split()[1]) for l in f if l.startswith("Uid:"))
if uid == 0:
    fail("the server runs as root")
print(f"    tini (pid {tini[0]}) runs as uid {uid}")

# 2. the image's HEALTHCHECK command, run inside the image while the server runs
hc = json.loads(subprocess.run([*buildah, "inspect", "--type", "image", image],
                               capture_output=True, text=True, check=True).stdout)["Docker"]["config"].get("Healthcheck")
if not hc or hc["Test"][0] != "CMD":
    fail(f"the image has no exec-form HEALTHCHECK: {hc}")
p = subprocess.run([*buildah, "run", "--isolation", "chroot", "--env", f"STREAMTTS_PORT={port}", ctr, "--", *hc["Test"][1:]],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail(f"the HEALTHCHECK command failed ({p.returncode}): {p.stdout}{p.stderr}")
print("    HEALTHCHECK command passed inside the image")

# 3. speech over loopback: a WAV with sound in it
def speech(text: str, fmt: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    c = http.client.HTTPConnection(url, timeout=60)
    c.request("POST", "/v1/audio/speech", body=json.dumps({"input": text, "response_format": fmt}),
              headers={"Content-Type": "application/json"})
    return c, c.getresponse()

t = time.monotonic()
c, r = speech("Hello from the container image.", "wav")
data = r.read()
c.close()
if r.status != 200:
    fail(f"/v1/audio/speech answered {r.status}: {data[:300]!r}")
if data[:4] != b"RIFF":
    fail(f"the speech is not a WAV: {data[:16]!r}")
w = wave.open(io.BytesIO(data))
# a streamed WAV's header cannot know its length: the samples are what follows the data chunk
frames = data[data.find(b"data") + 8 :]
secs = len(frames) / (w.getsampwidth() * w.getnchannels() * w.getframerate())
if secs <= 0 or not any(frames):
    fail(f"the WAV holds no sound ({len(frames)} bytes of samples)")
print(f"    /v1/audio/speech: {len(data)} bytes of WAV, {secs:.2f} s of audio at {w.getframerate()} Hz "
      f"in {time.monotonic() - t:.2f} s")

# 4. drain: a long request in flight, SIGTERM to tini; /readyz turns 503, the request ends whole,
# and the server exits 0 (checked by the shell: buildah run's status)
long_text = " ".join(["This sentence is one of many that keep the stream going while it drains."] * 12)
c, r = speech(long_text, "pcm")
if r.status != 200:
    fail(f"the long request answered {r.status}")
first = r.read(4096)
os.kill(tini[0], signal.SIGTERM)
t_term = time.monotonic()
time.sleep(0.3)
status, body = get("/readyz")
if status != 503 or not json.loads(body).get("draining"):
    fail(f"/readyz after SIGTERM: {status} {body[:200]!r} (expected 503, draining)")
print(f"    after SIGTERM: /readyz {status} {json.loads(body)}")
rest = r.read()  # http.client raises IncompleteRead if the stream is cut
c.close()  # (the drain waits for its clients' connections to close)
total = len(first) + len(rest)
if total < 48000 * 2:
    fail(f"the request in flight got only {total} bytes of audio")
print(f"    the request in flight finished: {total} bytes of PCM ({total / 48000:.1f} s at 24 kHz)")
deadline = time.monotonic() + 90
while alive(server_pid):
    if time.monotonic() > deadline:
        fail("the server is still running 90 s after SIGTERM")
    time.sleep(0.05)
exit_s = time.monotonic() - t_term
print(f"    buildah run ended {exit_s:.1f} s after SIGTERM")
with open(result, "w") as f:
    f.write(f"start_s={start_s:.1f}\nspeech_s={secs:.2f}\ndrain_exit_s={exit_s:.1f}\n")
PYEOF
rc=0
wait "$SERVER_PID" || rc=$?
SERVER_PID=""
[[ $rc == 0 ]] || { tail -n 30 "$TMP/server.log" >&2; die "the server exited $rc after SIGTERM (expected 0)"; }
LOG1="$(tr -s ' \n' ' ' <"$TMP/server.log")"
[[ "$LOG1" == *"drained (SIGTERM)"* ]] || { tail -n 30 "$TMP/server.log" >&2; die "no 'drained (SIGTERM)' line in the server's log"; }
note "exit status 0 after the drain"

# -- 4. report -----------------------------------------------------------------------------------
{
    echo "image=$IMAGE"
    echo "size=$SIZE"
    echo "base_size=$BASE_SIZE"
    cat "$CACHE/build-$KEY.txt" 2>/dev/null || true
    echo "buildah_from_ms=$FROM_MS"
    cat "$TMP/result.txt"
} >"$CACHE/report.txt"
say "[4/4] ok: $(tr '\n' ' ' <"$CACHE/report.txt")"
