"""Model constants: special token ids, codebook layout, sample rate.

Defaults are the published MOSS-TTS-Delay values; a model's ``config.json``
(HF ``MossTTSDelayConfig`` keys) overrides them when present.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from ..constants import SAMPLE_RATE
from ..errors import ModelFileError


class TokenIds(msgspec.Struct, frozen=True, kw_only=True):
    n_vq: int = 32
    pad_token_id: int = 151643
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    audio_start_token_id: int = 151652
    audio_end_token_id: int = 151653
    audio_user_slot_token_id: int = 151654
    audio_assistant_gen_slot_token_id: int = 151656
    audio_assistant_delay_slot_token_id: int = 151662
    audio_pad_code: int = 1024
    audio_vocab_size: int = 1024
    sampling_rate: int = SAMPLE_RATE

    # Short aliases used throughout the engine.
    @property
    def pad(self) -> int:
        return self.pad_token_id

    @property
    def im_start(self) -> int:
        return self.im_start_token_id

    @property
    def im_end(self) -> int:
        return self.im_end_token_id

    @property
    def audio_start(self) -> int:
        return self.audio_start_token_id

    @property
    def audio_end(self) -> int:
        return self.audio_end_token_id

    @property
    def user_slot(self) -> int:
        return self.audio_user_slot_token_id

    @property
    def gen_slot(self) -> int:
        return self.audio_assistant_gen_slot_token_id

    @property
    def delay_slot(self) -> int:
        return self.audio_assistant_delay_slot_token_id

    @property
    def audio_rows(self) -> int:
        """Rows per audio embedding table / head: the codes plus the pad code."""
        return self.audio_vocab_size + 1


_FIELDS = set(TokenIds.__struct_fields__)


def load_token_ids(config_json: str | Path | None) -> TokenIds:
    """Read token ids from a model ``config.json``; missing keys keep the defaults."""
    if config_json is None:
        return TokenIds()
    path = Path(config_json)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelFileError(path, "a model config.json", "file not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, "a JSON object with token ids", str(exc)) from exc
    if not isinstance(data, dict):
        raise ModelFileError(path, "a JSON object with token ids", f"got {type(data).__name__}")
    known = {k: v for k, v in data.items() if k in _FIELDS}
    try:
        return msgspec.convert(known, TokenIds)
    except msgspec.ValidationError as exc:
        raise ModelFileError(path, "integer token ids", str(exc)) from exc
