"""The engine's decode path on the real codec architecture (demo model, ``--codec real``).

With ``decoder_streaming.onnx`` beside ``decoder.onnx`` the decode thread keeps one decoder
slot per stream and decodes only new frames: the audio equals the offline decode of the
stream's codes, streams give the same audio alone or batched, and a cancelled stream's slot
is freed. ``codec_streaming: off`` (or no streaming graph) keeps the windowed path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from conftest import demo_dir_for

from streamtts import Engine
from streamtts.config import SamplingParams
from streamtts.errors import CodecError, ConfigError, ModelFileError
from streamtts.request import StreamOptions

TEXT = "Hello there, this is a streaming test."
CODEC = "MOSS-Audio-Tokenizer-ONNX"


def make_engine(root: Path, **kw: Any) -> Engine:
    kw.setdefault("n_threads", 1)
    kw.setdefault("max_streams", 4)
    return Engine.from_config(root / "config.yaml", **kw)


async def collect(engine: Engine, seed: int, frames: int = 30) -> tuple[np.ndarray, np.ndarray]:
    opts = StreamOptions(seed=seed, fixed_frames=frames, sampling=SamplingParams.greedy())
    pcm, codes = [], []
    async with engine.stream(TEXT, options=opts) as s:
        async for c in s:
            pcm.append(c.pcm)
            codes.append(c.codes)
    return np.concatenate(pcm), np.concatenate(codes)


def offline_decode(root: Path, codes: np.ndarray) -> np.ndarray:
    """The offline graph straight on ONNX Runtime, n_quantizers = the codes' n_vq."""
    sess = ort.InferenceSession(str(root / CODEC / "decoder.onnx"), providers=["CPUExecutionProvider"])
    a, b = (i.name for i in sess.get_inputs())
    nq = np.array(codes.shape[1], np.int64)
    out = sess.run(None, {a: codes.T[:, None, :].astype(np.int64), b: nq})[0]
    return np.asarray(out[0, 0])


@pytest.mark.parametrize("n_vq", [32, 16])
def test_engine_streams_exactly_the_offline_decode(request: pytest.FixtureRequest, n_vq: int) -> None:
    root = demo_dir_for(request, n_vq, real_codec=True)

    async def main() -> tuple[Any, np.ndarray, np.ndarray]:
        async with make_engine(root) as engine:
            pcm, codes = await collect(engine, seed=1, frames=40)
            return engine.info, pcm, codes

    info, pcm, codes = asyncio.run(main())
    assert info["codec"] == "streaming" and info["codec_state_mib_per_stream"] > 0
    assert info["n_vq"] == n_vq
    assert codes.shape == (40, n_vq) and pcm.shape == (40 * 1920,)
    ref = offline_decode(root, codes)
    assert np.sqrt(np.mean(ref**2)) > 0.1  # the decoder makes signal, not silence
    from streamtts.engine.decoding import END_FADE_SAMPLES

    body = slice(0, pcm.shape[0] - END_FADE_SAMPLES)  # a finished stream fades its last 5 ms
    assert np.abs(pcm[body] - ref[body]).max() < 1e-3  # chunks 1, 2, 4, 8, ... through the decode thread
    assert pcm[-1] == 0.0


def test_streams_alone_or_batched_give_the_same_audio(real_codec_model_dir: Path) -> None:
    seeds = [3, 4, 5, 6]

    async def alone() -> list[np.ndarray]:
        async with make_engine(real_codec_model_dir, max_streams=1) as engine:
            return [(await collect(engine, s))[0] for s in seeds]

    async def together() -> list[np.ndarray]:
        async with make_engine(real_codec_model_dir) as engine:
            res = await asyncio.gather(*(collect(engine, s) for s in seeds))
            return [r[0] for r in res]

    a, b = asyncio.run(alone()), asyncio.run(together())
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        assert np.abs(x - y).max() < 1e-5  # the codec's own float32 rounding only


