"""The (S, 1 + n_vq) prompt matrix (contract section 3).

The text channel is the chat template below, tokenised in one piece as the
official pipeline does; the audio channels are pad except on the reference
blocks' slot rows, which carry the reference codes in delay layout. A last
``<|audio_start|>`` row puts the model in audio mode.

The whole family (contract section 8) builds its prompts here, as each member's own
processor does (its template, ``TEMPLATES``): any ``n_vq``; one reference block per
dialogue speaker (``[S{i}]:\n<block>``, joined by ``\n``; MOSS-TTSD's processor also lists
a speaker without a voice, ``[S{i}]: None``); and continuation, where an assistant
audio block of prefix codes follows the user turn and the prompt is cut after
its gen-slot rows (the prompt then ends mid delay ramp, already in audio mode,
so no ``<|audio_start|>`` row is added). In generation mode the official
``generate()`` lets the model choose that ``<|audio_start|>`` row as its first
output; we put it in the prompt, as the official llama.cpp pipeline does: the
same rows, one moved.

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
from ..request.fields import PROMPT_FIELDS
from ..request.rules import check_written
from ..request.rules import unwritten_fields as _unwritten
from .delay import delay_layout
from .speakers import check_speaker_count, check_tags_have_voices
from .tokens import TokenIds


class TextTokenizer(Protocol):
    """What the prompt builder needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def id_to_token(self, id: int) -> str | None: ...


@dataclass(frozen=True)
class PromptSpec:
    """One request's prompt fields; ``None`` fields are written literally as ``None``.

    ``text``: what to say; ``None`` or blank only with ``ambient_sound`` (MOSS-SoundEffect),
    then written ``None`` as the official processor writes an absent text.
    ``reference_codes`` (T, n_vq) int codes of the reference voice (encoder output), or
    None: the one-voice form of ``references``. ``references``: one (T_i, n_vq) code matrix
    per dialogue speaker, position i for ``[S{i+1}]`` (at most ``MAX_SPEAKERS``); a ``None``
    entry (or an empty matrix) gives that speaker no voice but keeps the numbering.
    ``prefix_codes`` (T, n_vq): continuation from this audio (an assistant audio block, cut
    after its T gen-slot rows); its transcript belongs at the start of ``text``, as the
    official app puts it. ``tokens`` is the desired length in audio frames.
    """

    text: str | None
    reference_codes: np.ndarray | None = None
    instruction: str | None = None
    tokens: int | None = None
    quality: str | None = None
    sound_event: str | None = None
    ambient_sound: str | None = None
    language: str | None = None
    references: tuple[np.ndarray | None, ...] = ()
    prefix_codes: np.ndarray | None = None
    # no template writes a scene (MOSS-TTSD's writes "- Scene:\nNone" whatever is asked): set,
    # it is an error naming why (check_template_fields)
    scene: str | None = None


# -- the user turn's field lines, per template ---------------------------------------------------
#
# A template is the list of "- Label:\n<value>" lines between "- Reference(s):" and "- Text:",
# each naming the PromptSpec field it writes, or None for a line always written "None"; and how
# it lists the references. A member names its template (core/family.py); the engine config's
# ``prompt_template`` picks another. A field a request sets that its template does not write is
# an error naming why, never dropped.
FIELDS: tuple[str, ...] = PROMPT_FIELDS  # request/fields.py's PromptFields: the one list


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """One prompt template: its lines after ``- Reference(s):``, up to ``- Text:``.

    ``by_position``: the references are listed one per speaker position up to the highest
    speaker with a voice, ``[S{i}]: None`` for one without (MOSS-TTSD's processor), and a
    speaker tag without a voice is allowed (the model invents that voice). Otherwise only the
    speakers with a voice are listed (numbered by position) and every tag needs a voice.
    ``unwritten``: why a field the template does not write cannot be set. ``defaults``: what
    a line says when the request leaves its field unset (else ``None``), as the processor's
    own default argument says (MOSS-SoundEffect's ``tokens=125``).
    """

    name: str
    lines: tuple[tuple[str, str | None], ...]  # (label, PromptSpec field or None: "None")
    source: str  # the processor it is read from (docs/family.md)
    by_position: bool = False
    unwritten: str = ""
    defaults: tuple[tuple[str, object], ...] = ()  # (PromptSpec field, value when unset)

    def fields(self) -> frozenset[str]:
        return frozenset(f for _, f in self.lines if f is not None)


