"""Model constants: special token ids, codebook layout, sample rate.

Defaults are the published MOSS-TTS-Delay values; a model's ``config.json``
(HF ``MossTTSDelayConfig`` keys) overrides them when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from ..constants import SAMPLE_RATE
from ..errors import ModelFileError


class TokenIds(msgspec.Struct, frozen=True, kw_only=True):
    """The ids under the short names the engine uses; ``name=`` is the ``config.json`` key
    (what ``msgspec.convert`` reads and ``msgspec.to_builtins`` writes)."""

    n_vq: int = 32
    pad: int = msgspec.field(default=151643, name="pad_token_id")
    im_start: int = msgspec.field(default=151644, name="im_start_token_id")
    im_end: int = msgspec.field(default=151645, name="im_end_token_id")
    audio_start: int = msgspec.field(default=151652, name="audio_start_token_id")
    audio_end: int = msgspec.field(default=151653, name="audio_end_token_id")
    user_slot: int = msgspec.field(default=151654, name="audio_user_slot_token_id")
    gen_slot: int = msgspec.field(default=151656, name="audio_assistant_gen_slot_token_id")
    delay_slot: int = msgspec.field(default=151662, name="audio_assistant_delay_slot_token_id")
    audio_pad_code: int = 1024
    audio_vocab_size: int = 1024
    sampling_rate: int = SAMPLE_RATE

    @property
    def audio_rows(self) -> int:
        """Rows per audio embedding table / head: the codes plus the pad code."""
        return self.audio_vocab_size + 1


# the config.json keys
KEYS = frozenset(TokenIds.__struct_encode_fields__)


def read_model_config(config_json: str | Path) -> dict[str, Any]:
    """A model ``config.json`` as a dict (ModelFileError naming the file when unreadable)."""
    path = Path(config_json)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelFileError(path, "a model config.json", "file not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, "a JSON object with token ids", str(exc)) from exc
    if not isinstance(data, dict):
        raise ModelFileError(path, "a JSON object with token ids", f"got {type(data).__name__}")
    return data


def load_token_ids(config_json: str | Path | None) -> TokenIds:
    """Read token ids from a model ``config.json``; missing keys keep the defaults."""
    if config_json is None:
        return TokenIds()
    path = Path(config_json)
    data = read_model_config(path)
    known = {k: v for k, v in data.items() if k in KEYS}
    try:
        return msgspec.convert(known, TokenIds)
    except msgspec.ValidationError as exc:
        raise ModelFileError(path, "integer token ids", str(exc)) from exc