def test_cancel_frees_the_streams_codec_slot(real_codec_model_dir: Path) -> None:
    async def main() -> tuple[int, list[int], int]:
        async with make_engine(real_codec_model_dir, max_streams=2) as engine:
            codec = engine._decoder.codec
            s = engine.stream(TEXT, options=StreamOptions(seed=2, fixed_frames=200))
            async for _ in s:
                break  # first chunk: the stream holds a decoder slot now
            during = codec.active
            await s.aclose()
            t0 = time.monotonic()
            while codec.decoder.active_slots and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.02)
            after = codec.decoder.active_slots
            # the freed slot serves new streams: more streams than slots, one after another
            for seed in range(3):
                await collect(engine, seed, frames=5)
            return during, after, codec.active  # released before each consumer saw its end

    during, after, final = asyncio.run(main())
    assert during == 1
    assert after == [] and final == 0


def test_codec_streaming_off_keeps_the_windowed_path(real_codec_model_dir: Path) -> None:
    async def main() -> Any:
        async with make_engine(real_codec_model_dir, codec_streaming="off") as engine:
            pcm, codes = await collect(engine, seed=1, frames=10)
            return engine.info, pcm, codes

    info, pcm, codes = asyncio.run(main())
    assert info["codec"] == "windowed"
    # 10 frames fit one window: the windowed decode is the offline one here (but the end fade)
    ref = offline_decode(real_codec_model_dir, codes)
    assert np.abs(pcm[:-120] - ref[:-120]).max() < 1e-3


def _stale_copy(src: Path, dst: Path) -> Path:
    """A copy of the model whose codec checkpoint changed after the streaming graph was built."""
    import shutil

    shutil.copytree(src, dst)
    ckpt = dst / "MOSS-Audio-Tokenizer"
    st = ckpt / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[-4:] = b"\x00\x00\x80\x3f"  # the last float is now 1.0
    st.write_bytes(bytes(data))
    # the graph records where its weights were: point it at this copy's checkpoint
    import onnx

    g = dst / CODEC / "decoder_streaming.onnx"
    model = onnx.load(str(g))
    for p in model.metadata_props:
        if p.key == "streamtts.codec.weights_dir":
            p.value = str(ckpt.resolve())
    onnx.save(model, str(g))
    return dst


