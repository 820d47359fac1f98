"""The torch-free codec decoder builder and the exact streaming decoder (streamtts.codec).

The fixture (tests/fixtures/codec) is the real MOSS-Audio-Tokenizer architecture at small
width with random weights, exported by the official code: its ``offline.npy`` is the
official offline decode of ``codes.npy`` (300 frames, longer than every stage's window),
its ``decoder.onnx`` the official ONNX decoder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file, save_file

from streamtts.cli.codec import main as codec_main
from streamtts.codec.build.arch import load_arch, parse_arch
from streamtts.codec.build.decoders import build_decoders
from streamtts.codec.build.random_ckpt import write_random_checkpoint
from streamtts.codec.stamp import KEY_BUILDER
from streamtts.codec.streaming import StreamingDecoder
from streamtts.errors import CodecError, ModelFileError

FIX = Path(__file__).parents[1] / "fixtures" / "codec"
FRAME = 1920
EXACT = 1e-3  # streaming vs offline (the signal's RMS is 2.3, its peak 25)


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _copy_weights(dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIX / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(weights folder, decoder_streaming.onnx, our offline decoder.onnx)."""
    d = _copy_weights(tmp_path_factory.mktemp("codec") / "weights")
    r = build_decoders(d, offline_out=d / "decoder_offline.onnx")
    assert r.streaming == d / "decoder_streaming.onnx" and r.offline is not None
    return d, r.streaming, r.offline


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    """(300, 32) int64: one stream."""
    return np.ascontiguousarray(np.load(FIX / "codes.npy")[:, 0, :].T)


@pytest.fixture(scope="module")
def offline() -> np.ndarray:
    return np.load(FIX / "offline.npy").reshape(-1)


