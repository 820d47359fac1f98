"""``streamtts convert-hf`` for every member of the family: any n_vq, a tied Qwen3 config, F32 /
BF16 / F16, and the member (model_kind + its sampling defaults) written into the bundle.

The checkpoints are the family fixture's (tests/fixtures/family, official ``MossTTSDelayModel``
weights, n_vq 32 and 16), materialised into tmp folders; the GGUFs are read back with gguf-py
and loaded by the real llama.cpp.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from fixtures.family import SHAPES, family_checkpoint

from streamtts import cli
from streamtts.convert.checkpoint import Checkpoint
from streamtts.convert.hf import convert_hf
from streamtts.convert.hf_source import gguf_name
from streamtts.convert.member import choose_member
from streamtts.core.family import MEMBERS, kind_from_name
from streamtts.errors import ConfigError, ModelFileError

AUDIO_START, GEN_SLOT = 151652, 151656
ZERO_HEAD_ROWS = (7, 11)  # text ids with a (kept) embedding row but an all-zero lm_heads.0 row


# GGUF value types: fixed sizes, 8 = string, 9 = array
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGML_TYPES = {0: ("F32", 4), 1: ("F16", 2), 30: ("BF16", 2)}


@functools.lru_cache(maxsize=8)
def _gguf(path: Path) -> tuple[dict[str, tuple[str, np.ndarray]], int]:
    """({tensor name: (type, data as stored, NumPy shape)}, general.file_type) of a float GGUF.
    Read here rather than with gguf-py's GGUFReader, which takes ~15 s on these shared cores
    to parse a 151936-token vocabulary."""
    buf = memoryview(path.read_bytes())
    pos = 4 + 4

    def take(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(buf[pos - n : pos]).decode()

    def skip(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            string()
        elif vtype == 9:
            etype, count = take("I"), take("Q")
            if etype in _GGUF_SIZES:
                pos += _GGUF_SIZES[etype] * count
            else:
                for _ in range(count):
                    skip(etype)
        else:
            pos += _GGUF_SIZES[vtype]

    assert bytes(buf[:4]) == b"GGUF"
    n_tensors, n_kv = take("Q"), take("Q")
    file_type, align = -1, 32
    for _ in range(n_kv):
        key, vtype = string(), take("I")
        if key in ("general.file_type", "general.alignment"):
            value = take("I")
            file_type, align = (value, align) if key == "general.file_type" else (file_type, value)
        else:
            skip(vtype)
    infos = []
    for _ in range(n_tensors):
        name, n_dims = string(), take("I")
        dims = [take("Q") for _ in range(n_dims)]
        infos.append((name, dims, take("I"), take("Q")))
    start = -(-pos // align) * align
    out = {}
    for name, dims, t, off in infos:
        kind, size = _GGML_TYPES[t]
        n = int(np.prod(dims)) * size
        data = np.frombuffer(buf[start + off : start + off + n], dtype=np.uint8)
        out[name] = (kind, data.view(np.float32 if kind == "F32" else np.uint16).reshape(dims[::-1]))
    return out, file_type


@pytest.fixture(scope="module", params=SHAPES)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoint folder, bundle) of one shape converted to F32, BF16 and F16."""
    root = tmp_path_factory.mktemp(request.param)
    src = family_checkpoint(request.param, root)
    convert_hf(src, root / "bundle", ["F32", "BF16", "F16"], gpu=False, model_kind=(
        "moss-tts" if request.param == "nvq32" else "moss-ttsd"))  # fmt: skip
    return src, root / "bundle"


def test_tables_follow_n_vq(converted: tuple[Path, Path]) -> None:
    src, bundle = converted
    n_vq = json.loads((src / "config.json").read_text())["n_vq"]
    emb = sorted(p.name for p in (bundle / "embeddings").glob("emb_ext_*.npy"))
    heads = sorted(p.name for p in (bundle / "lm_heads").glob("lm_head_audio_*.npy"))
    assert emb == [f"emb_ext_{k:02d}.npy" for k in range(n_vq)]
    assert heads == [f"lm_head_audio_{k:02d}.npy" for k in range(n_vq)]
    assert json.loads((bundle / "config.json").read_text())["n_vq"] == n_vq
    with Checkpoint(src) as ck:
        last = ck.get_f32(f"lm_heads.{n_vq}.weight").astype(np.float16)
    assert np.array_equal(np.load(bundle / "lm_heads" / f"lm_head_audio_{n_vq - 1:02d}.npy"), last)


