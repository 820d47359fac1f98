"""The (S, 1 + n_vq) prompt matrix (contract section 3).

The text channel is the chat template below, tokenised in one piece as the
official pipeline does; the audio channels are pad except on the reference
block's slot rows, which carry the reference codes in delay layout. A last
``<|audio_start|>`` row puts the model in audio mode.

Special-token strings are looked up by id (published tokenizer files name
some of these ids differently), and the result is checked: if the tokenizer
splits a marker into ordinary tokens, the rows would silently misalign with
the codes, so that is an error instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import ConfigError, InputError, ModelFileError
from .delay import delay_layout
from .tokens import TokenIds


class TextTokenizer(Protocol):
    """What the prompt builder needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def id_to_token(self, id: int) -> str | None: ...


@dataclass(frozen=True)
class PromptSpec:
    """One request's prompt fields; ``None`` fields are written literally as ``None``.

    ``reference_codes`` (T, n_vq) int codes of the reference voice (encoder
    output), or None. ``tokens`` is the desired length in audio frames.
    """

    text: str
    reference_codes: np.ndarray | None = None
    instruction: str | None = None
    tokens: int | None = None
    quality: str | None = None
    sound_event: str | None = None
    ambient_sound: str | None = None
    language: str | None = None


def _special(tokenizer: TextTokenizer, token_id: int, role: str) -> str:
    tok = tokenizer.id_to_token(token_id)
    if not tok:
        raise ConfigError(
            f"the tokenizer has no token with id {token_id} ({role}); "
            "is it the MOSS-TTS tokenizer matching this model's token ids?"
        )
    return tok


def _check_reference(codes: np.ndarray | None, ids: TokenIds) -> np.ndarray | None:
    if codes is None:
        return None
    c = np.asarray(codes)
    if c.ndim != 2 or c.shape[1] != ids.n_vq:
        raise InputError(f"reference_codes must be (T, {ids.n_vq}), got shape {c.shape}")
    if not np.issubdtype(c.dtype, np.integer):
        raise InputError(f"reference_codes must be integers, got {c.dtype}")
    if c.shape[0] == 0:
        return None  # as the official pipeline: an empty reference is no reference
    if c.min() < 0 or c.max() >= ids.audio_vocab_size:
        raise InputError(f"reference codes must be in [0, {ids.audio_vocab_size - 1}]")
    return c.astype(np.int64, copy=False)


def _field(value: object) -> str:
    return "None" if value is None else str(value)


def build_prompt(tokenizer: TextTokenizer, ids: TokenIds, spec: PromptSpec) -> np.ndarray:
    """Build the (S, 1 + n_vq) int64 prompt for ``spec`` (see :func:`build_prompt_ex`)."""
    return build_prompt_ex(tokenizer, ids, spec)[0]


def build_prompt_ex(
    tokenizer: TextTokenizer, ids: TokenIds, spec: PromptSpec, *, prefix: bool = False
) -> tuple[np.ndarray, int]:
    """Build the (S, 1 + n_vq) int64 prompt for ``spec``, and with ``prefix`` the number
    of its leading rows that do not depend on the text (everything up to ``- Text:\n``;
    0 when the tokenizer merges across that boundary). Requests sharing voice and
    fields share those rows, which the engine's prefix cache reuses.

    Raises :class:`InputError` for empty text, a bad reference, a bad
    ``tokens`` value, or fields containing the model's special-token strings
    (they would be tokenised as control tokens); :class:`ConfigError` when the
    tokenizer lacks the special ids or does not treat them as single tokens.
    """
    built = _build(tokenizer, ids, spec, tokenizer.encode, prefix=prefix, count_text=False)
    return built.rows, built.prefix_rows


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    """A prompt and what the engine needs to know about it."""

    rows: np.ndarray  # (S, 1 + n_vq) int64
    prefix_rows: int  # leading rows that do not depend on the text (0: not asked, or merged)
    text_rows: int  # rows of the text itself: the prompt's rows less the template's


