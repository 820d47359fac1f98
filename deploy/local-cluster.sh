#!/usr/bin/env bash
# A streamtts cluster on this machine: N replicas, Redis for the shared voices, HAProxy in front.
#
#   deploy/local-cluster.sh up [N] [--config CFG.yaml] [--bind HOST:PORT] [--image [REF]] [-- SERVE_ARGS...]
#       start Redis, N replicas (default 2) and HAProxy; --image: the replicas from the container image
#   deploy/local-cluster.sh up --replica "ID=CFG.yaml [ID=CFG.yaml ...]" --replica ... [-- SERVE_ARGS...]
#       one replica per --replica, serving those models; HAProxy routes on the model
#   deploy/local-cluster.sh status      print the same JSON line (exit 1 naming any process gone)
#   deploy/local-cluster.sh down        stop exactly what `up` started
#
# Everything listens on 127.0.0.1 (free ports); --bind puts HAProxy on another address (e.g.
# 0.0.0.0:8080 to serve other machines; the replicas stay on loopback). Without --config the replicas serve the
# synthetic demo model. SERVE_ARGS go to every `streamtts serve` (e.g. --max-sessions 4
# --drain-timeout 10). redis-server and haproxy come from the distribution's packages and are
# installed (apt-get, as root or with sudo) when missing.
#
# Replicas serving different model sets (--replica, repeatable; instead of N and --config): each
# `--replica "tts=A.yaml dialog=B.yaml"` is one replica run with `--model tts=A.yaml --model
# dialog=B.yaml`; the same id must name the same config everywhere. HAProxy then routes each
# request to the replicas serving the model it names in the URL's ?model=ID or the X-Model
# header (deploy/haproxy.cfg says how and why); naming none, the default model: the first id of
# the first --replica. Voices are shared through Redis as always. cluster.json then also has
# "models" (every id, the default first) and each replica's "models".
#
# The run folder (${STREAMTTS_CLUSTER_DIR:-.cluster} in the repository) holds the logs,
# redis.conf, haproxy.cfg, the PIDs (pids, NAME.pid), each process's exit status once it has
# ended (NAME.exit: replica-1.exit, redis.exit, haproxy.exit) and cluster.json. The last line `up` and `status`
# print is one JSON object:
#   {"balancer": "http://127.0.0.1:PORT", "replicas": [{"url": ..., "pid": N}, ...],
#    "redis": "redis://127.0.0.1:PORT/0"}
# `down` sends SIGTERM to exactly the PIDs in that folder (replicas drain first), then SIGKILL
# to any still there after STREAMTTS_DOWN_TIMEOUT seconds (default 45).
#
# With --image the replicas are the container image (deploy/Dockerfile) run with its own
# ENTRYPOINT (tini -- streamtts serve), each on a free loopback port ($STREAMTTS_PORT) with the
# host's network, CFG.yaml's folder mounted read-only at /models, and the recorded PID the
# replica's tini, so `down` drains it as Kubernetes would. The container runtime:
#   docker   when `docker info` answers: `docker run --network host` of REF (default
#            streamtts:cpu); `down` signals the docker client, which passes SIGTERM on (not run
#            on this project's machines, which have no Docker engine)
#   buildah  else, as root: `buildah run --isolation chroot` of REF (default localhost/streamtts:cpu)
#            from scripts/test_image.sh's image store (STREAMTTS_IMAGE_CACHE), which builds it
# and `up --image` stops with a message naming what is missing when neither is there.
#
# Environment: STREAMTTS_PYTHON (the interpreter with streamtts; default .venv/bin/python, then
# python3), STREAMTTS_LB_CHECK_INTER (HAProxy health-check interval, default 1s),
# STREAMTTS_CLUSTER_GPUS (e.g. 0,1,2,3: replica i gets CUDA_VISIBLE_DEVICES=the i-th entry, so
# one replica per GPU; with a CUDA build and n_gpu_layers: -1 in the config).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
RUN="${STREAMTTS_CLUSTER_DIR:-$REPO/.cluster}"
CHECK_INTER="${STREAMTTS_LB_CHECK_INTER:-1s}"
DOWN_TIMEOUT="${STREAMTTS_DOWN_TIMEOUT:-45}"

