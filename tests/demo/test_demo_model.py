"""The synthetic demo model: official layout, formats, tokenizer ids, config, behaviour."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from streamtts.config import load_config
from streamtts.core.tokens import KEYS, TokenIds, load_token_ids
from streamtts.demo import model as demo
from streamtts.demo.numpy_forward import Qwen3NumpyForward
from streamtts.demo.tokenizer import AUDIO_TOKEN_NAMES, build_tokenizer

IDS = TokenIds()
GG = "MOSS-TTS-GGUF"
H_TINY = demo.PRESETS["tiny"].n_embd

OFFICIAL_YAML_KEYS = {
    "backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir", "audio_backend",
    "audio_encoder_onnx", "audio_decoder_onnx", "audio_encoder_trt", "audio_decoder_trt",
    "heads_backend", "n_ctx", "n_batch", "n_threads", "n_gpu_layers", "max_new_tokens",
    "use_gpu_audio", "low_memory", "kv_cache_type_k", "kv_cache_type_v", "flash_attn",
    "text_temperature", "text_top_p", "text_top_k", "audio_temperature", "audio_top_p",
    "audio_top_k", "audio_repetition_penalty",
}  # fmt: skip


# -- layout ---------------------------------------------------------------------------


def test_layout_and_npy_tables(demo_model_dir: Path) -> None:
    gg = demo_model_dir / GG
    assert (gg / "MOSS_TTS_Q4_K_M.gguf").is_file()
    assert (gg / "tokenizer" / "tokenizer.json").is_file()
    assert (gg / "tokenizer" / "tokenizer_config.json").is_file()
    assert (gg / "config.json").is_file()
    for name in ("encoder.onnx", "decoder.onnx"):
        assert (demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / name).is_file()
    tables = {
        gg / "embeddings" / "embed_tokens.npy": (demo.V_TEXT, H_TINY),
        gg / "lm_heads" / "lm_head_text.npy": (demo.V_TEXT, H_TINY),
    }
    for k in range(IDS.n_vq):
        tables[gg / "embeddings" / f"emb_ext_{k:02d}.npy"] = (IDS.audio_rows, H_TINY)
        tables[gg / "lm_heads" / f"lm_head_audio_{k:02d}.npy"] = (IDS.audio_rows, H_TINY)
    for path, shape in tables.items():
        a = np.load(path, mmap_mode="r")
        assert a.shape == shape, path
        assert a.dtype == np.float16, path
        assert np.all(np.isfinite(a)), path
    assert not list((gg / "embeddings").glob("emb_ext_32*"))
    assert not list((gg / "lm_heads").glob("lm_head_audio_32*"))


def test_gguf_is_plain_qwen3_with_text_head_as_output(demo_model_dir: Path) -> None:
    from gguf import GGUFReader

    r = GGUFReader(demo_model_dir / GG / "MOSS_TTS_Q4_K_M.gguf")

    def field(name: str) -> object:
        f = r.fields[name]
        return f.contents()

    assert field("general.architecture") == "qwen3"
    assert field("qwen3.vocab_size") == demo.V_TEXT
    assert field("qwen3.embedding_length") == H_TINY
    assert field("qwen3.block_count") == demo.PRESETS["tiny"].n_layer
    assert field("tokenizer.ggml.model") == "none"
    tensors = {t.name: t for t in r.tensors}
    out = np.asarray(tensors["output.weight"].data)
    head = np.load(demo_model_dir / GG / "lm_heads" / "lm_head_text.npy", mmap_mode="r")
    assert out.shape == head.shape
    assert out.dtype == np.float16
    assert np.array_equal(out, head)  # bit-identical: the GGUF output layer is the text head


def test_model_config_json_has_the_token_ids(demo_model_dir: Path) -> None:
    path = demo_model_dir / GG / "config.json"
    assert load_token_ids(path) == IDS
    data = json.loads(path.read_text())
    for key in KEYS:
        assert key in data, key


def test_config_yaml_official_keys_and_paths(demo_model_dir: Path) -> None:
    import yaml

    raw = yaml.safe_load((demo_model_dir / "config.yaml").read_text())
    assert set(raw) <= OFFICIAL_YAML_KEYS
    for key in ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir",
                "audio_encoder_onnx", "audio_decoder_onnx"):  # fmt: skip
        assert not Path(raw[key]).is_absolute(), key
    assert raw["audio_backend"] == "onnx" and raw["n_gpu_layers"] == 0
    cfg = load_config(demo_model_dir / "config.yaml")
    for key in ("backbone_gguf", "audio_encoder_onnx", "audio_decoder_onnx"):
        assert Path(getattr(cfg, key)).is_file(), key
    for key in ("embedding_dir", "lm_head_dir", "tokenizer_dir"):
        assert Path(getattr(cfg, key)).is_dir(), key
    assert Path(cfg.backbone_gguf).name == "MOSS_TTS_Q4_K_M.gguf"
    assert cfg.sampling.text_temperature == 1.5 and cfg.sampling.text_top_k == 50


def test_marker_records_what_was_written(demo_model_dir: Path) -> None:
    marker = json.loads((demo_model_dir / demo.MARKER).read_text())
    assert marker["version"] == demo.DEMO_MODEL_VERSION
    assert marker["preset"]["name"] == "tiny" and marker["seed"] == 0


# -- tokenizer ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir / GG / "tokenizer" / "tokenizer.json"))


def test_special_tokens_at_the_real_ids(tok: Tokenizer) -> None:
    assert tok.id_to_token(IDS.pad) == "<|endoftext|>"
    assert tok.id_to_token(IDS.im_start) == "<|im_start|>"
    assert tok.id_to_token(IDS.im_end) == "<|im_end|>"
    for tid in range(151643, 151669):
        assert tok.id_to_token(tid) is not None, tid
    assert tok.id_to_token(151669) is None
    assert tok.get_vocab_size() == 151669


def test_audio_tokens_have_non_standard_spellings(tok: Tokenizer) -> None:
    audio = {
        IDS.audio_start: "<|audio_start|>",
        IDS.audio_end: "<|audio_end|>",
        IDS.user_slot: "<|audio_user_slot|>",
        IDS.gen_slot: "<|audio_assistant_gen_slot|>",
        IDS.delay_slot: "<|audio_assistant_delay_slot|>",
    }
    for tid, conventional in audio.items():
        spelled = tok.id_to_token(tid)
        assert spelled == AUDIO_TOKEN_NAMES[tid]
        assert spelled != conventional
        assert tok.token_to_id(conventional) is None  # the conventional spelling is unknown


def test_specials_in_text_are_single_tokens(tok: Tokenizer) -> None:
    s = tok.id_to_token
    text = (
        f"{s(IDS.im_start)}user\nHello{s(IDS.audio_start)}{s(IDS.user_slot)}{s(IDS.user_slot)}"
        f"{s(IDS.audio_end)} world{s(IDS.im_end)}\n{s(IDS.gen_slot)}{s(IDS.delay_slot)}"
    )
    ids = tok.encode(text).ids
    assert ids[0] == IDS.im_start
    for tid in (IDS.audio_start, IDS.audio_end, IDS.im_end, IDS.gen_slot, IDS.delay_slot):
        assert ids.count(tid) == 1
    assert ids.count(IDS.user_slot) == 2
    i = ids.index(IDS.audio_start)
    assert ids[i : i + 4] == [IDS.audio_start, IDS.user_slot, IDS.user_slot, IDS.audio_end]
    assert all(t < 151643 or t in (IDS.im_start, IDS.im_end, IDS.audio_start, IDS.audio_end,
                                   IDS.user_slot, IDS.gen_slot, IDS.delay_slot) for t in ids)  # fmt: skip


def test_prompt_words_are_merged(tok: Tokenizer) -> None:
    enc = tok.encode(
        "- Reference(s):\nNone\n- Language:\nen\n- Text:\nHello world, this is the demo."
    )
    assert len(enc.ids) < 30  # not one token per byte
    assert all(i < 151643 for i in enc.ids)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_any_unicode_text_round_trips(text: str) -> None:
    import unicodedata

    t = _cached_tokenizer()
    ids = t.encode(text).ids
    assert all(0 <= i < 151669 for i in ids)
    assert t.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


_TOK: list[Tokenizer] = []


def _cached_tokenizer() -> Tokenizer:
    if not _TOK:
        _TOK.append(build_tokenizer())
    return _TOK[0]


def test_tokenizer_is_deterministic_and_fast() -> None:
    t0 = time.perf_counter()
    a = build_tokenizer().to_str()
    assert time.perf_counter() - t0 < 3.0
    assert build_tokenizer().to_str() == a


def test_tokenizer_config_lists_the_added_tokens(demo_model_dir: Path) -> None:
    cfg = json.loads((demo_model_dir / GG / "tokenizer" / "tokenizer_config.json").read_text())
    dec = cfg["added_tokens_decoder"]
    assert dec[str(IDS.audio_start)]["content"] == AUDIO_TOKEN_NAMES[IDS.audio_start]
    assert dec[str(IDS.im_end)]["content"] == "<|im_end|>"
    assert cfg["eos_token"] == "<|im_end|>"


# -- weights and behaviour shaping ----------------------------------------------------


@pytest.fixture(scope="module")
def weights() -> demo.DemoWeights:
    return demo.build_weights("tiny", seed=0)


def test_weights_are_deterministic_per_seed(
    weights: demo.DemoWeights, demo_model_dir: Path
) -> None:
    on_disk = np.load(demo_model_dir / GG / "embeddings" / "embed_tokens.npy", mmap_mode="r")
    assert np.array_equal(on_disk[:1000], weights.embed_tokens[:1000].astype(np.float16))
    other = demo.build_weights("tiny", seed=1)
    assert not np.array_equal(other.lm_head_audio[0], weights.lm_head_audio[0])


def test_reserved_dims(weights: demo.DemoWeights) -> None:
    p = weights.preset
    reserved = list(demo.RESERVED_DIMS)
    for i in range(p.n_layer):
        for name in ("attn_q", "attn_k", "ffn_gate", "ffn_up"):
            assert not weights.layers[f"blk.{i}.{name}.weight"][:, reserved].any()
        for name in ("attn_output", "ffn_down"):
            w = weights.layers[f"blk.{i}.{name}.weight"]
            assert not w[demo.DIM_CONST].any()
            assert np.count_nonzero(w[demo.DIM_COUNTER]) == (
                1 if (i, name) == (0, "attn_output") else 0
            )
    for t in weights.emb_ext + weights.lm_head_audio:
        assert not t[:, reserved].any()
    assert np.all(weights.embed_tokens[:, demo.DIM_CONST] == 1.0)
    assert weights.embed_tokens[IDS.gen_slot, demo.DIM_COUNT_IN] == 0.0
    assert weights.embed_tokens[IDS.delay_slot, demo.DIM_COUNT_IN] == 0.0


def _embed(w: demo.DemoWeights, row: list[int]) -> np.ndarray:
    x = w.embed_tokens[row[0]].copy()
    for k in range(IDS.n_vq):
        x += w.emb_ext[k][row[1 + k]]
    return x


def _numpy_forward(w: demo.DemoWeights) -> Qwen3NumpyForward:
    p = w.preset
    return Qwen3NumpyForward(w.layers, n_head=p.n_head, n_head_kv=p.n_head_kv, head_dim=p.head_dim)


def _greedy_audio_row(w: demo.DemoWeights, h: np.ndarray, text: int, n_codes: int) -> list[int]:
    codes = [
        int(np.argmax(w.lm_head_audio[k][:1024] @ h)) if k < n_codes else 1024
        for k in range(IDS.n_vq)
    ]
    return [text, *codes]


# A deeper model than tiny: the final residual's RMS grows with depth, which the head
# calibration (measure_final_rms) must absorb.
DEEP = demo.DemoPreset(name="deep", n_embd=64, n_layer=12, n_head=4, n_head_kv=2, head_dim=16, n_ff=256)
DEEP_B = demo.DemoBehaviour(init_scale=0.1)  # large layer outputs: final RMS ~3


@pytest.fixture(scope="module", params=["tiny", "deep"])
def any_weights(request: pytest.FixtureRequest, weights: demo.DemoWeights) -> demo.DemoWeights:
    return (
        weights if request.param == "tiny" else demo.build_weights(DEEP, seed=5, behaviour=DEEP_B)
    )


def test_greedy_speech_length_follows_the_prompt_and_im_end_follows(
    any_weights: demo.DemoWeights,
) -> None:
    """The counter makes the gen slot win while f > f*: greedy speech ~ ratio * prompt rows."""
    weights = any_weights
    text_rows = [
        IDS.im_start,
        *range(1000, 1040),
        IDS.im_end,
        IDS.im_start,
        *range(2000, 2005),
        IDS.audio_start,
    ]
    fwd = _numpy_forward(weights)
    pad = [1024] * IDS.n_vq
    h = fwd.forward(np.stack([_embed(weights, [t, *pad]) for t in text_rows]))[-1]
    P = len(text_rows)
    gen, delay = weights.lm_head_text[IDS.gen_slot], weights.lm_head_text[IDS.delay_slot]
    step = 0
    while float(gen @ h) > float(delay @ h):  # greedy: gen slot while it wins
        step += 1
        assert step < 200
        h = fwd.forward(
            _embed(weights, _greedy_audio_row(weights, h, IDS.gen_slot, min(step, IDS.n_vq)))
        )[0]
    expected = P * DEFAULT_RATIO
    assert abs(step - expected) <= 2, (step, expected)
    # After the forced delay slots and <|audio_end|>, <|im_end|> must lead every other token.
    for _ in range(IDS.n_vq):
        h = fwd.forward(_embed(weights, _greedy_audio_row(weights, h, IDS.delay_slot, IDS.n_vq)))[0]
    h = fwd.forward(_embed(weights, [IDS.audio_end, *pad]))[0]
    logits = weights.lm_head_text @ h
    allowed = np.ones(logits.shape, bool)
    allowed[[IDS.pad, IDS.gen_slot, IDS.delay_slot, IDS.audio_end]] = False
    top = np.argsort(-np.where(allowed, logits, -np.inf))[:2]
    assert top[0] == IDS.im_end
    assert logits[top[0]] - logits[top[1]] > 12.0  # wins under sampling at temperature 1.5


DEFAULT_RATIO = demo.DemoBehaviour().speech_ratio


def test_deep_model_needed_calibration() -> None:
    assert (
        demo.build_weights(DEEP, seed=5, behaviour=DEEP_B).final_rms > 2.0
    )  # the test above means something


def test_numpy_forward_matches_llama_cpp(
    bridge_lib: object, demo_model_dir: Path, weights: demo.DemoWeights
) -> None:
    """The NumPy forward used for calibration computes what llama.cpp computes."""
    from streamtts.model.backbone import Backbone, BackboneParams

    rng = np.random.default_rng(0)
    rows = [
        [int(t)] + rng.integers(0, 1025, IDS.n_vq).tolist() for t in rng.integers(0, 151000, 12)
    ]
    emb = np.stack([_embed(weights, r) for r in rows]).astype(np.float32)
    expected = _numpy_forward(weights).forward(emb)
    bb = Backbone(BackboneParams(model_path=str(demo_model_dir / GG / "MOSS_TTS_Q4_K_M.gguf"),
                                 n_ctx=256, n_batch=64, n_threads=2))  # fmt: skip
    try:
        hid = np.zeros((len(rows), H_TINY), np.float32)
        n = len(rows)
        bb.decode(
            emb, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.ones(n, np.int8), hid
        )
    finally:
        bb.close()
    assert np.abs(hid - expected).max() < 0.02 * np.abs(expected).max()
    assert np.allclose(hid[:, demo.DIM_CONST], expected[:, demo.DIM_CONST], rtol=5e-3)


def test_greedy_speech_length_on_llama_cpp(
    bridge_lib: object, demo_model_dir: Path, weights: demo.DemoWeights
) -> None:
    """The same shaping through the real backbone (llama.cpp reads the written GGUF)."""
    from streamtts.model.backbone import Backbone, BackboneParams

    bb = Backbone(BackboneParams(model_path=str(demo_model_dir / GG / "MOSS_TTS_Q4_K_M.gguf"),
                                 n_ctx=512, n_batch=128, n_threads=2))  # fmt: skip
    try:
        bb.set_logit_columns(np.array([IDS.gen_slot, IDS.delay_slot]))
        text_rows = [IDS.im_start, *range(3000, 3050), IDS.im_end, IDS.audio_start]
        P = len(text_rows)

        emb = np.stack([_embed(weights, [t] + [1024] * IDS.n_vq) for t in text_rows]).astype(
            np.float32
        )
        out = np.zeros(P, np.int8)
        out[-1] = 1
        hid = np.zeros((1, H_TINY), np.float32)
        lg = np.zeros((1, 2), np.float32)
        bb.decode(emb, np.arange(P, dtype=np.int32), np.zeros(P, np.int32), out, hid, lg)
        step = 0
        while lg[0, 0] > lg[0, 1]:
            step += 1
            assert step < 200
            row = _greedy_audio_row(
                weights, hid[0].astype(np.float64), IDS.gen_slot, min(step, IDS.n_vq)
            )
            bb.decode(_embed(weights, row)[None].astype(np.float32), np.array([P + step - 1], np.int32),
                      np.zeros(1, np.int32), np.ones(1, np.int8), hid, lg)  # fmt: skip
        assert abs(step - P * DEFAULT_RATIO) <= 2, (step, P)
    finally:
        bb.close()


# -- writing, caching -----------------------------------------------------------------


def test_write_is_fast_and_rejects_unknown_presets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo preset"):
        demo.write_demo_model(tmp_path / "x", "huge")
    t0 = time.perf_counter()
    cfg = demo.write_demo_model(tmp_path / "m", "tiny", seed=3)
    assert time.perf_counter() - t0 < 15.0  # ~1.5 s here; generous for slow CI disks
    assert cfg == tmp_path / "m" / "config.yaml"
    marker = json.loads((tmp_path / "m" / demo.MARKER).read_text())
    assert marker["seed"] == 3


def test_ensure_demo_model_caches_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMTTS_CACHE", str(tmp_path / "cache"))
    results: list[Path] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            results.append(demo.ensure_demo_model())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]  # a race for the same folder
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expected = tmp_path / "cache" / "demo-model" / f"{demo.DEMO_MODEL_VERSION}-tiny" / "config.yaml"
    assert results == [expected, expected]
    base = expected.parent.parent
    assert [p.name for p in base.iterdir()] == [expected.parent.name]  # no temp folders left
    stamp = (expected.parent / demo.MARKER).stat().st_mtime_ns
    assert demo.ensure_demo_model() == expected  # second use: nothing rewritten
    assert (expected.parent / demo.MARKER).stat().st_mtime_ns == stamp
    load_config(expected)


def test_ensure_demo_model_replaces_a_broken_copy(tmp_path: Path) -> None:
    target = tmp_path / "demo-model" / f"{demo.DEMO_MODEL_VERSION}-tiny"
    target.mkdir(parents=True)
    (target / "config.yaml").write_text("half written")
    cfg = demo.ensure_demo_model(tmp_path)
    assert cfg == target / "config.yaml"
    assert (target / demo.MARKER).is_file()
    load_config(cfg)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMTTS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert demo.default_cache_dir() == tmp_path / "streamtts"
    monkeypatch.setenv("STREAMTTS_CACHE", str(tmp_path / "c"))
    assert demo.default_cache_dir() == tmp_path / "c"


def test_demo_model_main_logs_and_returns_the_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="streamtts")
    cfg = demo.demo_model_main(tmp_path / "m", "tiny", 0)
    assert cfg.is_file()
    assert any("demo model" in r.getMessage() for r in caplog.records)
    assert not any(r.name.startswith("gguf") and r.levelname == "INFO" for r in caplog.records)


@pytest.mark.parametrize("codec", ["tones", "real"])
def test_a_16_codebook_demo_bundle_synthesises(tmp_path: Path, codec: str) -> None:
    """``streamtts demo-model DIR --n-vq 16`` writes a whole 16-codebook bundle (tables, heads,
    config.json, decoders for 16 levels; the encoder keeps the codec's 32, as the published
    one) and ``streamtts synth`` on it writes audio and (T, 16) codes."""
    import onnx
    import soundfile as sf

    from streamtts.cli.main import main

    d = tmp_path / "m16"
    assert main(["demo-model", str(d), "--n-vq", "16", "--codec", codec]) == 0
    gg = d / GG
    assert len(list((gg / "embeddings").glob("emb_ext_*.npy"))) == 16
    assert len(list((gg / "lm_heads").glob("lm_head_audio_*.npy"))) == 16
    assert load_token_ids(gg / "config.json").n_vq == 16
    assert json.loads((d / demo.MARKER).read_text())["n_vq"] == 16
    onnx_dir = d / "MOSS-Audio-Tokenizer-ONNX"
    graphs = ["decoder.onnx"] + (["decoder_streaming.onnx"] if codec == "real" else [])
    for name in graphs:
        m = onnx.load(str(onnx_dir / name))
        assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 16, name
    enc = onnx.load(str(onnx_dir / "encoder.onnx"))
    assert enc.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 32
    wav, codes = tmp_path / "x.wav", tmp_path / "c.npy"
    rc = main(["synth", "--config", str(d / "config.yaml"), "--text", "Hello.", "--out", str(wav),
               "--codes-out", str(codes), "--n-threads", "1"])  # fmt: skip
    assert rc == 0
    c = np.load(codes)
    assert c.ndim == 2 and c.shape[1] == 16 and c.shape[0] >= 1
    audio, sr = sf.read(wav)
    assert sr == 24000 and audio.shape[0] == c.shape[0] * 1920


def test_demo_n_vq_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="demo n_vq must be an integer in 3..32"):
        demo.write_demo_model(tmp_path / "x", n_vq=33)


# -- a demo per family member ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["moss-tts-v1.5", "moss-ttsd", "moss-voice-generator", "moss-sound-effect"])
def test_a_member_demo_is_served_as_that_member(tmp_path: Path, kind: str) -> None:
    """``demo-model DIR --member KIND``: the member's codebooks, its model_kind in config.json
    and no sampling keys in config.yaml, so the engine serves it with the member's template,
    presets and max_new_tokens, as it serves a converted bundle of that member."""
    import asyncio

    from streamtts.cli.main import main
    from streamtts.core.family import MEMBERS
    from streamtts.engine import Engine

    m = MEMBERS[kind]
    d = tmp_path / kind
    assert main(["demo-model", str(d), "--member", kind]) == 0
    cfg_json = json.loads((d / GG / "config.json").read_text())
    assert cfg_json["model_kind"] == kind and cfg_json["n_vq"] == m.n_vq
    assert json.loads((d / demo.MARKER).read_text())["member"] == kind
    assert "temperature" not in (d / "config.yaml").read_text()
    assert len(list((d / GG / "lm_heads").glob("lm_head_audio_*.npy"))) == m.n_vq

    async def run() -> tuple[Any, dict[str, Any], str, int]:
        eng = Engine.from_config(d / "config.yaml", n_threads=1, max_streams=1, warmup=False)
        async with eng:
            samples = 0
            async for chunk in eng.stream("[S1] Hello there." if kind == "moss-ttsd" else "Hello there."):
                samples += chunk.pcm.shape[0]
            return eng.config, eng.info, eng.prompt_template.name, samples

    cfg, info, template, samples = asyncio.run(run())
    assert {k: getattr(cfg, k) for k in m.sampling_defaults()} == m.sampling_defaults()
    assert cfg.max_new_tokens == m.max_new_tokens
    assert info["model_kind"] == kind and info["n_vq"] == m.n_vq and template == m.template
    assert samples > 0


def test_a_member_demo_refuses_another_codebook_count(tmp_path: Path) -> None:
    from streamtts.cli.main import main

    with pytest.raises(ValueError, match="MOSS-TTSD-v1.0 has 16 codebooks"):
        demo.write_demo_model(tmp_path / "x", member="moss-ttsd", n_vq=32)
    assert main(["demo-model", str(tmp_path / "y"), "--member", "moss-ttsd", "--n-vq", "32"]) == 2
    assert not (tmp_path / "y").exists()