_GITHUB_LINES: tuple[tuple[str, str | None], ...] = (
    ("Instruction", "instruction"), ("Tokens", "tokens"), ("Quality", "quality"),
    ("Sound Event", "sound_event"), ("Ambient Sound", "ambient_sound"), ("Language", "language"),
)  # fmt: skip
TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (
        PromptTemplate(
            "moss", _GITHUB_LINES,
            "OpenMOSS/MOSS-TTS moss_tts_delay/processing_moss_tts.py (UserMessage, the GitHub "
            "processor)",
        ),
        PromptTemplate(
            "moss-ttsd",
            (("Instruction", "instruction"), ("Tokens", None), *_GITHUB_LINES[2:], ("Scene", None)),
            "MOSS-TTSD-v1.0's own processing_moss_tts.py (UserMessage; byte copy in "
            "diodiogod/TTS-Audio-Suite engines/moss_tts/impl/ttsd/)",
            by_position=True,
            unwritten="MOSS-TTSD-v1.0's own processor writes Tokens and Scene as None whatever is "
            "asked (the checkpoint ignores a duration and a scene): leave it out",
        ),
        PromptTemplate(
            "moss-sound-effect", _GITHUB_LINES,
            "MOSS-SoundEffect's own processing_moss_tts.py: the GitHub template, build_user_message's "
            "tokens defaulting to 125 (hub commit 1ff7f84, 'adjust default value for tokens')",
            defaults=(("tokens", 125),),
        ),
    )
}  # fmt: skip
DEFAULT_TEMPLATE = "moss"