die() { echo "local-cluster.sh: $*" >&2; exit 1; }
note() { echo "==> $*" >&2; }

usage() {
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

python_bin() {
    if [[ -n "${STREAMTTS_PYTHON:-}" ]]; then echo "$STREAMTTS_PYTHON"
    elif [[ -x "$REPO/.venv/bin/python" ]]; then echo "$REPO/.venv/bin/python"
    else echo python3; fi
}

ensure_packages() {
    local missing=()
    command -v redis-server >/dev/null || missing+=(redis-server)
    command -v haproxy >/dev/null || missing+=(haproxy)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    local sudo=""
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to install: ${missing[*]}"
        sudo="sudo"
    fi
    note "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Running, and not a zombie (a process this script started is reparented when it exits).
alive() { [[ -n "$1" && -r "/proc/$1/status" ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# start_bg NAME CMD...: run CMD in the background with its log in $RUN/NAME.log; print its PID.
# A small watcher shell waits for it and writes its exit status to $RUN/NAME.exit.
start_bg() {
    local name=$1 t=0 pid=""
    shift
    rm -f "$RUN/$name.pid" "$RUN/$name.exit"
    ( "$@" </dev/null >"$RUN/$name.log" 2>&1 &
      echo $! >"$RUN/$name.pid.tmp" && mv "$RUN/$name.pid.tmp" "$RUN/$name.pid"
      wait $!
      echo $? >"$RUN/$name.exit" ) </dev/null >/dev/null 2>&1 &
    while [[ -z "$pid" ]]; do
        (( t++ < 100 )) || die "could not start $name"
        [[ -s "$RUN/$name.pid" ]] && pid=$(cat "$RUN/$name.pid") || sleep 0.05
    done
    echo "$pid"
}

# The process is still the one we started (PIDs get reused): its command line names it.
ours() {
    local pid=$1 what=$2
    alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE -- "$what"
}

STARTED=()
cleanup_on_error() {
    local rc=$?
    echo "local-cluster.sh: up failed (exit $rc); stopping what it started; logs in $RUN" >&2
    for pid in "${STARTED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    sleep 1
    for pid in "${STARTED[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    remove_containers
    rm -f "$RUN/pids" "$RUN/cluster.json"
    trap - EXIT
    exit "$rc"
}

# wait_http URL SECONDS PID: until GET URL answers 200 (fails at once if PID exits)
wait_http() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF'
import sys, time, urllib.request
url, limit, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + limit
while True:
    try:
        with open(f"/proc/{pid}/status") as f:
            if "\nState:\tZ" in f.read():
                raise OSError
    except OSError:
        sys.exit(f"pid {pid} exited before {url} answered")
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(f"{url}: no 200 after {limit:g} s")
    time.sleep(0.1)
PYEOF
}

# wait_port LOG PID SECONDS: the port `streamtts serve --port 0` printed
wait_port() {
    local log=$1 pid=$2 limit=$3 t=0 port
    while (( t < limit * 10 )); do
        port=$(sed -n 's/.*serving on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
        [[ -n "$port" ]] && { echo "$port"; return 0; }
        alive "$pid" || { tail -n 30 "$log" >&2; die "replica $pid exited while starting (log $log)"; }
        sleep 0.1; t=$((t + 1))
    done
    die "replica $pid printed no port after ${limit} s (log $log)"
}

# wait_haproxy SOCKET N SECONDS [BACKEND:N ...]: until N servers of `replicas` (or of each
# BACKEND given, N each) are UP after a passed check
wait_haproxy() {
    "$PY" - "$@" <<'PYEOF'
import csv, socket, sys, time
path, n, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
want = dict((b, int(k)) for b, k in (a.rsplit(":", 1) for a in sys.argv[4:])) or {"replicas": n}
deadline = time.monotonic() + limit
up = {}
while time.monotonic() < deadline:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(path)
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        rows = list(csv.DictReader(data.decode().lstrip("# ").splitlines()))
        up = {b: sum(1 for r in rows if r["pxname"] == b and r["svname"] not in ("FRONTEND", "BACKEND")
                     and r["status"] == "UP" and r.get("check_status") == "L7OK") for b in want}
        if up == want:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(f"haproxy: servers UP after {limit:g} s: {up}, wanted {want}")
PYEOF
}

# -- replicas from the container image (--image) -------------------------------------------------

# container_runtime REF: sets RUNTIME (docker or buildah), IMAGE_REF and, for buildah, BUILDAH
# (the command with scripts/test_image.sh's image store); dies naming what is missing.
container_runtime() {
    local ref=$1
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        RUNTIME=docker
        IMAGE_REF="$ref"; [[ "$ref" == default ]] && IMAGE_REF=streamtts:cpu
        docker image inspect "$IMAGE_REF" >/dev/null 2>&1 \
            || die "docker has no image $IMAGE_REF (build it: docker build -f deploy/Dockerfile -t $IMAGE_REF .)"
    elif command -v buildah >/dev/null && [[ "$(id -u)" == 0 ]]; then
        RUNTIME=buildah
        IMAGE_REF="$ref"; [[ "$ref" == default ]] && IMAGE_REF=localhost/streamtts:cpu
        buildah_store
        "${BUILDAH[@]}" inspect --type image "$IMAGE_REF" >/dev/null 2>&1 \
            || die "buildah's store $store has no image $IMAGE_REF (build it: bash scripts/test_image.sh --build)"
    else
        die "--image needs a container runtime, and there is none here: no Docker engine answering \`docker info\`, and no buildah run as root (apt-get install buildah). Without --image the replicas run from this checkout."
    fi
    note "replicas from the image $IMAGE_REF ($RUNTIME)"
}

# BUILDAH: buildah on scripts/test_image.sh's image store (its store.env names the driver)
buildah_store() {
    local store="${STREAMTTS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/streamtts/image}" driver=""
    [[ -f "$store/store.env" ]] && driver="$(sed -n 's/^STREAMTTS_IMAGE_DRIVER=//p' "$store/store.env")"
    if [[ "${driver:-vfs}" == vfs ]]; then
        BUILDAH=(buildah --root "$store/storage" --runroot "$store/runroot" --storage-driver vfs)
    else
        BUILDAH=(buildah --root "$store/storage-$driver" --runroot "$store/runroot-$driver" --storage-driver "$driver")
    fi
}

# start_image_replica I GPU CONFIG ARGS...: replica I from the image, on a free port; prints the PID
# that `down` signals (buildah: the replica's tini; docker: the docker client, which passes it on)
start_image_replica() {
    local i=$1 gpu=$2 config=$3 port name pid t=0
    shift 3
    port=$(free_port)
    name="streamtts-replica-$i-$$"
    local mounts=() cfg=()
    if [[ -n "$config" ]]; then
        mounts=(--volume "$(dirname "$config"):/models:ro")
        cfg=(--config "/models/$(basename "$config")")
    fi
    if [[ $RUNTIME == docker ]]; then
        local gpus=()
        [[ -n "$gpu" ]] && gpus=(--gpus "device=$gpu")
        echo "docker $name" >>"$RUN/containers"
        start_bg "replica-$i" docker run --rm --name "$name" --network host -e "STREAMTTS_PORT=$port" \
            "${gpus[@]}" "${mounts[@]}" "$IMAGE_REF" "${cfg[@]}" "$@"
        return
    fi
    local ctr entry
    ctr="$("${BUILDAH[@]}" from --name "$name" "$IMAGE_REF")" || die "buildah from $IMAGE_REF failed"
    echo "buildah $ctr" >>"$RUN/containers"
    # (buildah run's chroot isolation hides a bind mount on an image VOLUME: see scripts/test_image.sh)
    "${BUILDAH[@]}" config --volume /models- "$ctr"
    # the image's own ENTRYPOINT; the arguments replace its CMD, as `docker run IMAGE ARGS` does
    mapfile -t entry < <("${BUILDAH[@]}" inspect --type image "$IMAGE_REF" \
        | "$PY" -c 'import json, sys; [print(a) for a in json.load(sys.stdin)["Docker"]["config"].get("Entrypoint") or []]')
    local envs=(--env "STREAMTTS_PORT=$port" --env TINI_SUBREAPER=1)
    [[ -n "$gpu" ]] && envs+=(--env "CUDA_VISIBLE_DEVICES=$gpu")
    local outer
    outer=$(start_bg "replica-$i" "${BUILDAH[@]}" run --isolation chroot "${envs[@]}" "${mounts[@]}" "$ctr" -- \
        "${entry[@]}" "${cfg[@]}" "$@")
    # chroot isolation has no PID namespace: the replica's tini is a process here, under buildah run
    while [[ -z "${pid:-}" ]]; do
        pid=$("$PY" - "$outer" <<'PYEOF'
import os, sys
kids = {}
for d in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{d}/stat").read()
        kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d))
    except (OSError, IndexError, ValueError):
        pass
todo = [int(sys.argv[1])]
while todo:
    for k in kids.get(todo.pop(), []):
        if open(f"/proc/{k}/comm").read().strip() == "tini":
            print(k)
            sys.exit()
        todo.append(k)
PYEOF
)
        [[ -n "$pid" ]] && break
        alive "$outer" || { tail -n 30 "$RUN/replica-$i.log" >&2; die "replica $i (buildah run) exited while starting"; }
        (( t++ < 600 )) || die "replica $i: no tini under buildah run after 60 s"
        sleep 0.1
    done
    echo "$pid"
}

# the containers `up` made (docker's remove themselves: --rm)
remove_containers() {
    [[ -f "$RUN/containers" ]] || return 0
    local kind ctr
    buildah_store
    while read -r kind ctr; do
        [[ $kind == buildah ]] || continue
        # its `buildah run` first finishes (it unmounts the container after the replica's exit;
        # removed under it, it fails and the replica's exit status with it)
        for _ in $(seq 300); do
            pgrep -f -- " run .* $ctr -- " >/dev/null || break
            sleep 0.1
        done
        for _ in $(seq 50); do
            "${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 && break
            sleep 0.2
        done
    done <"$RUN/containers"
    rm -f "$RUN/containers"
}

print_status() {
    [[ -f "$RUN/cluster.json" ]] || die "no cluster in $RUN (run: $0 up)"
    local dead=0 role pid
    while read -r role pid; do
        alive "$pid" || { echo "local-cluster.sh: $role (pid $pid) is not running" >&2; dead=1; }
    done <"$RUN/pids"
    cat "$RUN/cluster.json"
    return $dead
}

cmd_up() {
    local n=2 n_given="" config="" bind="" image="" serve_args=() sets=()
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --config) config="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
            --replica) [[ $# -ge 2 ]] || die "--replica needs \"ID=CFG.yaml ...\""; sets+=("$2"); shift 2 ;;
            --run-dir) RUN="$2"; shift 2 ;;
            --bind) bind="$2"; shift 2 ;;
            --image) image=default; shift
                     if [[ $# -gt 0 && "$1" != -* && ! "$1" =~ ^[0-9]+$ ]]; then image="$1"; shift; fi ;;
            --) shift; serve_args=("$@"); break ;;
            -h|--help) usage ;;
            [0-9]*) n=$1; n_given=1; shift ;;
            *) die "unknown argument: $1" ;;
        esac
    done
    (( n >= 1 )) || die "N must be >= 1"
    # --replica: each one's `--model ID=CFG` arguments, its ids, and every id's config
    local rep_args=() rep_ids=() model_ids=() spec id cfg k
    declare -A model_cfg=()
    if (( ${#sets[@]} )); then
        [[ -z "$n_given" && -z "$config" ]] || die "--replica gives each replica its models: no N or --config with it"
        [[ -z "$image" ]] || die "--replica with --image is not supported yet (run the replicas from this checkout)"
        n=${#sets[@]}
        for ((k = 0; k < n; k++)); do
            local margs="" mids=""
            for spec in ${sets[$k]}; do
                [[ "$spec" == *=* ]] || die "--replica: $spec is not ID=CFG.yaml"
                id="${spec%%=*}"; cfg="${spec#*=}"
                [[ "$id" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--replica: model id '$id' (letters, digits, . _ -)"
                [[ -f "$cfg" ]] || die "--replica: no config file $cfg"
                cfg="$(cd "$(dirname "$cfg")" && pwd)/$(basename "$cfg")"
                if [[ -n "${model_cfg[$id]:-}" ]]; then
                    [[ "${model_cfg[$id]}" == "$cfg" ]] || die "--replica: model $id is ${model_cfg[$id]} and $cfg: one id, one config"
                else
                    model_cfg[$id]="$cfg"; model_ids+=("$id")
                fi
                [[ " $mids " == *" $id "* ]] && die "--replica: $id twice in one replica"
                margs+=" --model $id=$cfg"; mids+="${mids:+ }$id"
            done
            [[ -n "$mids" ]] || die "--replica: no models in \"${sets[$k]}\""
            rep_args+=("$margs"); rep_ids+=("$mids")
        done
    fi
    mkdir -p "$RUN"
    RUN="$(cd "$RUN" && pwd)"
    if [[ -f "$RUN/pids" ]]; then
        while read -r _ pid; do
            alive "$pid" && die "a cluster is already running from $RUN (pid $pid); run: $0 down"
        done <"$RUN/pids"
    fi
    ensure_packages
    PY="$(python_bin)"
    if [[ -n "$image" ]]; then
        container_runtime "$image"
        "$PY" -c "import sys" 2>/dev/null || die "$PY is not a Python interpreter (set STREAMTTS_PYTHON)"
    else
        "$PY" -c "import streamtts" 2>/dev/null || die "$PY cannot import streamtts (set STREAMTTS_PYTHON)"
    fi
    rm -f "$RUN"/*.log "$RUN"/*.pid "$RUN"/*.exit "$RUN/pids" "$RUN/cluster.json" "$RUN/containers"
    rm -rf "$RUN/appendonlydir"
    # Any failure from here on (an error, or die) stops what was started: nothing is left behind.
    trap cleanup_on_error EXIT

    # -- Redis: the shared voice store (append-only file, so a restart keeps the voices) --------
    local redis_port
    redis_port=$(free_port)
    cat >"$RUN/redis.conf" <<CONF
bind 127.0.0.1
port $redis_port
dir $RUN
daemonize no
save ""
appendonly yes
maxmemory 256mb
maxmemory-policy volatile-lru
logfile $RUN/redis.log
CONF
    local redis_pid
    redis_pid=$(start_bg redis redis-server "$RUN/redis.conf")
    STARTED+=("$redis_pid")
    echo "redis $redis_pid" >>"$RUN/pids"
    local redis_url="redis://127.0.0.1:$redis_port/0"
    note "redis $redis_url (pid $redis_pid)"

    # -- replicas --------------------------------------------------------------------------------
    local pids=() logs=() ports=() i
    local cfg_args=()
    [[ -n "$config" ]] && cfg_args=(--config "$config")
    local gpus=()
    [[ -n "${STREAMTTS_CLUSTER_GPUS:-}" ]] && IFS=, read -r -a gpus <<<"$STREAMTTS_CLUSTER_GPUS"
    for ((i = 1; i <= n; i++)); do
        local pid dev=() gpu=""
        (( ${#gpus[@]} )) && gpu="${gpus[$(( (i - 1) % ${#gpus[@]} ))]}" && dev=(env "CUDA_VISIBLE_DEVICES=$gpu")
        local own=("${cfg_args[@]}")
        # shellcheck disable=SC2206  # ids and paths without spaces (checked above)
        (( ${#rep_args[@]} )) && own=(${rep_args[$((i - 1))]})
        if [[ -n "$image" ]]; then
            pid=$(start_image_replica "$i" "$gpu" "$config" --host 127.0.0.1 --voice-store "$redis_url" "${serve_args[@]}")
        else
            pid=$(start_bg "replica-$i" "${dev[@]}" "$PY" -m streamtts.cli.main serve --host 127.0.0.1 \
                --port 0 --voice-store "$redis_url" "${own[@]}" "${serve_args[@]}")
        fi
        pids+=("$pid"); logs+=("$RUN/replica-$i.log")
        STARTED+=("$pid")
        echo "replica $pid" >>"$RUN/pids"
    done
    for ((i = 0; i < n; i++)); do
        ports+=("$(wait_port "${logs[$i]}" "${pids[$i]}" 300)")
    done
    for ((i = 0; i < n; i++)); do
        wait_http "http://127.0.0.1:${ports[$i]}/readyz" 300 "${pids[$i]}" \
            || { tail -n 30 "${logs[$i]}" >&2; die "replica ${pids[$i]} not ready"; }
        note "replica $((i + 1)) http://127.0.0.1:${ports[$i]} (pid ${pids[$i]})"
    done

    # -- HAProxy ---------------------------------------------------------------------------------
    local lb_port lb_host=127.0.0.1
    if [[ -n "$bind" ]]; then lb_host="${bind%:*}"; lb_port="${bind##*:}"; else lb_port=$(free_port); fi
    cp "$HERE/haproxy.cfg" "$RUN/haproxy.cfg"
    local expect=()
    unset STREAMTTS_LB_MODELS
    if (( ${#model_ids[@]} )); then
        write_model_routing "${model_ids[@]}"
        expect=("${LB_EXPECT[@]}")
        export STREAMTTS_LB_MODELS="${model_ids[*]}"
    else
        for ((i = 0; i < n; i++)); do
            echo "    server r$((i + 1)) 127.0.0.1:${ports[$i]}" >>"$RUN/haproxy.cfg"
        done
    fi
    export STREAMTTS_LB_BIND="$lb_host:$lb_port" STREAMTTS_LB_RUN="$RUN" STREAMTTS_LB_CHECK_INTER="$CHECK_INTER"
    haproxy -c -q -f "$RUN/haproxy.cfg" >&2 || die "haproxy rejected $RUN/haproxy.cfg"
    local lb_pid
    lb_pid=$(start_bg haproxy haproxy -db -f "$RUN/haproxy.cfg")
    STARTED+=("$lb_pid")
    echo "haproxy $lb_pid" >>"$RUN/pids"
    wait_haproxy "$RUN/haproxy.sock" "$n" 30 "${expect[@]}" || die "haproxy did not see the replicas (log $RUN/haproxy.log)"
    if (( ${#model_ids[@]} )); then
        note "haproxy http://$lb_host:$lb_port (pid $lb_pid), routing on the model: ${model_ids[*]} (default ${model_ids[0]})"
    else
        note "haproxy http://$lb_host:$lb_port (pid $lb_pid), leastconn over $n replicas"
    fi

    local reps="" sep="" extra=""
    for ((i = 0; i < n; i++)); do
        local own_models=""
        (( ${#rep_ids[@]} )) && own_models=", \"models\": $(json_list ${rep_ids[$i]})"
        reps+="$sep{\"url\": \"http://127.0.0.1:${ports[$i]}\", \"pid\": ${pids[$i]}$own_models}"
        sep=", "
    done
    (( ${#model_ids[@]} )) && extra=", \"models\": $(json_list "${model_ids[@]}")"
    printf '{"balancer": "http://%s:%s", "replicas": [%s], "redis": "%s"%s}\n' \
        "$lb_host" "$lb_port" "$reps" "$redis_url" "$extra" >"$RUN/cluster.json"
    trap - EXIT
    cat "$RUN/cluster.json"
}

# json_list WORD...: ["WORD", ...] (ids: no quotes or backslashes in them)
json_list() {
    local out="" w
    for w in "$@"; do out+="${out:+, }\"$w\""; done
    echo "[$out]"
}

# write_model_routing ID...: for deploy/haproxy.cfg's routing on the model (it says how): in
# $RUN, models.map (every id, and OpenAI's names and "-none-" for the default: the first id) and
# unknown-model.json; appended to haproxy.cfg, one backend `model-ID` per id, a copy of its
# `replicas` backend checking /readyz?model=ID, with the replicas serving ID as its servers.
# Uses ports and rep_ids (cmd_up's); sets LB_EXPECT (BACKEND:N for wait_haproxy).
write_model_routing() {
    local ids=("$@") id name j block
    : >"$RUN/models.map"
    for id in "${ids[@]}"; do echo "$id $id" >>"$RUN/models.map"; done
    for name in -none- tts-1 tts-1-hd gpt-4o-mini-tts streamtts; do
        [[ " ${ids[*]} " == *" $name "* ]] || echo "$name ${ids[0]}" >>"$RUN/models.map"
    done
    local list="${ids[*]}"
    printf '%s\n' "{\"error\": {\"message\": \"unknown model '%[var(txn.model),json(utf8s)]': this cluster serves ${list// /, } (name it in the URL's ?model= or the X-Model header)\", \"type\": \"invalid_request_error\", \"param\": \"model\", \"code\": \"unknown_model\"}}" \
        >"$RUN/unknown-model.json"
    block="$(sed -n '/^backend replicas$/,$p' "$HERE/haproxy.cfg")"
    LB_EXPECT=()
    for id in "${ids[@]}"; do
        local count=0
        printf '\n%s\n' "$block" | sed -e "s/^backend replicas\$/backend model-$id/" \
            -e "s|uri /readyz |uri /readyz?model=$id |" >>"$RUN/haproxy.cfg"
        for ((j = 0; j < ${#rep_ids[@]}; j++)); do
            if [[ " ${rep_ids[$j]} " == *" $id "* ]]; then
                echo "    server r$((j + 1)) 127.0.0.1:${ports[$j]}" >>"$RUN/haproxy.cfg"
                count=$((count + 1))
            fi
        done
        LB_EXPECT+=("model-$id:$count")
    done
}

cmd_down() {
    [[ $# -ge 2 && "$1" == --run-dir ]] && RUN="$2"
    [[ -f "$RUN/pids" ]] || { note "no cluster in $RUN"; return 0; }
    local role pid todo=()
    while read -r role pid; do
        case "$role" in
            # the checkout's, the image's under tini (buildah), or the docker client of one
            replica) what="streamtts(\.cli\.main)? serve|docker run .*streamtts-replica-" ;;
            redis) what="redis-server" ;;
            haproxy) what="haproxy" ;;
            *) what="$role" ;;
        esac
        if ours "$pid" "$what"; then
            kill -TERM "$pid" 2>/dev/null || true
            todo+=("$pid")
        fi
    done <"$RUN/pids"
    local waited=0
    while (( waited < DOWN_TIMEOUT * 10 )); do
        local left=0
        for pid in "${todo[@]}"; do alive "$pid" && left=1; done
        (( left == 0 )) && break
        sleep 0.1; waited=$((waited + 1))
    done
    for pid in "${todo[@]}"; do
        if alive "$pid"; then
            echo "local-cluster.sh: pid $pid still running after ${DOWN_TIMEOUT} s: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    remove_containers
    rm -f "$RUN/pids" "$RUN/cluster.json"
    note "stopped ${#todo[@]} process(es) from $RUN"
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    status) shift; [[ $# -ge 2 && "$1" == --run-dir ]] && RUN="$2"; print_status ;;
    down) shift; cmd_down "$@" ;;
    *) usage ;;
esac