class PromptBuilder:
    """:func:`build_prompt_ex` for one tokenizer, tokenising each request's text once.

    The template's pieces without the text (the head up to ``- Text:\n``, which depends
    only on the fields and the voice's length; the closing turn; the marker check) are
    the same for many requests: each is tokenised once and remembered (the last
    ``cache_size``), so a request costs one ``encode``, of its whole prompt.
    """

    def __init__(self, tokenizer: TextTokenizer, ids: TokenIds, cache_size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.ids = ids
        self._fixed = functools.lru_cache(maxsize=cache_size)(self._encode_fixed)

    def _encode_fixed(self, piece: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(piece))

    def build(self, spec: PromptSpec, *, prefix: bool = False) -> BuiltPrompt:
        """The prompt for ``spec`` (errors as :func:`build_prompt_ex`); ``text_rows`` always,
        ``prefix_rows`` with ``prefix``."""
        return _build(self.tokenizer, self.ids, spec, self._fixed, prefix=prefix, count_text=True)


def _build(
    tokenizer: TextTokenizer,
    ids: TokenIds,
    spec: PromptSpec,
    encode_fixed: Callable[[str], Sequence[int]],
    *,
    prefix: bool,
    count_text: bool,
) -> BuiltPrompt:
    """The prompt; ``encode_fixed`` tokenises the pieces that do not hold the text."""
    if not isinstance(spec.text, str) or not spec.text.strip():
        raise InputError("text is empty")
    if spec.tokens is not None and (
        isinstance(spec.tokens, bool) or not isinstance(spec.tokens, int) or spec.tokens < 1
    ):
        raise InputError(
            f"tokens (duration in frames) must be a positive integer, got {spec.tokens!r}"
        )
    ref = _check_reference(spec.reference_codes, ids)

    im_start = _special(tokenizer, ids.im_start, "<|im_start|>")
    im_end = _special(tokenizer, ids.im_end, "<|im_end|>")
    audio_start = _special(tokenizer, ids.audio_start, "<|audio_start|>")
    audio_end = _special(tokenizer, ids.audio_end, "<|audio_end|>")
    user_slot = _special(tokenizer, ids.user_slot, "audio user slot")
    specials = {
        im_start,
        im_end,
        audio_start,
        audio_end,
        user_slot,
        _special(tokenizer, ids.pad, "<|endoftext|>"),
        _special(tokenizer, ids.gen_slot, "audio gen slot"),
        _special(tokenizer, ids.delay_slot, "audio delay slot"),
    }
    fields = {
        "text": spec.text,
        "instruction": spec.instruction,
        "quality": spec.quality,
        "sound_event": spec.sound_event,
        "ambient_sound": spec.ambient_sound,
        "language": spec.language,
    }
    for name, value in fields.items():
        if value is None:
            continue
        for sp in specials:
            if sp in value:
                raise InputError(f"{name} contains the special token string {sp!r}")

    k_n = ids.n_vq
    n_slots = 0 if ref is None else ref.shape[0] + k_n - 1
    ref_str = "None" if ref is None else f"[S1]:\n{audio_start}{user_slot * n_slots}{audio_end}"
    head = (
        f"{im_start}user\n<user_inst>\n"
        f"- Reference(s):\n{ref_str}\n"
        f"- Instruction:\n{_field(spec.instruction)}\n"
        f"- Tokens:\n{_field(spec.tokens)}\n"
        f"- Quality:\n{_field(spec.quality)}\n"
        f"- Sound Event:\n{_field(spec.sound_event)}\n"
        f"- Ambient Sound:\n{_field(spec.ambient_sound)}\n"
        f"- Language:\n{_field(spec.language)}\n"
        f"- Text:\n"
    )
    turn_end = f"\n</user_inst>{im_end}\n{im_start}assistant\n"
    text_ids = np.asarray(tokenizer.encode(head + spec.text + turn_end), dtype=np.int64)
    tail = encode_fixed(audio_start)
    if list(tail) != [ids.audio_start]:
        raise ConfigError(
            f"the tokenizer encodes {audio_start!r} as {list(tail)[:8]}, not the single id "
            f"{ids.audio_start}: it does not treat the model's markers as special tokens"
        )
    block = _verify(text_ids, ids, n_slots)

    s_n = text_ids.shape[0] + 1
    prompt = np.full((s_n, 1 + k_n), ids.audio_pad_code, dtype=np.int64)
    prompt[:-1, 0] = text_ids
    prompt[-1, 0] = ids.audio_start
    if ref is not None:
        first = block + 1
        prompt[first : first + n_slots, 1:] = delay_layout(ref, ids.audio_pad_code)
    n_prefix = n_text = 0
    if prefix or count_text:
        head_ids = np.asarray(encode_fixed(head), dtype=np.int64)
        if prefix and head_ids.size < text_ids.size and np.array_equal(text_ids[: head_ids.size], head_ids):
            n_prefix = int(head_ids.size)
        if count_text:
            n_text = max(0, int(text_ids.size) - int(head_ids.size) - len(encode_fixed(turn_end)))
    return BuiltPrompt(prompt, n_prefix, n_text)


def _verify(text_ids: np.ndarray, ids: TokenIds, n_slots: int) -> int:
    """Check the markers came out as single tokens where expected.

    Returns the row of the reference block's ``<|audio_start|>`` (-1 without one).
    """
    expected = {ids.im_start: 2, ids.im_end: 1}
    n_markers = 1 if n_slots else 0
    expected.update({ids.audio_start: n_markers, ids.audio_end: n_markers, ids.user_slot: n_slots})
    for token_id, count in expected.items():
        got = int(np.count_nonzero(text_ids == token_id))
        if got != count:
            raise ConfigError(
                f"tokenising the prompt gave {got} x id {token_id}, expected {count}: the "
                "tokenizer does not treat the model's special tokens as single tokens"
            )
    if text_ids[0] != ids.im_start:
        raise ConfigError(f"the prompt does not start with <|im_start|> (id {ids.im_start})")
    if not n_slots:
        return -1
    start = int(np.flatnonzero(text_ids == ids.audio_start)[0])
    end = int(np.flatnonzero(text_ids == ids.audio_end)[0])
    if end != start + n_slots + 1 or not np.all(text_ids[start + 1 : end] == ids.user_slot):
        raise ConfigError(
            "the reference block did not tokenise as <|audio_start|>, "
            f"{n_slots} x slot, <|audio_end|>: the tokenizer merges the markers"
        )
    return start


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json (the Qwen3 byte-level BPE) as a TextTokenizer."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path).expanduser()
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise ModelFileError(file, "a tokenizers JSON file (tokenizer.json)", "file not found")
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ConfigError(
                "the 'tokenizers' package is required to load tokenizer.json"
            ) from exc
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ModelFileError(file, "a tokenizers JSON file (tokenizer.json)", str(exc)) from exc
        self.path = file

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def id_to_token(self, id: int) -> str | None:
        tok: str | None = self._tok.id_to_token(id)
        return tok

    def decode(self, ids: list[int]) -> str:
        text: str = self._tok.decode(ids)
        return text

    @property
    def vocab_size(self) -> int:
        n: int = self._tok.get_vocab_size()
        return n
