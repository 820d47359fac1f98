"""The TensorRT streaming codec (codec/trt_streaming.py) on a stand-in runtime.

No GPU here: the stand-in implements the runtime protocol with NumPy "device" buffers and
executes the very graph the engine is built from (decoder_streaming.onnx) with ONNX Runtime
bound to those buffers' addresses, the state outputs bound to the state inputs' memory, as
TensorRT is. So everything above the TensorRT calls is exercised: the sidecar metadata,
the buffer plan (state tables on the device only, allocated once), the per-call uploads,
profiles, in-place state, device-side zeroing, the self-check and the loader's choices.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from streamtts.codec.build.decoders import build_decoders
from streamtts.codec.build.tensorrt import _sidecar, streaming_onnx_meta
from streamtts.codec.stamp import KEY_BUILDER
from streamtts.codec.trt_plan import IOTensor, ProfileShape, stateful_profiles
from streamtts.codec.trt_streaming import TrtStreamingDecoder, read_sidecar, sidecar_path
from streamtts.errors import CodecError, ConfigError, ModelFileError

FIX = Path(__file__).parents[1] / "fixtures" / "codec"
EXACT = 1e-3
FRAME = 1920


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("codec") / "weights"
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIX / name, d / name)
    r = build_decoders(d)
    assert r.streaming is not None
    return r.streaming


@pytest.fixture(scope="module")
def offline() -> np.ndarray:
    return np.load(FIX / "offline.npy").reshape(-1)


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    return np.ascontiguousarray(np.load(FIX / "codes.npy")[:, 0, :].T)


class FakeStatefulRuntime:
    """StatefulTrtRuntime on CPU: device buffers are NumPy arrays, the engine is ONNX Runtime
    on the same graph, every tensor bound by address (outputs included)."""

    def __init__(self, graph: Path, profiles: list[ProfileShape], slots: int) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3
        self.sess = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        self.profiles = profiles
        self.kind = "decoder"
        def tensor(p: Any, is_input: bool) -> IOTensor:
            dtype = "float32" if p.name.startswith("state") or p.name == "audio" else "int64"
            return IOTensor(p.name, is_input, dtype, tuple(d if isinstance(d, int) else -1 for d in p.shape))

        self.io = [tensor(p, True) for p in self.sess.get_inputs()]
        self.io += [tensor(p, False) for p in self.sess.get_outputs()]
        self.slots = slots
        self.dev: dict[str, np.ndarray] = {}
        self.host_bufs: dict[str, np.ndarray] = {}
        self.shapes: dict[int, dict[str, tuple[int, ...]]] = {i: {} for i in range(len(profiles))}
        self.allocations = 0
        self.uploaded: list[tuple[str, int]] = []
        self.executed: list[int] = []
        self.closed = False

    def allocate(self, plan: Any) -> None:
        self.allocations += 1
        for spec in plan.buffers:
            if spec.host:
                self.host_bufs[spec.name] = np.zeros(spec.nbytes, np.uint8)
            if spec.device and not spec.alias_of:
                # garbage, as cudaMalloc leaves it: the decoder must zero the tables itself
                self.dev[spec.name] = np.full(spec.nbytes, 0xFF, np.uint8)
        for spec in plan.buffers:
            if spec.alias_of:
                self.dev[spec.name] = self.dev[spec.alias_of]

    def host(self, name: str) -> np.ndarray:
        return self.host_bufs[name]

    def upload(self, name: str, nbytes: int) -> None:
        self.uploaded.append((name, nbytes))
        self.dev[name][:nbytes] = self.host_bufs[name][:nbytes]

    def download(self, name: str, nbytes: int) -> None:
        self.host_bufs[name][:nbytes] = self.dev[name][:nbytes]

    def memset(self, name: str, offset: int, nbytes: int) -> None:
        self.dev[name][offset : offset + nbytes] = 0

    def set_shape(self, profile: int, name: str, shape: tuple[int, ...]) -> None:
        if name == "codes" and not self.profiles[profile].covers(shape[1], shape[2]):
            raise CodecError(f"shape {shape} outside profile {profile}")
        self.shapes[profile][name] = shape

    def output_shape(self, profile: int, name: str) -> tuple[int, ...]:
        _, b, t = self.shapes[profile]["codes"]
        return (b, t * FRAME)

    def execute(self, profile: int) -> None:
        self.executed.append(profile)
        shapes = self.shapes[profile]
        io = self.sess.io_binding()
        for t in self.io:
            if t.is_input:
                shape = shapes[t.name]
                dtype = np.float32 if t.name.startswith("state") else np.int64
            elif t.name == "audio":
                shape, dtype = self.output_shape(profile, "audio"), np.float32
            else:  # state_out_s: the memory of state_s
                shape, dtype = shapes[t.name.replace("_out", "")], np.float32
            ptr = self.dev[t.name].ctypes.data
            bind = io.bind_input if t.is_input else io.bind_output
            bind(t.name, "cpu", 0, dtype, list(shape), ptr)
        self.sess.run_with_iobinding(io)

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _decoder(graph: Path, slots: int = 4, max_batch: int = 4, max_frames: int = 16) -> tuple[TrtStreamingDecoder, FakeStatefulRuntime]:
    meta = json.loads(_sidecar(streaming_onnx_meta(graph), slots, graph))
    rt = FakeStatefulRuntime(graph, stateful_profiles(max_batch, 8, max_frames, [1, 2]), slots)
    return TrtStreamingDecoder(rt, meta, path=graph.with_suffix(".engine")), rt


def test_streams_equal_the_offline_decode_with_state_on_the_device(
    graph: Path, codes: np.ndarray, offline: np.ndarray
) -> None:
    dec, rt = _decoder(graph)
    assert dec.n_slots == 4 and dec.max_batch == 4 and dec.max_chunk == 16 and dec.device == "cuda"
    # the tables: device only (no pinned mirror), and each output bound to its input's memory
    assert not any(n.startswith("state") for n in rt.host_bufs)
    assert all(rt.dev[f"state_out_{i}"] is rt.dev[f"state_{i}"] for i in range(4))
    assert not rt.dev["state_0"].any()  # zeroed at load (the fake allocates 0xFF garbage)
    other = (codes * 7 + 3) % 1024
    slots = [dec.acquire(), dec.acquire()]
    outs: list[list[np.ndarray]] = [[], []]
    done = 0
    for n in [1, 2, 4, 8, 16, 16, 3, 20, 30]:  # 20 and 30 > max_chunk: split in two calls
        n = min(n, 300 - done)
        batch = np.stack([codes[done : done + n], other[done : done + n]])
        lens = [n, max(n - 1, 0)] if done + n < 300 else [n, n]
        rt.uploaded.clear()
        pcm = dec.decode(slots, batch, lengths=lens)
        if n <= 16:
            b = 2
            assert [u[0] for u in rt.uploaded] == ["codes", "positions", "slots", "lengths"]
            assert rt.uploaded[0][1] == 32 * b * n * 8  # only the call's codes go up
        outs[0].append(pcm[0, : lens[0] * FRAME])
        outs[1].append(pcm[1, : lens[1] * FRAME])
        done += n
    first = np.concatenate(outs[0])
    assert np.abs(first - offline[: first.size]).max() < EXACT
    assert rt.allocations == 1 and set(rt.executed) <= {0, 1}


def test_release_zeroes_the_slot_on_the_device_and_self_check(graph: Path, codes: np.ndarray, offline: np.ndarray) -> None:
    dec, rt = _decoder(graph, slots=2)
    s = dec.acquire()
    dec.decode([s], codes[None, :40])
    per_slot = dec.stages[0].nbytes
    assert rt.dev["state_0"][s * per_slot : (s + 1) * per_slot].any()
    dec.release(s)
    assert not rt.dev["state_0"].any()
    assert dec.self_check() < 1e-5
    s = dec.acquire()
    pcm = np.concatenate([dec.decode([s], codes[None, t : t + 8])[0] for t in range(0, 64, 8)])
    assert np.abs(pcm - offline[: pcm.size]).max() < EXACT


def test_a_runtime_that_does_not_keep_the_state_fails_the_self_check(graph: Path) -> None:
    dec, rt = _decoder(graph, slots=2)
    real = rt.execute

    def forgetful(profile: int) -> None:  # e.g. a TensorRT that copied instead of aliasing
        real(profile)
        for i in range(4):
            rt.dev[f"state_{i}"][:] = 0

    rt.execute = forgetful  # type: ignore[method-assign]
    with pytest.raises(CodecError, match="self-check failed on cuda"):
        dec.self_check()


def test_sidecar_and_build_metadata_are_checked(graph: Path, tmp_path: Path) -> None:
    engine = tmp_path / "decoder_streaming.engine"
    engine.write_bytes(b"not an engine")
    with pytest.raises(ModelFileError, match=r"decoder_streaming.engine.json is missing beside it"):
        read_sidecar(engine)
    meta = json.loads(_sidecar(streaming_onnx_meta(graph), 2, graph))
    sidecar_path(engine).write_text(json.dumps(meta))
    assert read_sidecar(engine)["streamtts.codec.slot_decoder"] == "2"
    old = dict(meta, **{KEY_BUILDER: "1"})
    rt = FakeStatefulRuntime(graph, stateful_profiles(2, 8, 16), 2)
    with pytest.raises(ModelFileError, match="builder version 1"):
        TrtStreamingDecoder(rt, old, path=engine)
    with pytest.raises(ModelFileError, match="no slot count"):
        TrtStreamingDecoder(rt, {k: v for k, v in meta.items() if k != "streamtts.codec.slot_decoder"}, path=engine)
    sidecar_path(engine).write_text("[1, 2]")
    with pytest.raises(ModelFileError, match="not a JSON object"):
        read_sidecar(engine)


def test_the_loader_picks_the_engine_beside_the_trt_decoder(
    real_codec_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """audio_backend trt: an engine found beside audio_decoder_trt is tried (here TensorRT is
    not installed: a warning naming what to install, windows); a named one must load; an
    ONNX graph named with trt, or an engine with onnx, is a config error."""
    import msgspec

    from streamtts.codec import load_streaming_decoder
    from streamtts.config import load_config

    cfg = load_config(real_codec_model_dir / "config.yaml")
    engine = tmp_path / "decoder_streaming.engine"
    engine.write_bytes(b"x")
    sidecar_path(engine).write_text("{}")
    trt = msgspec.structs.replace(cfg, audio_backend="trt", audio_decoder_trt=str(tmp_path / "decoder.engine"))
    with caplog.at_level(logging.WARNING, logger="streamtts.codec"):
        assert load_streaming_decoder(trt, 2) is None
    assert "not using" in caplog.text and "decoder_streaming.engine" in caplog.text
    with pytest.raises((ModelFileError, CodecError)):
        load_streaming_decoder(msgspec.structs.replace(trt, codec_streaming=str(engine)), 2)
    onnx_graph = str(real_codec_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder_streaming.onnx")
    with pytest.raises(ConfigError, match="goes with audio_backend 'trt'"):
        load_streaming_decoder(msgspec.structs.replace(trt, codec_streaming=onnx_graph), 2)
    with pytest.raises(ConfigError, match="goes with audio_backend 'trt'"):
        load_streaming_decoder(msgspec.structs.replace(cfg, codec_streaming=str(engine)), 2)


def test_cli_plans_a_streaming_engine(graph: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from streamtts.cli.main import main

    rc = main(["build-engine", "--kind", "streaming", "--onnx", str(graph), "--slots", "16", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "streaming decoder engine, tf32, 16 stream slots, 3 profile(s)" in out  # batch 1, 2-4, 5-16
    assert "new frames 1..16 (opt 8)" in out


def _no_tensorrt() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU: nvidia-smi not found"
    try:
        import tensorrt  # noqa: F401
        from cuda.bindings import runtime  # noqa: F401
    except ImportError as exc:
        return f"needs tensorrt and cuda-python ({exc})"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_no_tensorrt() is not None, reason=_no_tensorrt() or "")
def test_on_a_gpu_the_engine_builds_and_streams_like_the_offline_decode(
    graph: Path, codes: np.ndarray, offline: np.ndarray, tmp_path: Path
) -> None:
    from streamtts.codec.build.tensorrt import BuildOptions, build_streaming_engine
    from streamtts.codec.trt_streaming import load_trt_streaming_decoder

    engine = build_streaming_engine(graph, tmp_path / "s.engine", BuildOptions(max_batch=2), slots=2)
    dec = load_trt_streaming_decoder(engine, 2)  # includes the self-check
    s = dec.acquire()
    pcm = np.concatenate([dec.decode([s], codes[None, t : t + 8])[0] for t in range(0, 300, 8)])
    rms = float(np.sqrt(np.mean(offline**2)))
    assert np.abs(pcm - offline).max() < 2e-2 * rms  # TF32 products
    dec.close()