def test_f32_gguf_is_the_bf16_weights_widened(converted: tuple[Path, Path]) -> None:
    src, bundle = converted
    tensors, file_type = _gguf(bundle / "MOSS_TTS_F32.gguf")
    assert file_type == 0  # LLAMA_FTYPE_ALL_F32
    with Checkpoint(src) as ck:
        names = [n for n in ck.names() if gguf_name(n) is not None]
        assert sorted(str(gguf_name(n)) for n in names) == sorted(tensors)
        for name in names:
            kind, got = tensors[str(gguf_name(name))]
            assert kind == "F32", name
            want = ck.get(name)
            assert want.dtype == np.dtype(ml_dtypes.bfloat16)
            # exactly: the bf16 bits are the upper half of the float32's, the rest zero
            bits = got.view(np.uint32)
            assert np.array_equal(bits >> 16, want.view(np.uint16).astype(np.uint32)), name
            assert not (bits & 0xFFFF).any(), name


def test_bf16_gguf_keeps_the_bits_and_f16_keeps_the_official_types(converted: tuple[Path, Path]) -> None:
    src, bundle = converted
    (bf16, bf16_type), (f16, f16_type) = (_gguf(bundle / f"MOSS_TTS_{q}.gguf") for q in ("BF16", "F16"))
    assert (bf16_type, f16_type) == (32, 1)  # LLAMA_FTYPE_MOSTLY_BF16, _F16
    with Checkpoint(src) as ck:
        for name in (n for n in ck.names() if gguf_name(n) is not None):
            gg = str(gguf_name(name))
            want = ck.get(name)
            matrix = want.ndim == 2
            assert bf16[gg][0] == ("BF16" if matrix else "F32"), gg
            assert f16[gg][0] == ("F16" if matrix else "F32"), gg
            if matrix:
                assert np.array_equal(bf16[gg][1], want.view(np.uint16)), gg
                assert np.array_equal(f16[gg][1], want.astype(np.float32).astype(np.float16).view(np.uint16)), gg


def test_llama_cpp_loads_every_type(converted: tuple[Path, Path], bridge_lib: Any) -> None:
    from streamtts.model.backbone import Backbone, BackboneParams

    _, bundle = converted
    for q in ("F32", "BF16", "F16"):
        with Backbone(BackboneParams(model_path=str(bundle / f"MOSS_TTS_{q}.gguf"), n_ctx=64,
                                     n_batch=16, n_threads=1)) as b:  # fmt: skip
            assert b.n_embd == 64


# -- a tied config still gets MOSS's text head -----------------------------------------------------


def _tie(cfg: dict[str, Any]) -> None:
    cfg["language_config"]["tie_word_embeddings"] = True
    cfg["tie_word_embeddings"] = True


def test_tied_config_keeps_lm_heads_0_as_the_output_layer(tmp_path: Path, bridge_lib: Any) -> None:
    """Qwen3-1.7B's config ties the embeddings; MOSS's text head is lm_heads.0 all the same:
    the GGUF's output.weight is lm_heads.0 and llama.cpp computes the logits with it (a zero
    row of lm_heads.0 gives exactly 0, where the tied embedding's row would not)."""
    from streamtts.model.backbone import Backbone, BackboneParams

    src = family_checkpoint("nvq16", tmp_path, name="MOSS-VoiceGenerator", edit_config=_tie)
    convert_hf(src, tmp_path / "bundle", ["F32"], gpu=False)
    with Checkpoint(src) as ck:
        head = ck.get_f32("lm_heads.0.weight")
        embed = ck.get_f32("language_model.embed_tokens.weight")
    tensors, _ = _gguf(tmp_path / "bundle" / "MOSS_TTS_F32.gguf")
    assert np.array_equal(tensors["output.weight"][1], head)
    cols = np.array([AUDIO_START, GEN_SLOT, *ZERO_HEAD_ROWS], dtype=np.int32)
    assert not head[list(ZERO_HEAD_ROWS)].any() and embed[list(ZERO_HEAD_ROWS)].any()
    params = BackboneParams(model_path=str(tmp_path / "bundle" / "MOSS_TTS_F32.gguf"), n_ctx=64,
                            n_batch=16, n_threads=1, type_k="f32", type_v="f32")  # fmt: skip
    with Backbone(params) as b:
        b.set_logit_columns(cols)
        n = 3
        embd = np.ascontiguousarray(embed[[151644, 198, 220]])  # <|im_start|> and two text rows (kept)
        hidden = np.zeros((n, 64), np.float32)
        logits = np.zeros((n, len(cols)), np.float32)
        out = np.ones(n, np.int8)
        b.decode(embd, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), out, hidden, logits)
    assert np.all(logits[:, 2:] == 0.0)  # lm_heads.0's zero rows, not the embedding's
    np.testing.assert_allclose(logits, hidden @ head[cols].T, rtol=1e-5, atol=1e-5)
    assert np.abs(hidden @ embed[cols].T - logits).max() > 0.1  # the tied head would differ


