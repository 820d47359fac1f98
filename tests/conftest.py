"""Shared pytest fixtures. Each area keeps its fixtures in its own marked section."""

from __future__ import annotations

# =====================================================================================
# native layer: the llama.cpp bridge (native/build.sh) and tiny qwen3 GGUF models
# =====================================================================================
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

# Hypothesis' default 200 ms deadline is a wall-clock margin: on a busy 2-core machine one
# example (or drawing its data) can take longer with nothing wrong. Examples are judged by
# their outcome alone.
hypothesis_settings.register_profile(
    "streamtts", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("streamtts")

from streamtts.config import SamplingParams
from streamtts.convert.qwen3_gguf import Qwen3Shape
from streamtts.core.tokens import TokenIds
from streamtts.demo.gguf_writer import random_qwen3_tensors, write_qwen3_gguf
from streamtts.errors import NativeLibraryError
from streamtts.model import _llama
from streamtts.model.backbone import Backbone, BackboneParams

TINY_SHAPE = Qwen3Shape(
    n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_vocab=300
)
# big enough that one 512-row decode takes a noticeable time (GIL test)
SMALL_SHAPE = Qwen3Shape(
    n_embd=256, n_layer=4, n_head=8, n_head_kv=4, head_dim=32, n_ff=1024, n_vocab=512
)


@dataclass(frozen=True)
class TinyModel:
    path: Path
    shape: Qwen3Shape
    # (n_vocab, n_embd) float32: the output layer as llama.cpp sees it (f16-rounded)
    output: np.ndarray


# Small model token ids: 4 codebooks of 16 codes, a 12-token text vocabulary (state-machine tests).
SMALL_IDS = TokenIds(
    n_vq=4,
    pad=0,
    im_start=1,
    im_end=2,
    audio_start=3,
    audio_end=4,
    user_slot=5,
    gen_slot=6,
    delay_slot=7,
    audio_pad_code=16,
    audio_vocab_size=16,
)
# Same, with the gen slot's id above the delay slot's (pair columns swap).
SWAPPED_IDS = msgspec.structs.replace(SMALL_IDS, gen_slot=9)


@pytest.fixture(scope="session")
def bridge_lib() -> Any:
    """The loaded bridge library; fails (never skips) with the build command when missing."""
    try:
        return _llama.load_bridge()
    except NativeLibraryError as exc:
        problem = str(exc)
    pytest.fail(
        f"{problem}\n\n    The native layer is not built: run `native/build.sh` first.",
        pytrace=False,
    )


def _write_model(path: Path, shape: Qwen3Shape, seed: int) -> TinyModel:
    tensors = random_qwen3_tensors(shape, seed)
    rng = np.random.default_rng(seed + 1000)
    output = (rng.standard_normal((shape.n_vocab, shape.n_embd), dtype=np.float32) * 0.1).astype(
        np.float32
    )
    write_qwen3_gguf(path, shape, tensors, output=output)
    return TinyModel(path=path, shape=shape, output=output.astype(np.float16).astype(np.float32))


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A 2-layer, 64-wide random qwen3 GGUF (f16) with a 300-row output layer."""
    return _write_model(tmp_path_factory.mktemp("gguf") / "tiny-qwen3.gguf", TINY_SHAPE, seed=0)


@pytest.fixture(scope="session")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A 4-layer, 256-wide random qwen3 GGUF: slow enough to time a decode."""
    return _write_model(tmp_path_factory.mktemp("gguf") / "small-qwen3.gguf", SMALL_SHAPE, seed=1)


@pytest.fixture
def make_backbone(bridge_lib: Any, tiny_gguf: TinyModel) -> Iterator[Any]:
    """Factory: make_backbone(**BackboneParams overrides) -> Backbone on the tiny model, closed after."""
    made: list[Backbone] = []

    def make(**kw: Any) -> Backbone:
        kw.setdefault("model_path", str(tiny_gguf.path))
        kw.setdefault("n_ctx", 512)
        kw.setdefault("n_batch", 64)
        kw.setdefault("n_seq_max", 2)
        kw.setdefault("n_threads", 1)  # robust when other jobs share the cores
        b = Backbone(BackboneParams(**kw))
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


# ============================== end of native layer section ==========================


# =====================================================================================
# demo model: the synthetic MOSS-TTS-Delay model (streamtts.demo), written once per session
# =====================================================================================


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny demo model (seed 0) in the official layout; ``demo_model_dir / "config.yaml"``."""
    from streamtts.demo.model import write_demo_model

    root = tmp_path_factory.mktemp("demo-model")
    write_demo_model(root, "tiny", seed=0)
    return root


@pytest.fixture(scope="session")
def real_codec_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model with the real codec decoder architecture (small, random weights):
    ``decoder.onnx`` (offline) and ``decoder_streaming.onnx`` built by the codec builder."""
    from streamtts.demo.model import write_demo_model

    root = tmp_path_factory.mktemp("demo-real-codec")
    write_demo_model(root, "tiny", seed=0, codec="real")
    return root


@pytest.fixture(scope="session")
def demo_model_16_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model with 16 codebooks (as TTSD, VoiceGenerator, SoundEffect)."""
    from streamtts.demo.model import write_demo_model

    root = tmp_path_factory.mktemp("demo-model-16")
    write_demo_model(root, "tiny", seed=0, n_vq=16)
    return root


@pytest.fixture(scope="session")
def real_codec_16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 16-codebook tiny demo model with the real codec architecture: its decoders built
    for the codec's first 16 levels (``codec build --n-vq 16``)."""
    from streamtts.demo.model import write_demo_model

    root = tmp_path_factory.mktemp("demo-real-codec-16")
    write_demo_model(root, "tiny", seed=0, codec="real", n_vq=16)
    return root


def demo_dir_for(request: pytest.FixtureRequest, n_vq: int, *, real_codec: bool = False) -> Path:
    """The session's demo model with ``n_vq`` codebooks (32 or 16), tone or real codec."""
    names = {
        (32, False): "demo_model_dir", (16, False): "demo_model_16_dir",
        (32, True): "real_codec_model_dir", (16, True): "real_codec_16_model_dir",
    }  # fmt: skip
    path: Path = request.getfixturevalue(names[(n_vq, real_codec)])
    return path


@pytest.fixture(scope="session")
def voice_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 s, 24 kHz reference recording (a wobbling tone)."""
    import soundfile as sf

    sr = 24000
    t = np.arange(sr * 4) / sr
    path = tmp_path_factory.mktemp("voice") / "voice.wav"
    sf.write(path, 0.2 * np.sin(2 * np.pi * 200 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)), sr)
    return path


# ============================== end of demo model section ============================


# =====================================================================================
# server: real `streamtts serve` processes on loopback (test_server*.py, test_client.py)
# =====================================================================================


@dataclass
class ServerProcess:
    """A running server: ``http`` / ``ws`` base URLs, its process and its log file."""

    proc: Any
    port: int
    log_path: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    def get(self, path: str) -> tuple[int, bytes]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.http + path, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def health(self) -> dict[str, Any]:
        import json

        return dict(json.loads(self.get("/healthz")[1]))

    def generating(self, polls: int = 10) -> bool:
        """Whether the engine works on a stream within a few polls 10 ms apart: one poll can
        fall in the short gap between two segments of a text, when nothing is running."""
        import time

        for _ in range(polls):
            h = self.health()
            if h["active_streams"] + h["queued_streams"] >= 1:
                return True
            time.sleep(0.01)
        return False

    def metrics(self) -> str:
        return self.get("/metrics")[1].decode()

    def metric(self, name: str) -> float:
        """The value of one sample line (``name`` with its labels, exactly as exposed)."""
        for line in self.metrics().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def wait_idle(self, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until no engine stream is active or queued and no session is open."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if h["active_streams"] == 0 and h["queued_streams"] == 0 and h["sessions"] == 0:
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout} s: {h}\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_server(args: list[str], log_path: Path, timeout: float = 180.0) -> ServerProcess:
    """Start ``streamtts serve --port 0 ARGS``; return once /healthz says ready.

    Without ``--admission`` in ARGS: ``--admission slots``. By the server's default, admission
    by measured capacity, how many sessions run at once depends on how fast this machine is
    at that moment; the tests that run several at once check other things. The admission
    tests ask for ``--admission capacity``."""
    from benchmarks._common import start_server as start  # the benchmarks' (imports the server)

    if "--admission" not in args:
        args = [*args, "--admission", "slots"]
    return ServerProcess(*start(args, log_path, timeout))


def stop_server(srv: ServerProcess) -> None:
    import signal
    import subprocess

    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGINT)
        try:
            srv.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()


@pytest.fixture(scope="module")
def serve(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Factory: ``serve(*args)`` -> ServerProcess on the demo model; all stopped after the module."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        srv = start_server(["--config", str(demo_model_dir / "config.yaml"), *args], log_path)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        stop_server(srv)


# ============================== end of server section ================================


# =====================================================================================
# deploy: a real redis-server on a free loopback port (server/test_voice_store.py, test_deploy_*.py)
# =====================================================================================


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_binary(name: str) -> str:
    """The path of ``name``; fails (never skips) naming the setup command when missing."""
    import shutil

    path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if path is None:
        pytest.fail(f"{name} is not installed: run `bash scripts/setup.sh --test` (apt package)", pytrace=False)
    return path


@dataclass
class RedisServer:
    """redis-server on 127.0.0.1:``port`` (append-only file in ``folder``); stop() and start()
    again on the same port and data."""

    port: int
    folder: Path
    proc: Any = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import subprocess
        import time

        import redis

        self.proc = subprocess.Popen(
            [need_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port),
             "--dir", str(self.folder), "--save", "", "--appendonly", "yes"],
            stdout=(self.folder / "redis.log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start: {(self.folder / 'redis.log').read_text()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(free_port(), tmp_path)
    srv.start()
    yield srv
    srv.stop()


# ============================== end of deploy section ================================


# =====================================================================================
# command line: a command run with its stderr on a real terminal (a pty)
# =====================================================================================


def on_a_terminal(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` with stderr on a pty (stdin empty, stdout a pipe); returns (exit status,
    what the terminal got, its escapes included)."""
    import os
    import pty
    import subprocess

    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    got = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the process closed its side
            break
        if not chunk:
            break
        got += chunk
    proc.communicate(timeout=300)
    os.close(leader)
    return proc.returncode, got.decode(errors="replace").replace("\r\n", "\n")


# ============================== end of command line section ==========================


def random_sampling_params(rng: np.random.Generator, audio_top_k: tuple[int, ...] = (0, 1, 5, 25)) -> SamplingParams:
    """Sampling settings drawn over every path of the samplers (the state-machine tests)."""
    return SamplingParams(
        text_temperature=float(rng.choice([0.0, 0.7, 1.5])),
        text_top_k=int(rng.choice([0, 1, 2, 50])),
        text_top_p=float(rng.choice([0.3, 0.9, 1.0])),
        audio_temperature=float(rng.choice([0.0, 1.0, 1.7])),
        audio_top_k=int(rng.choice(audio_top_k)),
        audio_top_p=float(rng.choice([0.2, 0.8, 1.0])),
        audio_repetition_penalty=float(rng.choice([1.0, 1.0, 1.3, 0.8])),
    )


# -- the browser page (Debian's Chromium, driven by Playwright) --------------------------------
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]


