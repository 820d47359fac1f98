"""A bundle's member defaults reach the engine: ``model_kind`` and ``sampling`` in its config.json
(written by ``streamtts convert-hf``) become the engine's sampling keys, unless the user's config
file (or an override) sets them; the engine reports the member in its info.

Real components: the family fixture's n_vq 16 checkpoint converted to BF16 (an F16 TTSD backbone
is refused: its activations overflow float16), loaded by llama.cpp,
with the demo model's codec beside it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.family import family_checkpoint

from streamtts import Engine
from streamtts.config import EngineConfig, load_config
from streamtts.convert.download import CODEC_DIR
from streamtts.convert.hf import convert_hf
from streamtts.core.family import MEMBERS
from streamtts.request import StreamOptions, StreamStats

TTSD = MEMBERS["moss-ttsd"].sampling_defaults()


def _bundle(root: Path, demo_model_dir: Path, *, generation: dict[str, Any] | None = None) -> Path:
    src = family_checkpoint("nvq16", root, name="MOSS-TTSD-v1.0")
    if generation is not None:
        (src / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    convert_hf(src, root / "bundle", ["BF16"], gpu=False)
    (root / CODEC_DIR).symlink_to(demo_model_dir / CODEC_DIR, target_is_directory=True)
    return root / "bundle" / "config.yaml"


@pytest.fixture(scope="module")
def ttsd_yaml(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Path:
    return _bundle(tmp_path_factory.mktemp("ttsd"), demo_model_dir)


def _loaded(config: str | Path | EngineConfig, **overrides: Any) -> tuple[EngineConfig, dict[str, Any], Any]:
    """The engine's config and info once started, and a prepared request's sampling."""

    async def main() -> tuple[EngineConfig, dict[str, Any], Any]:
        eng = Engine.from_config(config, n_threads=1, max_streams=1, warmup=False, **overrides)
        async with eng:
            req = eng._preparer.prepare(1, "Hello there.", None, StreamOptions(), None, StreamStats())
            return eng.config, eng.info, getattr(req, "sampling", None)

    return asyncio.run(main())


def _sampling(cfg: EngineConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in TTSD}


def test_a_ttsd_bundle_samples_with_its_members_defaults(ttsd_yaml: Path, bridge_lib: Any) -> None:
    cfg, info, req_sampling = _loaded(ttsd_yaml)
    assert TTSD["audio_temperature"] == 1.1 and TTSD["audio_repetition_penalty"] == 1.1
    assert _sampling(cfg) == TTSD
    assert info["model_kind"] == "moss-ttsd" and info["sampling"] == TTSD
    # a request without its own sampling gets them
    assert req_sampling is not None and req_sampling.audio_top_p == 0.9 and req_sampling.audio_top_k == 50


def test_a_key_the_users_config_sets_wins(ttsd_yaml: Path, bridge_lib: Any) -> None:
    user = ttsd_yaml.with_name("mine.yaml")
    # audio_top_k set to the built-in default (25): still the user's choice, not the member's 50
    user.write_text(ttsd_yaml.read_text() + "audio_temperature: 0.7\naudio_top_k: 25\n", encoding="utf-8")
    assert load_config(user).explicit_keys is not None
    cfg, info, _ = _loaded(user, audio_top_p=0.5)  # an override is the user's too
    assert _sampling(cfg) == {**TTSD, "audio_temperature": 0.7, "audio_top_k": 25, "audio_top_p": 0.5}
    assert info["model_kind"] == "moss-ttsd"


def test_a_config_built_in_python_keeps_what_it_changed(ttsd_yaml: Path, bridge_lib: Any) -> None:
    built = load_config(ttsd_yaml)
    py = EngineConfig(**{k: getattr(built, k) for k in ("backbone_gguf", "embedding_dir", "lm_head_dir",
                                                         "tokenizer_dir", "audio_encoder_onnx",
                                                         "audio_decoder_onnx", "model_config_json")},
                      audio_repetition_penalty=1.3)  # fmt: skip
    assert py.explicit_keys is None  # not read from a file: a changed key counts as set
    cfg, _, _ = _loaded(py)
    assert _sampling(cfg) == {**TTSD, "audio_repetition_penalty": 1.3}


def test_generation_config_wins_over_the_table(tmp_path: Path, demo_model_dir: Path, bridge_lib: Any) -> None:
    yaml_path = _bundle(tmp_path, demo_model_dir, generation={"audio_top_k": 40, "text_top_p": 0.9})
    cfg, info, _ = _loaded(yaml_path)
    assert _sampling(cfg) == {**TTSD, "audio_top_k": 40, "text_top_p": 0.9}
    assert info["sampling"]["audio_top_k"] == 40


def test_a_bundle_without_a_member_keeps_the_built_in_defaults(demo_model_dir: Path, bridge_lib: Any) -> None:
    cfg, info, _ = _loaded(demo_model_dir / "config.yaml")
    assert info["model_kind"] == "moss-tts"  # a config.json naming no member is MOSS-TTS 1.0
    assert _sampling(cfg) == {k: getattr(EngineConfig(), k) for k in TTSD}


@pytest.mark.parametrize("kind", ["moss-ttsd", "moss-voice-generator"])
def test_an_f16_backbone_of_a_member_that_overflows_it_is_refused(
    kind: str, tmp_path: Path, demo_model_dir: Path, bridge_lib: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """MOSS-TTSD-8B's and VoiceGenerator's activations pass float16's range, and llama.cpp
    multiplies by an F16 matrix in float16: convert-hf warns, and the engine refuses the file
    (naming it and what to convert to) rather than produce NaN; a SoundEffect F16 loads."""
    import logging

    from streamtts.errors import ModelFileError

    src = family_checkpoint("nvq16", tmp_path, name="checkpoint")
    with caplog.at_level(logging.WARNING, logger="streamtts.convert.hf"):
        convert_hf(src, tmp_path / "bundle", ["F16"], gpu=False, model_kind=kind)
    assert "the engine will refuse it" in caplog.text
    (tmp_path / CODEC_DIR).symlink_to(demo_model_dir / CODEC_DIR, target_is_directory=True)
    with pytest.raises(ModelFileError, match=r"MOSS_TTS_F16.gguf.*layer matrices are F16.*--quant BF16, F32"):
        _loaded(tmp_path / "bundle" / "config.yaml")
    convert_hf(src, tmp_path / "bundle", ["F16"], gpu=False, model_kind="moss-sound-effect")
    cfg, info, _ = _loaded(tmp_path / "bundle" / "config.yaml")
    assert info["model_kind"] == "moss-sound-effect"