# -- the member: model_kind from the name or --model-kind, with its sampling defaults ------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("OpenMOSS-Team/MOSS-TTSD-v1.0", "moss-ttsd"),
        ("OpenMOSS-Team/MOSS-VoiceGenerator", "moss-voice-generator"),
        ("MOSS-VoiceGenerator", "moss-voice-generator"),
        ("OpenMOSS-Team/MOSS-SoundEffect", "moss-sound-effect"),
        ("OpenMOSS-Team/MOSS-TTS-v1.5", "moss-tts-v1.5"),
        ("moss_tts_v1_5", "moss-tts-v1.5"),
        ("OpenMOSS-Team/MOSS-TTS", "moss-tts"),
        ("MOSS-TTS", "moss-tts"),
        ("models--OpenMOSS-Team--MOSS-TTSD-v1.0", "moss-ttsd"),
    ],
)
def test_kind_from_names(name: str, kind: str) -> None:
    assert kind_from_name(name) == kind


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def test_member_from_a_hub_id_a_folder_and_the_hub_cache(tmp_path: Path) -> None:
    cfg: dict[str, Any] = {}
    folder = tmp_path / "MOSS-SoundEffect"
    folder.mkdir()
    assert choose_member(folder, str(folder), cfg, 16).kind == "moss-sound-effect"
    # a hub id names the member even though the download folder's name is the cache's
    cache = tmp_path / "OpenMOSS-Team--x"
    cache.mkdir()
    assert choose_member(cache, "OpenMOSS-Team/MOSS-TTSD-v1.0", cfg, 16).kind == "moss-ttsd"
    snap = tmp_path / "models--OpenMOSS-Team--MOSS-VoiceGenerator" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    got = choose_member(snap, str(snap), cfg, 16)
    assert got.kind == "moss-voice-generator"
    assert got.sampling == MEMBERS["moss-voice-generator"].sampling_defaults()


def test_unknown_name_is_moss_tts_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    with caplog.at_level(logging.WARNING, logger="streamtts.convert.member"):
        got = choose_member(folder, str(folder), {}, 32)
    assert got.kind == "moss-tts" and got.why == "default"
    assert "cannot tell" in caplog.text and "--model-kind" in caplog.text


def test_model_kind_option_names_the_member_in_the_bundle(tmp_path: Path) -> None:
    src = family_checkpoint("nvq16", tmp_path, name="checkpoint")
    out = tmp_path / "bundle"
    rc = cli.main(["convert-hf", str(src), "--out", str(out), "--quant", "F16",
                   "--model-kind", "moss-voice-generator"])  # fmt: skip
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_kind"] == "moss-voice-generator"
    assert cfg["sampling"] == {
        "text_temperature": 1.5, "text_top_p": 1.0, "text_top_k": 50,
        "audio_temperature": 1.5, "audio_top_p": 0.6, "audio_top_k": 50,
        "audio_repetition_penalty": 1.1,
    }  # fmt: skip
    assert "Model: moss-voice-generator (MOSS-VoiceGenerator)" in (out / "config.yaml").read_text()
    # rerun with another kind: only the two config files change
    before = (out / "MOSS_TTS_F16.gguf").stat().st_mtime_ns
    res = convert_hf(src, out, ["F16"], gpu=False, model_kind="moss-sound-effect")
    assert sorted(res.written) == ["config.json", "config.yaml"]
    assert json.loads((out / "config.json").read_text())["sampling"]["audio_repetition_penalty"] == 1.2
    assert (out / "MOSS_TTS_F16.gguf").stat().st_mtime_ns == before


def test_model_kind_errors(tmp_path: Path) -> None:
    src = family_checkpoint("nvq16", tmp_path)
    with pytest.raises(ConfigError, match="unknown model kind 'moss-music'.*moss-ttsd"):
        convert_hf(src, tmp_path / "a", ["F16"], gpu=False, model_kind="moss-music")
    with pytest.raises(ConfigError, match="MOSS-TTS-v1.5 has 32 codebooks, the checkpoint 16"):
        convert_hf(src, tmp_path / "b", ["F16"], gpu=False, model_kind="moss-tts-v1.5")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- generation_config.json wins over the table for the keys it sets ------------------------------


def test_generation_config_wins_for_its_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = family_checkpoint("nvq16", tmp_path, name="MOSS-SoundEffect")
    _write_json(src / "generation_config.json", {
        "audio_temperature": 0.9, "audio_top_k": 40,
        # plain transformers keys: the official Delay generate() never reads them
        "temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True,
    })  # fmt: skip
    with caplog.at_level(logging.INFO, logger="streamtts.convert.member"):
        res = convert_hf(src, tmp_path / "bundle", ["F16"], gpu=False)
    want = {**MEMBERS["moss-sound-effect"].sampling_defaults(), "audio_temperature": 0.9, "audio_top_k": 40}
    assert res.model_kind == "moss-sound-effect" and res.sampling == want
    assert json.loads((tmp_path / "bundle" / "config.json").read_text())["sampling"] == want
    assert "temperature, top_p, top_k, do_sample not used" in caplog.text