def template(name: str) -> PromptTemplate:
    """The template called ``name``; an unknown name is a ConfigError listing the known ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ConfigError(f"unknown prompt_template {name!r}; known: {', '.join(TEMPLATES)}") from None


def _special(tokenizer: TextTokenizer, token_id: int, role: str) -> str:
    tok = tokenizer.id_to_token(token_id)
    if not tok:
        raise ConfigError(
            f"the tokenizer has no token with id {token_id} ({role}); "
            "is it the MOSS-TTS tokenizer matching this model's token ids?"
        )
    return tok


def _check_codes(codes: object, ids: TokenIds, name: str) -> np.ndarray | None:
    """``codes`` as (T, n_vq) int64 codes; None for None or no frames (the official
    llama.cpp pipeline: an empty reference is no reference)."""
    if codes is None:
        return None
    c = np.asarray(codes)
    if c.ndim != 2 or c.shape[1] != ids.n_vq:
        raise InputError(f"{name} must be (T, {ids.n_vq}), got shape {c.shape}")
    if not np.issubdtype(c.dtype, np.integer):
        raise InputError(f"{name} must be integers, got {c.dtype}")
    if c.shape[0] == 0:
        return None
    if c.min() < 0 or c.max() >= ids.audio_vocab_size:
        raise InputError(f"{name}: codes must be in [0, {ids.audio_vocab_size - 1}]")
    return c.astype(np.int64, copy=False)


def _check_references(spec: PromptSpec, ids: TokenIds) -> list[np.ndarray | None]:
    """The voices by speaker position (``[S1]`` first); checks shape, range and count."""
    if spec.reference_codes is not None and len(spec.references):
        raise InputError(
            "give the voice as reference_codes (one speaker) or as references (one per "
            "speaker), not both"
        )
    if spec.reference_codes is not None:
        return [_check_codes(spec.reference_codes, ids, "reference_codes")]
    if not isinstance(spec.references, (tuple, list)):
        raise InputError(
            f"references must be a tuple of code matrices, got {type(spec.references).__name__}"
        )
    check_speaker_count(len(spec.references))
    return [
        _check_codes(r, ids, f"references[{i}] (speaker [S{i + 1}])")
        for i, r in enumerate(spec.references)
    ]


def _check_text(spec: PromptSpec) -> str | None:
    """The text, or None where it is absent (allowed only with an ambient sound)."""
    if spec.text is not None and not isinstance(spec.text, str):
        raise InputError(f"text must be a string, got {type(spec.text).__name__}")
    if spec.text is not None and spec.text.strip():
        return spec.text
    if spec.ambient_sound is None or not str(spec.ambient_sound).strip():
        raise InputError("text is empty (only a sound effect, with ambient_sound, needs none)")
    return None


def _field(value: object) -> str:
    return "None" if value is None else str(value)


def build_prompt(
    tokenizer: TextTokenizer, ids: TokenIds, spec: PromptSpec, tmpl: PromptTemplate | None = None
) -> np.ndarray:
    """Build the (S, 1 + n_vq) int64 prompt for ``spec`` (see :func:`build_prompt_ex`)."""
    return build_prompt_ex(tokenizer, ids, spec, tmpl=tmpl)[0]


def build_prompt_ex(
    tokenizer: TextTokenizer,
    ids: TokenIds,
    spec: PromptSpec,
    *,
    prefix: bool = False,
    tmpl: PromptTemplate | None = None,
) -> tuple[np.ndarray, int]:
    """Build the (S, 1 + n_vq) int64 prompt for ``spec``, and with ``prefix`` the number
    of its leading rows that do not depend on the text (everything up to ``- Text:\n``;
    0 when the tokenizer merges across that boundary). Requests sharing voice and
    fields share those rows, which the engine's prefix cache reuses.

    Raises :class:`InputError` for empty text (allowed only with ``ambient_sound``), a bad
    reference or prefix (shape, dtype, range), both reference forms at once, more than
    ``MAX_SPEAKERS`` references, a speaker tag without a voice, a bad ``tokens`` value, or
    fields containing the model's special-token strings (they would be tokenised as control
    tokens); :class:`ConfigError` when the tokenizer lacks the special ids or does not treat
    them as single tokens. ``tmpl``: the template (default: ``TEMPLATES["moss"]``); a field
    it does not write is an InputError.
    """
    built = _build(tokenizer, ids, spec, tokenizer.encode, prefix=prefix, count_text=False, tmpl=tmpl)
    return built.rows, built.prefix_rows


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    """A prompt and what the engine needs to know about it."""

    rows: np.ndarray  # (S, 1 + n_vq) int64
    prefix_rows: int  # leading rows that do not depend on the text (0: not asked, or merged)
    text_rows: int  # rows of the text itself: the prompt's rows less the template's (0: no text)
    # continuation: the prefix's T gen-slot rows that end the prompt (the audio block began on
    # the row before them, its <|audio_start|>); generation starts in audio mode with
    # audio_length = audio_prefix_rows + 1, as the official generate() does. 0: generation
    # mode (the prompt ends with the <|audio_start|> row).
    audio_prefix_rows: int = 0


class PromptBuilder:
    """:func:`build_prompt_ex` for one tokenizer, tokenising each request's text once.

    The template's pieces without the text (the head up to ``- Text:\\n``, which depends
    only on the fields and the voices' lengths; the closing turn; the marker check) are
    the same for many requests: each is tokenised once and remembered (the last
    ``cache_size``), so a request costs one ``encode``, of its whole prompt.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        ids: TokenIds,
        cache_size: int = 64,
        tmpl: PromptTemplate | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids = ids
        self.template = tmpl or TEMPLATES[DEFAULT_TEMPLATE]
        self._fixed = functools.lru_cache(maxsize=cache_size)(self._encode_fixed)

    def _encode_fixed(self, piece: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(piece))

    def build(self, spec: PromptSpec, *, prefix: bool = False) -> BuiltPrompt:
        """The prompt for ``spec`` (errors as :func:`build_prompt_ex`); ``text_rows`` always,
        ``prefix_rows`` with ``prefix``."""
        return _build(
            self.tokenizer, self.ids, spec, self._fixed, prefix=prefix, count_text=True, tmpl=self.template
        )


@dataclass(frozen=True, slots=True)
class _Markers:
    """The special-token strings, looked up by id."""

    im_start: str
    im_end: str
    audio_start: str
    audio_end: str
    user_slot: str
    gen_slot: str
    all: frozenset[str]


def _markers(tokenizer: TextTokenizer, ids: TokenIds) -> _Markers:
    im_start = _special(tokenizer, ids.im_start, "<|im_start|>")
    im_end = _special(tokenizer, ids.im_end, "<|im_end|>")
    audio_start = _special(tokenizer, ids.audio_start, "<|audio_start|>")
    audio_end = _special(tokenizer, ids.audio_end, "<|audio_end|>")
    user_slot = _special(tokenizer, ids.user_slot, "audio user slot")
    gen_slot = _special(tokenizer, ids.gen_slot, "audio gen slot")
    others = (_special(tokenizer, ids.pad, "<|endoftext|>"),
              _special(tokenizer, ids.delay_slot, "audio delay slot"))
    every = frozenset((im_start, im_end, audio_start, audio_end, user_slot, gen_slot, *others))
    return _Markers(im_start, im_end, audio_start, audio_end, user_slot, gen_slot, every)