def test_a_stale_streaming_graph_found_beside_the_decoder_is_passed_over(
    real_codec_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _stale_copy(real_codec_model_dir, tmp_path / "m")

    async def main() -> Any:
        async with make_engine(root) as engine:
            return engine.info

    with caplog.at_level(logging.WARNING, logger="streamtts.codec"):
        info = asyncio.run(main())
    assert info["codec"] == "windowed"
    assert "stale" in caplog.text and "codec build" in caplog.text


def test_a_stale_streaming_graph_named_in_the_config_is_an_error(
    real_codec_model_dir: Path, tmp_path: Path
) -> None:
    root = _stale_copy(real_codec_model_dir, tmp_path / "m")
    graph = root / CODEC / "decoder_streaming.onnx"

    async def main() -> None:
        async with make_engine(root, codec_streaming=str(graph)):
            pass

    with pytest.raises(ModelFileError, match="stale.*rebuild it: streamtts codec build"):
        asyncio.run(main())


def test_a_missing_streaming_graph_named_in_the_config_is_an_error(real_codec_model_dir: Path) -> None:
    async def main() -> None:
        async with make_engine(real_codec_model_dir, codec_streaming="/nonexistent/dec.onnx"):
            pass

    with pytest.raises(ModelFileError, match="codec_streaming"):
        asyncio.run(main())


def test_demo_marker_records_the_codec(real_codec_model_dir: Path) -> None:
    marker = json.loads((real_codec_model_dir / "streamtts-demo.json").read_text())
    assert marker["codec"] == "real"
    assert (real_codec_model_dir / CODEC / "decoder_streaming.onnx").is_file()


def test_beside_a_gpu_codec_the_streaming_graph_asks_for_the_gpu(
    real_codec_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The streaming graph runs where the stateless decoder would: with use_gpu_audio and
    ONNX Runtime's CUDA provider, on the GPU (its state tables on the device). Here there is
    no GPU: the provider check alone says yes, so loading on CUDA fails for real, and a graph
    merely found is passed over with a warning naming what to install (windows instead)
    while one the config names is an error. Without the provider: the CPU, found and used.
    With audio_backend trt the ONNX graph is not used (tests/codec/test_trt_streaming.py: its engine)."""
    import msgspec

    from streamtts.codec import load_streaming_decoder, onnx_cuda
    from streamtts.config import load_config

    cfg = msgspec.structs.replace(load_config(real_codec_model_dir / "config.yaml"), use_gpu_audio=True)
    monkeypatch.setattr(onnx_cuda, "cuda_provider_available", lambda: True)  # no GPU here: the check alone
    with caplog.at_level(logging.INFO, logger="streamtts.codec"):
        assert load_streaming_decoder(cfg, 1) is None
    assert "needs ONNX Runtime's CUDA provider: pip install onnxruntime-gpu" in caplog.text
    named = msgspec.structs.replace(cfg, codec_streaming=str(real_codec_model_dir / CODEC / "decoder_streaming.onnx"))
    with pytest.raises(CodecError, match="CUDA provider"):
        load_streaming_decoder(named, 1)
    monkeypatch.setattr(onnx_cuda, "cuda_provider_available", lambda: False)  # CPU codec: found and used
    dec = load_streaming_decoder(cfg, 1)
    assert dec is not None and dec.device == "cpu"
    trt = msgspec.structs.replace(cfg, audio_backend="trt")
    assert load_streaming_decoder(trt, 1) is None  # no engine of it beside the TensorRT decoder
    with pytest.raises(ConfigError, match="goes with audio_backend 'trt'"):
        load_streaming_decoder(msgspec.structs.replace(named, audio_backend="trt"), 1)


def test_a_streaming_graph_for_another_n_vq_is_passed_over_or_refused(
    real_codec_model_dir: Path, real_codec_16_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The streaming graph has no n_quantizers: one built for 32 levels cannot decode a
    16-codebook model's codes. Found beside the decoder it is passed over (windows, with the
    model's offline decoder); named in the config it is an error saying how to rebuild."""
    import msgspec

    from streamtts.codec import load_decoder, load_streaming_decoder
    from streamtts.config import load_config

    cfg16 = load_config(real_codec_16_model_dir / "config.yaml")
    graph32 = real_codec_model_dir / CODEC / "decoder_streaming.onnx"
    with pytest.raises(ModelFileError, match=r"built for 32: rebuild it with `streamtts codec build --n-vq 16`"):
        load_streaming_decoder(msgspec.structs.replace(cfg16, codec_streaming=str(graph32)), 1)
    # the 32-level model's own config, told the model has 16 codebooks: found, passed over
    cfg32 = load_config(real_codec_model_dir / "config.yaml")
    with caplog.at_level(logging.WARNING, logger="streamtts.codec"):
        assert load_streaming_decoder(cfg32, 1, n_vq=16) is None
    assert "built for 32" in caplog.text
    dec = load_streaming_decoder(cfg16, 1)  # the model's n_vq from its config.json
    assert dec is not None and dec.n_vq == 16
    # the 32-level offline graph decodes 16 codebooks (n_quantizers = 16: the first 16 levels)
    # exactly as the 16-level one built from the same checkpoint
    codes = np.random.default_rng(0).integers(0, 1024, size=(1, 5, 16), dtype=np.int64)
    a = load_decoder(cfg32, n_vq=16).decode(codes)
    b = load_decoder(cfg16).decode(codes)
    assert np.abs(a - b).max() < 1e-5 and np.sqrt(np.mean(b**2)) > 0.01