@pytest.fixture(scope="module")
def official() -> Callable[[np.ndarray], np.ndarray]:
    """The official decoder.onnx: (T, 32) codes -> (T*1920,) samples."""
    sess = _session(FIX / "decoder.onnx")

    def run(c: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(c.T[:, None, :]).astype(np.int64)
        out: np.ndarray = sess.run(None, {"audio_codes": x, "n_quantizers": np.array(32)})[0]
        return out.reshape(-1)

    return run


@pytest.fixture()
def decoder(built: tuple[Path, Path, Path]) -> StreamingDecoder:
    return StreamingDecoder(built[1], n_slots=4, weights=built[0], threads=1)


def _chunks(pattern: list[int] | str, total: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while sum(out) < total:
        if pattern == "random":
            n = int(rng.integers(1, 24))
        else:
            assert isinstance(pattern, list)
            n = pattern[min(len(out), len(pattern) - 1)]
        out.append(min(n, total - sum(out)))
    return out


def _stream(dec: StreamingDecoder, slot: int, codes: np.ndarray, chunks: list[int]) -> np.ndarray:
    parts, t = [], 0
    for n in chunks:
        parts.append(dec.decode([slot], codes[None, t : t + n])[0])
        t += n
    return np.concatenate(parts)


# -- exactness ----------------------------------------------------------------------------


def test_offline_graph_matches_official_decoder(
    built: tuple[Path, Path, Path], codes: np.ndarray, offline: np.ndarray
) -> None:
    ours, theirs = _session(built[2]), _session(FIX / "decoder.onnx")
    two = np.stack([codes.T, (codes.T * 7 + 3) % 1024], axis=1)  # (32, 2, 300)
    for nq in (32, 8):
        feed = {"audio_codes": two, "n_quantizers": np.array(nq, dtype=np.int64)}
        a, a_len = ours.run(None, feed)
        b = theirs.run(None, feed)[0]
        assert a.shape == (2, 1, 300 * FRAME) and a.dtype == np.float32
        assert a_len.tolist() == [300 * FRAME] * 2
        assert np.abs(a - b).max() < 1e-4, nq
    assert (
        np.abs(
            ours.run(None, {"audio_codes": codes.T[:, None], "n_quantizers": np.array(32)})[
                0
            ].reshape(-1)
            - offline
        ).max()
        < 1e-4
    )


def test_offline_graph_loads_in_the_stateless_backend(
    built: tuple[Path, Path, Path], codes: np.ndarray, offline: np.ndarray
) -> None:
    from streamtts.codec.onnx import OnnxDecoder

    pcm = OnnxDecoder(built[2], threads=1).decode(codes[None])
    assert pcm.shape == (1, 300 * FRAME) and np.abs(pcm[0] - offline).max() < 1e-4


@pytest.mark.parametrize(
    "pattern",
    [[1, 2, 4, 8], [1], [16], [200], "random"],
    ids=["1-2-4-8", "1s", "16s", "200s", "random"],
)
def test_streaming_equals_offline_one_stream(
    decoder: StreamingDecoder, codes: np.ndarray, offline: np.ndarray, pattern: list[int] | str
) -> None:
    slot = decoder.acquire()
    pcm = _stream(decoder, slot, codes, _chunks(pattern, 300))
    assert pcm.shape == offline.shape and pcm.dtype == np.float32
    err = float(np.abs(pcm - offline).max())
    assert err < EXACT, err
    assert decoder.position(slot) == 300


def test_four_streams_at_different_positions(
    decoder: StreamingDecoder,
    codes: np.ndarray,
    offline: np.ndarray,
    official: Callable[[np.ndarray], np.ndarray],
) -> None:
    """Staggered starts, a chunking per stream, one call for all: rows at different positions
    and with different frame counts (lengths), slots not in row order."""
    other = np.ascontiguousarray(codes[::-1])
    streams = [codes, other, (codes * 7 + 3) % 1024, codes]
    refs = [offline, official(other), official(streams[2]), offline]
    plans = [
        _chunks([1, 2, 4, 8], 300),
        _chunks("random", 300, seed=1),
        _chunks([16], 300),
        _chunks([3], 300),
    ]
    starts = [0, 5, 11, 40]  # call index at which each stream starts
    slots = [decoder.acquire() for _ in range(4)][::-1]
    done = [0] * 4
    steps = [0] * 4
    out: list[list[np.ndarray]] = [[] for _ in range(4)]
    call = 0
    while any(d < 300 for d in done):
        rows = [i for i in range(4) if call >= starts[i] and done[i] < 300]
        call += 1
        if not rows:
            continue
        lens = [plans[i][steps[i]] for i in rows]
        t = max(lens)
        batch = np.zeros((len(rows), t, 32), dtype=np.int64)
        for r, (i, n) in enumerate(zip(rows, lens, strict=True)):
            batch[r, :n] = streams[i][done[i] : done[i] + n]
        pcm = decoder.decode([slots[i] for i in rows], batch, lengths=lens)
        assert pcm.shape == (len(rows), t * FRAME)
        for r, (i, n) in enumerate(zip(rows, lens, strict=True)):
            out[i].append(pcm[r, : n * FRAME])
            assert not pcm[r, n * FRAME :].any()  # padding frames come back as zeros
            done[i] += n
            steps[i] += 1
    for i in range(4):
        err = float(np.abs(np.concatenate(out[i]) - refs[i]).max())
        assert err < EXACT, (i, err)


def test_release_and_reuse_a_slot(
    decoder: StreamingDecoder,
    codes: np.ndarray,
    offline: np.ndarray,
    official: Callable[[np.ndarray], np.ndarray],
) -> None:
    other = (codes * 7 + 3) % 1024
    a = decoder.acquire()
    _stream(decoder, a, other, _chunks([8], 170))  # stream A: 170 frames, then it ends
    decoder.release(a)
    assert a not in decoder.active_slots
    with pytest.raises(CodecError, match=f"slot {a} has no stream"):
        decoder.decode([a], codes[None, :1])
    b = decoder.acquire()
    assert b == a and decoder.position(b) == 0
    pcm = _stream(decoder, b, codes, _chunks([4], 300))  # stream B in A's slot
    assert np.abs(pcm - offline).max() < EXACT
    idle = decoder.decode([b], codes[None, :3], lengths=[0])  # a row with no frames this call
    assert idle.shape == (1, 3 * FRAME) and not idle.any() and decoder.position(b) == 300
    decoder.reset(b)  # restart in place
    again = _stream(decoder, b, other, _chunks([5], 60))
    assert np.abs(again - official(other[:60])).max() < EXACT


def test_state_size_and_layout(decoder: StreamingDecoder) -> None:
    arch = load_arch(FIX / "config.json")
    assert [s.context for s in decoder.stages] == [125, 250, 500, 1000]
    assert [s.tokens_per_frame for s in decoder.stages] == [1, 2, 4, 8]
    want = sum(4 * s.num_layers * 2 * s.d_model * s.context for s in arch.stages)
    assert decoder.state_bytes_per_slot == want


def test_published_config_is_parsed() -> None:
    arch = load_arch(FIX / "published-config.json")
    st = arch.stages
    assert [s.context for s in st] == [125, 250, 500, 1000]
    assert [s.tokens_per_frame for s in st] == [1, 2, 4, 8]
    assert [(s.d_model, s.num_heads, s.num_layers, s.ffn_dim) for s in st] == [
        (1280, 20, 32, 5120), (768, 12, 12, 3072), (768, 12, 12, 3072), (768, 12, 12, 3072),
    ]  # fmt: skip
    assert [(s.has_input_proj, s.has_output_proj) for s in st] == [
        (True, False), (True, False), (True, False), (True, True),
    ]  # fmt: skip
    assert 0.85e9 < arch.params < 0.95e9


# -- bad input ----------------------------------------------------------------------------


def _edited_checkpoint(tmp: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> Path:
    d = _copy_weights(tmp / "edited")
    tensors = load_file(str(d / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(d / "model.safetensors"))
    return d


def test_missing_tensor(tmp_path: Path) -> None:
    name = "decoder.4.transformer.layers.0.linear1.weight"
    d = _edited_checkpoint(tmp_path, lambda t: t.pop(name))
    with pytest.raises(ModelFileError, match="absent") as e:
        build_decoders(d)
    assert name in str(e.value) and "model.safetensors" in str(e.value)
    assert not (d / "decoder_streaming.onnx").exists()


def test_misnamed_tensor(tmp_path: Path) -> None:
    name = "decoder.0.transformer.layers.1.self_attn.out_projs.0.weight"
    wrong = "decoder.0.transformer.layers.1.self_attn.out_project.0.weight"
    d = _edited_checkpoint(tmp_path, lambda t: t.__setitem__(wrong, t.pop(name)))
    with pytest.raises(ModelFileError) as e:
        build_decoders(d)
    assert name in str(e.value) and wrong in str(e.value)  # expected name, and the near miss


def test_wrong_shape(tmp_path: Path) -> None:
    name = "decoder.6.output_proj.weight"
    d = _edited_checkpoint(tmp_path, lambda t: t.__setitem__(name, np.zeros((239, 32), np.float32)))
    with pytest.raises(ModelFileError, match=r"\(240, 32\).*it is \(239, 32\)") as e:
        build_decoders(d)
    assert name in str(e.value)


def test_old_weight_norm_names_build_the_same(
    tmp_path: Path, built: tuple[Path, Path, Path]
) -> None:
    def rename(t: dict[str, np.ndarray]) -> None:
        for k in [k for k in t if ".parametrizations.weight.original" in k]:
            suffix = "weight_g" if k.endswith("original0") else "weight_v"
            t[
                k.replace("parametrizations.weight.original0", suffix).replace(
                    "parametrizations.weight.original1", suffix
                )
            ] = t.pop(k)

    d = _edited_checkpoint(tmp_path, rename)
    r = build_decoders(d, streaming=False, offline_out=d / "off.onnx")
    assert r.offline is not None
    c = np.load(FIX / "codes.npy")[:, :, :40]
    feed = {"audio_codes": c, "n_quantizers": np.array(32)}
    a = _session(r.offline).run(None, feed)[0]
    b = _session(built[2]).run(None, feed)[0]
    assert np.array_equal(a, b)


def test_config_of_another_architecture(tmp_path: Path) -> None:
    d = _copy_weights(tmp_path / "qwen")
    (d / "config.json").write_text(
        json.dumps(
            {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64}
        )
    )
    with pytest.raises(ModelFileError, match="MOSS-Audio-Tokenizer config.json") as e:
        build_decoders(d)
    assert "config.json" in str(e.value) and "Qwen3ForCausalLM" in str(e.value)

    cfg = json.loads((FIX / "config.json").read_text())
    cfg["decoder_kwargs"][2]["norm"] = "rms_norm"
    with pytest.raises(ModelFileError, match=r"decoder_kwargs\[2\]\.norm is 'rms_norm'"):
        parse_arch(cfg, "x/config.json")
    cfg = json.loads((FIX / "config.json").read_text())
    cfg["quantizer_kwargs"]["quantizer_type"] = "rvq"
    with pytest.raises(ModelFileError, match="quantizer_type is 'rvq'"):
        parse_arch(cfg)
    cfg = json.loads((FIX / "config.json").read_text())
    cfg["decoder_kwargs"][4]["input_dimension"] = 32
    with pytest.raises(ModelFileError, match=r"input_dimension is 32, but 16 channels"):
        parse_arch(cfg)
    with pytest.raises(ModelFileError, match="file not found"):
        load_arch(tmp_path / "nowhere")


def test_stale_streaming_decoder_is_refused(tmp_path: Path) -> None:
    d = _copy_weights(tmp_path / "w")
    r = build_decoders(d)
    assert r.streaming is not None
    StreamingDecoder(r.streaming, n_slots=1, weights=d)  # fresh: fine
    name = "decoder.0.transformer.layers.0.linear2.weight"
    tensors = load_file(str(d / "model.safetensors"))
    tensors[name] = tensors[name] * np.float32(1.01)  # new weights, same names and shapes
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ModelFileError, match="stale: built from other weights") as e:
        StreamingDecoder(r.streaming, n_slots=1, weights=d)
    assert str(r.streaming) in str(e.value) and "streamtts codec build --weights" in str(e.value)
    StreamingDecoder(r.streaming, n_slots=1)  # without weights to compare with: loads


def test_foreign_or_old_models_are_refused(tmp_path: Path, built: tuple[Path, Path, Path]) -> None:
    with pytest.raises(ModelFileError, match="no streamtts build metadata"):
        StreamingDecoder(FIX / "decoder.onnx")
    with pytest.raises(ModelFileError, match="offline graph, not the streaming one"):
        StreamingDecoder(built[2])
    m = onnx.load(str(built[1]))
    for p in m.metadata_props:
        if p.key == KEY_BUILDER:
            p.value = "0"
    old = tmp_path / "old.onnx"
    onnx.save(m, str(old))
    with pytest.raises(ModelFileError, match="builder version 0"):
        StreamingDecoder(old)
    with pytest.raises(ModelFileError, match="file not found"):
        StreamingDecoder(tmp_path / "missing.onnx")


def test_bad_codes_and_slots(decoder: StreamingDecoder, codes: np.ndarray) -> None:
    s = decoder.acquire()
    bad = codes[None, :4].copy()
    bad[0, 2, 5] = 1024
    with pytest.raises(
        CodecError,
        match=r"code 1024 at item 0, frame 2, codebook 5 is outside \[0, 1024\).*pad code",
    ):
        decoder.decode([s], bad)
    bad[0, 2, 5] = -1
    with pytest.raises(CodecError, match=r"outside \[0, 1024\)"):
        decoder.decode([s], bad)
    assert decoder.position(s) == 0  # nothing was decoded
    with pytest.raises(CodecError, match=r"shape \(B, T, 32\)"):
        decoder.decode([s], codes[None, :4, :16])
    t = decoder.acquire()
    with pytest.raises(CodecError, match="repeat a slot"):
        decoder.decode([s, s], np.stack([codes[:2], codes[:2]]))
    with pytest.raises(CodecError, match="not all in 0..3"):
        decoder.decode([s, 9], np.stack([codes[:2], codes[:2]]))
    with pytest.raises(CodecError, match=r"lengths \[3, 1\] are not all in 0..2"):
        decoder.decode([s, t], np.stack([codes[:2], codes[:2]]), lengths=[3, 1])
    with pytest.raises(CodecError, match="2 integers"):
        decoder.decode([s], np.stack([codes[:2], codes[:2]]))
    for _ in range(2):
        decoder.acquire()
    with pytest.raises(CodecError, match="all 4 codec stream slots are in use"):
        decoder.acquire()


# -- CLI, float16, random checkpoints -----------------------------------------------------


def test_cli_build_and_decode(
    tmp_path: Path, offline: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _copy_weights(tmp_path / "w")
    out = tmp_path / "dec" / "stream.onnx"
    assert codec_main(["build", "--weights", str(d), "--out", str(out)]) == 0
    assert "state per stream slot: 0.6 MB" in capsys.readouterr().out
    pcm = tmp_path / "pcm.npy"
    rc = codec_main(
        ["decode", "--decoder", str(out), "--codes", str(FIX / "codes.npy"), "--chunks", "1,2,4,8",
         "--out", str(pcm), "--weights", str(d)]
    )  # fmt: skip
    assert rc == 0
    got = np.load(pcm)
    assert got.shape == (1, 300 * FRAME) and np.abs(got[0] - offline).max() < EXACT
    assert (
        codec_main(
            [
                "decode",
                "--decoder",
                str(out),
                "--codes",
                str(FIX / "codes.npy"),
                "--chunks",
                "0",
                "--out",
                str(pcm),
            ]
        )
        == 2
    )
    assert "positive frame counts" in capsys.readouterr().err


def test_a_16_level_build_decodes_as_the_official_decoder_at_n_quantizers_16(
    tmp_path: Path, codes: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 16-codebook model decodes with the codec's first 16 levels: ``codec build --n-vq 16``
    writes both graphs for (16, B, T) codes; they equal the official decoder.onnx at
    n_quantizers = 16 (streamed in any chunks, too), and so does the official 32-level file
    given the 16 codebooks (the runtime pads the levels it does not use)."""
    from streamtts.codec.onnx import OnnxDecoder

    d = _copy_weights(tmp_path / "w")
    out, off = tmp_path / "dec" / "stream16.onnx", tmp_path / "dec" / "offline16.onnx"
    rc = codec_main(["build", "--weights", str(d), "--out", str(out), "--offline-out", str(off), "--n-vq", "16"])
    assert rc == 0 and "16 codebooks" in capsys.readouterr().out
    x = np.ascontiguousarray(codes.T[:, None, :])  # (32, 1, 300): levels 16.. must not matter
    ref = _session(FIX / "decoder.onnx").run(None, {"audio_codes": x, "n_quantizers": np.array(16)})[0]
    ref = ref.reshape(-1)
    c16 = codes[:, :16]
    for path in (off, FIX / "decoder.onnx"):
        assert np.abs(OnnxDecoder(path, threads=1, n_vq=16).decode(c16[None])[0] - ref).max() < 1e-4
    dec = StreamingDecoder(out, n_slots=1, weights=d, threads=1)
    assert dec.n_vq == 16 and _session(out).get_inputs()[0].shape[0] == 16
    pcm = _stream(dec, dec.acquire(), c16, _chunks([1, 2, 4, 8], 300))
    assert np.abs(pcm - ref).max() < EXACT
    with pytest.raises(CodecError, match=r"shape \(B, T, 16\)"):
        dec.decode([0], codes[None, :2])
    np.save(tmp_path / "c16.npy", c16)  # (T, 16): `codec decode` reads the decoder's n_vq
    pcm_path = tmp_path / "pcm.npy"
    rc = codec_main(["decode", "--decoder", str(out), "--codes", str(tmp_path / "c16.npy"), "--out", str(pcm_path)])
    assert rc == 0 and np.abs(np.load(pcm_path) - ref).max() < EXACT
    assert codec_main(["build", "--weights", str(d), "--out", str(out), "--n-vq", "33"]) == 2
    assert "n_vq 33 is not one of 1..32" in capsys.readouterr().err


def test_float16_weights(tmp_path: Path, codes: np.ndarray, offline: np.ndarray) -> None:
    d = _copy_weights(tmp_path / "w")
    r = build_decoders(d, dtype="float16")
    assert r.streaming is not None
    f32 = (FIX / "model.safetensors").stat().st_size
    assert r.streaming.stat().st_size < 0.7 * f32  # the matrices are stored in half
    dec = StreamingDecoder(r.streaming, n_slots=1)
    pcm = _stream(dec, dec.acquire(), codes, _chunks([8], 300))
    err = float(np.abs(pcm - offline).max())
    assert 1e-4 < err < 0.2, err  # the weights are rounded; the arithmetic stays float32


def test_random_checkpoint_builds_and_streams_exactly(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "config.json").read_text())
    write_random_checkpoint(tmp_path / "rnd", cfg, seed=3)
    r = build_decoders(tmp_path / "rnd", offline_out=tmp_path / "rnd" / "off.onnx", external=True)
    assert r.streaming is not None and r.offline is not None
    assert list(
        (tmp_path / "rnd").glob("decoder_streaming.onnx.*.data")
    )  # weights beside the model
    c = np.random.default_rng(0).integers(0, 1024, size=(60, 32))
    ref = _session(r.offline).run(
        None, {"audio_codes": c.T[:, None], "n_quantizers": np.array(32)}
    )[0]
    dec = StreamingDecoder(r.streaming, n_slots=1, weights=tmp_path / "rnd")
    pcm = _stream(dec, dec.acquire(), c, _chunks([7], 60))
    assert np.abs(pcm - ref.reshape(-1)).max() < EXACT
    # a rebuild replaces the model and removes the old data file
    build_decoders(tmp_path / "rnd", external=True)
    assert len(list((tmp_path / "rnd").glob("decoder_streaming.onnx.*.data"))) == 1


# -- the state on the device: in place, through I/O binding --------------------------------


def test_rings_are_updated_in_place_and_long_calls_split(
    decoder: StreamingDecoder, codes: np.ndarray, offline: np.ndarray
) -> None:
    """The graph writes the new keys into the bound table itself (no host scatter, no copy
    of the table): the tables are the very arrays bound at load, and they fill up. A call
    longer than the smallest ring (125 frames here) is split so no entry is written twice."""
    tables = [t.ctypes.data for t in decoder._host]
    slot = decoder.acquire()
    assert not decoder.ring(0, slot).any()
    assert decoder.max_chunk == 125
    pcm = decoder.decode([slot], codes[None])[0]  # 300 frames: 3 graph calls
    assert np.abs(pcm - offline).max() < EXACT
    assert [t.ctypes.data for t in decoder._host] == tables
    assert all(decoder.ring(s, slot).any() for s in range(len(decoder.stages)))
    decoder.release(slot)
    assert not decoder.ring(0, slot).any()  # zeroed on the CPU


def test_self_check_passes_here_and_catches_a_broken_update(decoder: StreamingDecoder) -> None:
    """The load-time check a GPU runs (chunked = whole) on this CPU, and what it reports
    when the state is not updated (here: the tables are re-zeroed after every call)."""
    assert decoder.self_check() < 1e-5
    assert decoder.active_slots == []
    real = decoder._decode_part

    def forgetful(*a: Any) -> np.ndarray:
        out = real(*a)
        for t in decoder._host:
            t[...] = 0.0
        return out

    decoder._decode_part = forgetful  # type: ignore[method-assign]
    with pytest.raises(CodecError, match="self-check failed on cpu"):
        decoder.self_check()
    assert decoder.active_slots == []


@pytest.mark.gpu
@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="needs onnxruntime-gpu with CUDA",
)
def test_on_cuda_the_state_stays_on_the_device_and_streaming_equals_offline(
    built: tuple[Path, Path, Path], codes: np.ndarray, offline: np.ndarray
) -> None:
    dec = StreamingDecoder(built[1], n_slots=2, weights=built[0], device="cuda")
    assert dec.self_check() < 1e-2
    assert all(t.device_name() == "cuda" for t in dec._tables) and not dec._host
    slot = dec.acquire()
    pcm = _stream(dec, slot, codes, _chunks([1, 2, 4, 8], 300))
    # loose: the GPU may use TF32 matrix products; a state not kept would be off by O(RMS)
    assert np.abs(pcm - offline).max() < 2e-2 * float(np.sqrt(np.mean(offline**2)))