def _check_fields(spec: PromptSpec, text: str | None, markers: _Markers) -> None:
    """No field may hold a marker string: it would be tokenised as a control token."""
    fields = {"text": text, **{f: getattr(spec, f) for f in FIELDS}}
    for name, value in fields.items():
        if value is None:
            continue
        for sp in markers.all:
            if sp in str(value):
                raise InputError(f"{name} contains the special token string {sp!r}")


def field_lines(spec: PromptSpec, tmpl: PromptTemplate) -> str:
    """The template's lines between ``- Reference(s):`` and ``- Text:`` for ``spec``, as the
    prompt's text holds them (to compare with a processor's user message)."""
    unset = dict(tmpl.defaults)
    return "".join(
        f"- {label}:\n{_field(None if name is None else _value(spec, name, unset))}\n"
        for label, name in tmpl.lines
    )


def _value(spec: PromptSpec, name: str, unset: dict[str, object]) -> object:
    value = getattr(spec, name)
    return unset.get(name) if value is None else value


def unwritten_fields(tmpl: PromptTemplate, values: object) -> list[str]:
    """The fields set in ``values`` (a PromptSpec, a field struct) that the template does
    not write."""
    return _unwritten(tmpl.fields(), values)


def check_template_fields(tmpl: PromptTemplate, values: object) -> None:
    """A field set that the template does not write would be dropped silently: a FieldError
    naming it, and why when the template says (request/rules.py)."""
    check_written(tmpl.name, tmpl.fields(), values, why=tmpl.unwritten)


def reference_lines(refs: Sequence[object | None], tmpl: PromptTemplate, block: Callable[[int], str]) -> str:
    """The ``- Reference(s):`` value for the voices by speaker position (``None``: no voice):
    ``block(i)`` is voice i's audio block. Only the voiced speakers, numbered by position (the
    GitHub processor); or, with ``tmpl.by_position``, every position up to the last voiced one,
    ``[S{i}]: None`` for a speaker without a voice (MOSS-TTSD's). ``None`` when no one has a voice."""
    last = max((i for i, r in enumerate(refs) if r is not None), default=-1)
    lines = [
        f"[S{i + 1}]:\n{block(i)}" if r is not None else f"[S{i + 1}]: None"
        for i, r in enumerate(refs[: last + 1])
        if r is not None or tmpl.by_position
    ]
    return "\n".join(lines) or "None"