def test_ttsds_generate_reads_its_generation_config(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """MOSS-TTSD's own generate() reads generation_config.json's plain temperature / top_p /
    top_k / repetition_penalty as its audio preset, and max_new_tokens: the bundle gets them,
    and a context that holds that generation after a long prompt."""
    src = family_checkpoint("nvq16", tmp_path, name="MOSS-TTSD-v1.0")
    _write_json(src / "generation_config.json", {
        "max_new_tokens": 8192, "temperature": 1.0, "top_p": 0.95, "top_k": 40,
        "repetition_penalty": 1.05, "do_sample": True,
    })  # fmt: skip
    with caplog.at_level(logging.INFO, logger="streamtts.convert.member"):
        res = convert_hf(src, tmp_path / "bundle", ["F16"], gpu=False)
    assert res.sampling == {
        "text_temperature": 1.1, "text_top_p": 0.9, "text_top_k": 50, "audio_temperature": 1.0,
        "audio_top_p": 0.95, "audio_top_k": 40, "audio_repetition_penalty": 1.05,
    }  # fmt: skip
    yaml_text = (tmp_path / "bundle" / "config.yaml").read_text()
    assert "max_new_tokens: 8192\n" in yaml_text and "n_ctx: 9216\n" in yaml_text
    assert "do_sample not used" in caplog.text
    # without one: generate()'s own fallbacks (1000 steps), the default context
    bare = family_checkpoint("nvq16", tmp_path / "b", name="MOSS-TTSD-v1.0")
    convert_hf(bare, tmp_path / "bundle2", ["F16"], gpu=False)
    yaml_text = (tmp_path / "bundle2" / "config.yaml").read_text()
    assert "max_new_tokens: 1000\n" in yaml_text and "n_ctx: 4096\n" in yaml_text
    _write_json(bare / "generation_config.json", {"max_new_tokens": 0})
    with pytest.raises(ModelFileError, match="max_new_tokens as a positive integer"):
        convert_hf(bare, tmp_path / "bundle3", ["F16"], gpu=False)


def test_generation_config_layers_form(tmp_path: Path) -> None:
    """MOSS-TTS-Local's form: one dict per channel, text first; a top-level key wins."""
    src = family_checkpoint("nvq16", tmp_path, name="MOSS-TTSD-v1.0")
    audio = {"temperature": 1.0, "top_p": 0.95, "top_k": 30, "repetition_penalty": 1.05}
    _write_json(src / "generation_config.json", {
        "layers": [{"temperature": 1.2, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.0}]
        + [audio] * 16,
        "audio_top_k": 45,
    })  # fmt: skip
    got = choose_member(src, str(src), {}, 16)
    assert got.sampling == {
        "text_temperature": 1.2, "text_top_p": 0.9, "text_top_k": 40, "audio_temperature": 1.0,
        "audio_top_p": 0.95, "audio_top_k": 45, "audio_repetition_penalty": 1.05,
    }  # fmt: skip
    assert set(got.from_generation_config) == set(got.sampling)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({"audio_top_p": 1.5}, r"audio_top_p must be in \(0, 1\]"),
        ({"audio_top_k": 2.5}, "audio_top_k as an integer"),
        ({"audio_temperature": "hot"}, "audio_temperature as a number"),
        ({"layers": [{}, {"top_k": 5}, {"top_k": 6}]}, "one sampling preset for every audio codebook"),
    ],
)
def test_bad_generation_config(tmp_path: Path, content: dict[str, Any], match: str) -> None:
    src = family_checkpoint("nvq16", tmp_path, name="MOSS-TTSD-v1.0")
    _write_json(src / "generation_config.json", content)
    with pytest.raises(ModelFileError, match=match) as err:
        convert_hf(src, tmp_path / "bundle", ["F16"], gpu=False)
    assert "generation_config.json" in str(err.value)
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("shape", SHAPES)
def test_fixture_materialises_the_recorded_checkpoint(shape: str, tmp_path: Path) -> None:
    """tests/fixtures/family: the file compact.py recorded, only unused embedding rows zeroed."""
    import hashlib

    manifest = json.loads((Path(__file__).parents[1] / "fixtures" / "family" / "compact.json").read_text())
    src = family_checkpoint(shape, tmp_path)  # type: ignore[arg-type]
    digest = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    assert digest == manifest[shape]["model_safetensors_sha256"]
    with Checkpoint(src) as ck:
        embed = ck.get_f32("language_model.embed_tokens.weight")
    kept = np.zeros(len(embed), dtype=bool)
    kept[manifest[shape]["kept_embed_rows"]] = True
    assert embed[kept].any(axis=1).all() and not embed[~kept].any()
    assert sorted(p.name for p in src.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]  # fmt: skip