@pytest.fixture
def page(tmp_path: Path) -> Any:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium): apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a new, empty user data dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
        )
        try:
            yield ctx.new_page()
        finally:
            ctx.close()


# -- prompts and HAProxy, as several test modules read them --------------------------------------
def decode_prompt(config_yaml: Path, rows: Any) -> str:
    """The text column of prompt rows (``synth --prompt-out``, a prepared request), decoded."""
    import numpy as np

    from streamtts.config import load_config
    from streamtts.core.prompt import HFTokenizer

    return HFTokenizer(load_config(config_yaml).tokenizer_dir).decode([int(t) for t in np.asarray(rows)[:, 0]])


def prepared_requests(config_yaml: Path, requests: list[tuple[str, Any]], **overrides: Any) -> list[Any]:
    """Each (text, StreamOptions) as the engine's preparer prepares it (the model loaded once)."""
    import asyncio

    from streamtts import Engine
    from streamtts.request import StreamStats

    async def main() -> list[Any]:
        eng = Engine.from_config(config_yaml, n_threads=1, max_streams=1, warmup=False, **overrides)
        async with eng:
            return [eng._preparer.prepare(1, t, None, o, None, StreamStats()) for t, o in requests]

    return asyncio.run(main())


def haproxy_stat(run_dir: Path) -> list[dict[str, str]]:
    """HAProxy's ``show stat`` rows, read from its admin socket in ``run_dir``."""
    import csv
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(run_dir / "haproxy.sock"))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return list(csv.DictReader(data.decode().lstrip("# ").splitlines()))