def _build(
    tokenizer: TextTokenizer,
    ids: TokenIds,
    spec: PromptSpec,
    encode_fixed: Callable[[str], Sequence[int]],
    *,
    prefix: bool,
    count_text: bool,
    tmpl: PromptTemplate | None = None,
) -> BuiltPrompt:
    """The prompt; ``encode_fixed`` tokenises the pieces that do not hold the text."""
    tmpl = tmpl or TEMPLATES[DEFAULT_TEMPLATE]
    text = _check_text(spec)
    check_template_fields(tmpl, spec)
    if spec.tokens is not None and (
        isinstance(spec.tokens, bool) or not isinstance(spec.tokens, int) or spec.tokens < 1
    ):
        raise InputError(
            f"tokens (duration in frames) must be a positive integer, got {spec.tokens!r}"
        )
    refs = _check_references(spec, ids)
    if not tmpl.by_position:
        check_tags_have_voices(text, refs)
    cont = _check_codes(spec.prefix_codes, ids, "prefix_codes")
    mk = _markers(tokenizer, ids)
    _check_fields(spec, text, mk)

    k_n = ids.n_vq
    # (speaker number, codes, slot rows) of each given voice; a None keeps its number
    voices = [(i + 1, r, r.shape[0] + k_n - 1) for i, r in enumerate(refs) if r is not None]
    slots_of = {n - 1: slots for n, _, slots in voices}
    ref_str = reference_lines(
        refs, tmpl, lambda i: f"{mk.audio_start}{mk.user_slot * slots_of[i]}{mk.audio_end}"
    )
    head = (
        f"{mk.im_start}user\n<user_inst>\n"
        f"- Reference(s):\n{ref_str}\n"
        + field_lines(spec, tmpl)
        + "- Text:\n"
    )
    n_cont = 0 if cont is None else cont.shape[0]
    # continuation: the assistant turn's audio block up to its last gen slot (the official
    # processor builds the whole block, then drops its n_vq - 1 delay-slot rows and the rest)
    turn_end = f"\n</user_inst>{mk.im_end}\n{mk.im_start}assistant\n"
    audio = mk.audio_start + mk.gen_slot * n_cont if n_cont else ""
    text_ids = np.asarray(tokenizer.encode(head + _field(text) + turn_end + audio), dtype=np.int64)
    marker = encode_fixed(mk.audio_start)
    if list(marker) != [ids.audio_start]:
        raise ConfigError(
            f"the tokenizer encodes {mk.audio_start!r} as {list(marker)[:8]}, not the single "
            f"id {ids.audio_start}: it does not treat the model's markers as special tokens"
        )
    starts = _verify(text_ids, ids, [slots for _, _, slots in voices], n_cont)

    s_n = text_ids.shape[0] + (0 if n_cont else 1)
    prompt = np.full((s_n, 1 + k_n), ids.audio_pad_code, dtype=np.int64)
    prompt[: text_ids.shape[0], 0] = text_ids
    if not n_cont:
        prompt[-1, 0] = ids.audio_start
    for (_, codes, slots), start in zip(voices, starts, strict=False):
        prompt[start + 1 : start + 1 + slots, 1:] = delay_layout(codes, ids.audio_pad_code)
    if cont is not None:
        # the first T rows of the prefix's delay layout: its last frames' upper codebooks
        # are still to come, as the ramp of the generation that continues it
        prompt[s_n - n_cont :, 1:] = delay_layout(cont, ids.audio_pad_code)[:n_cont]
    n_prefix = n_text = 0
    if prefix or count_text:
        head_ids = np.asarray(encode_fixed(head), dtype=np.int64)
        if prefix and head_ids.size < text_ids.size and np.array_equal(
            text_ids[: head_ids.size], head_ids
        ):
            n_prefix = int(head_ids.size)
        if count_text and text is not None:
            # the assistant block's markers are single tokens (checked by _verify)
            fixed = int(head_ids.size) + len(encode_fixed(turn_end)) + (n_cont + 1 if n_cont else 0)
            n_text = max(0, int(text_ids.size) - fixed)
    return BuiltPrompt(prompt, n_prefix, n_text, n_cont)


def _verify(text_ids: np.ndarray, ids: TokenIds, blocks: list[int], n_gen: int) -> list[int]:
    """Check the markers came out as single tokens where expected.

    ``blocks``: the slot rows of each reference block, in order; ``n_gen``: the gen slots
    of the assistant block that ends the prompt (0: none). Returns the row of each
    reference block's ``<|audio_start|>``.
    """
    expected = {
        ids.im_start: 2,
        ids.im_end: 1,
        ids.audio_start: len(blocks) + (1 if n_gen else 0),
        ids.audio_end: len(blocks),
        ids.user_slot: sum(blocks),
        ids.gen_slot: n_gen,
        ids.delay_slot: 0,
    }
    for token_id, count in expected.items():
        got = int(np.count_nonzero(text_ids == token_id))
        if got != count:
            raise ConfigError(
                f"tokenising the prompt gave {got} x id {token_id}, expected {count}: the "
                "tokenizer does not treat the model's special tokens as single tokens"
            )
    if text_ids[0] != ids.im_start:
        raise ConfigError(f"the prompt does not start with <|im_start|> (id {ids.im_start})")
    starts = [int(i) for i in np.flatnonzero(text_ids == ids.audio_start)]
    ends = [int(i) for i in np.flatnonzero(text_ids == ids.audio_end)]
    for start, end, n_slots in zip(starts, ends, blocks, strict=False):
        if end != start + n_slots + 1 or not np.all(text_ids[start + 1 : end] == ids.user_slot):
            raise ConfigError(
                "a reference block did not tokenise as <|audio_start|>, "
                f"{n_slots} x slot, <|audio_end|>: the tokenizer merges the markers"
            )
    if n_gen:
        last = starts[-1]
        if last != text_ids.size - n_gen - 1 or not np.all(text_ids[last + 1 :] == ids.gen_slot):
            raise ConfigError(
                f"the prefix's audio block did not tokenise as <|audio_start|>, {n_gen} x gen "
                "slot at the prompt's end: the tokenizer merges the markers"
            )
    return starts[: len(blocks)]


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
