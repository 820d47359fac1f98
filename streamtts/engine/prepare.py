"""Turn a request into prompt rows and their embeddings (off the engine thread).

Runs on a worker thread: text normalisation, tokenising, reference-voice
encoding and the prompt's summed embeddings, so the engine thread only ever
sees ready matrices. Each happens once per request: the text is normalised once
(a long text's segments are cut from the normalised text and not normalised
again), and tokenised once, as part of its whole prompt (:class:`PromptBuilder`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio.reference import encode_reference, encoder_input, load_clip
from ..codec import AudioEncoder
from ..config import EngineConfig
from ..constants import FRAME_S, MAX_TEXT_CHARS
from ..core.family import DEFAULT_KIND, MEMBERS, Member, language_for
from ..core.prompt import PromptBuilder, PromptSpec, TextTokenizer, template
from ..core.speakers import check_speakers, speaker_tags
from ..core.tokens import TokenIds
from ..errors import InputError, PromptTooLongError, ReferenceAudioError
from ..model.tables import Embedder
from ..request import (
    PROMPT_FIELDS,
    ChunkSink,
    FieldError,
    LexiconLayer,
    PreparedRequest,
    ReferenceLike,
    SpeakersLike,
    StreamOptions,
    StreamStats,
    Voice,
    VoiceRequest,
    check,
)
from ..request.rules import check_sampling
from ..request.voices import SegmentSpeakers, check_speaker_texts, speaker_number, speaker_tuple
from ..text.lexicon import Lexicon, apply_lexicons
from ..text.normalize import normalize_text
from ..text.segmenter import speakable, split_text
from ..text.ttsd import merge_speaker_turns, normalize_ttsd, prefixed_text
from ..text.voicegen import normalize_instruction as voicegen_instruction
from ..text.voicegen import normalize_text as voicegen_text
from .prefix_cache import prefix_key

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LongText:
    """Text too long for one generation: spoken as these segments, in this voice (or these
    speakers' voices), the first continuing ``prefix``.

    The segments are cut from the text as it is to be spoken (normalised, when
    normalisation is on, the prefix's transcript included): their own requests must not
    normalise them again, nor prepend the transcript. ``instruction``: the request's, as each
    segment's prompt is to write it (normalised already, when the member normalises it).
    """

    segments: list[str]
    voice: Voice | None
    speakers: dict[str, Voice] | None = None
    prefix: Voice | None = None
    instruction: str | None = None
    # the request's lexicons, compiled (each segment's prompt applies them: its own words)
    lexicons: tuple[LexiconLayer, ...] = ()


def lexicon_layers(options: StreamOptions) -> tuple[LexiconLayer, ...]:
    """The lexicons a request's text is read with: its own map (compiled here, checked: a
    :class:`FieldError` naming the entry at fault), then ``options.lexicons``. A stored
    lexicon's id is the server's to resolve (it replaces the field with the compiled one)."""
    value = options.lexicon
    if value is None:
        return options.lexicons
    if isinstance(value, str):
        raise FieldError(
            "lexicon",
            f"lexicon {value[:80]!r} names a stored lexicon: only a server (streamtts serve, POST "
            "/v1/lexicons) holds those; give the entries as a map here",
        )
    return (Lexicon.compile(value), *options.lexicons)


def join_prefix_text(prefix_text: str, text: str) -> str:
    """The prefix's transcript before the text (as the official app does), one space between
    them unless either side already has one."""
    if not prefix_text or not text or prefix_text[-1].isspace() or text[0].isspace():
        return prefix_text + text
    return f"{prefix_text} {text}"


class Preparer:
    def __init__(
        self,
        cfg: EngineConfig,
        ids: TokenIds,
        tokenizer: TextTokenizer,
        embedder: Embedder,
        encoder_factory: Callable[[], AudioEncoder],
        n_ctx_seq: int,
        member: Member | None = None,
    ) -> None:
        self.cfg = cfg
        self.ids = ids
        self.tokenizer = tokenizer
        self.member = member or MEMBERS[DEFAULT_KIND]
        self.prompts = PromptBuilder(tokenizer, ids, tmpl=template(cfg.prompt_template or self.member.template))
        self.embedder = embedder
        self._encoder_factory = encoder_factory
        self._encoder: AudioEncoder | None = None
        self._encoder_lock = threading.Lock()
        self.n_ctx_seq = n_ctx_seq

    def normalize(self, text: str) -> str:
        """``text`` through the member's own normaliser (core/family.py ``normalizer``)."""
        kind = self.member.normalizer
        if kind == "ttsd":
            return normalize_ttsd(text)
        return voicegen_text(text) if kind == "voicegen" else normalize_text(text)

    def normalize_instruction(self, instruction: str | None) -> str | None:
        """The instruction as the member's own processor writes it when normalisation is on:
        MOSS-VoiceGenerator's through its ``normalize_instruction``; the others' as given."""
        if instruction is None or self.member.normalizer != "voicegen":
            return instruction
        return voicegen_instruction(instruction)

    # -- reference voices -----------------------------------------------------------------
    def encoder(self) -> AudioEncoder:
        with self._encoder_lock:  # loaded on first use: most requests never need it
            if self._encoder is None:
                self._encoder = self._encoder_factory()
            return self._encoder

    def encode_voice(self, reference: str | Path | bytes | np.ndarray, sample_rate: int | None = None, name: str = "") -> Voice:
        clip = load_clip(reference, sample_rate)
        return Voice(codes=self._encode(clip), name=name, clip=clip)

    def _encode(self, clip: np.ndarray) -> np.ndarray:
        codes = encode_reference(self.encoder(), encoder_input(clip))
        n = self.ids.n_vq
        if codes.ndim != 2 or codes.shape[1] < n or codes.shape[0] == 0:
            raise ReferenceAudioError(f"the encoder returned codes of shape {codes.shape}, expected (T, {n})")
        return np.ascontiguousarray(codes[:, :n])  # an RVQ: the first n levels are the n-level codes

    def speaker_prefix(self, speakers: SpeakersLike, texts: Mapping[str, str]) -> tuple[Voice, str]:
        """A continuation of the speakers' own clips (MOSS-TTSD's app: ``_encode_concat_prompt_audio``
        and ``_build_prefixed_text``): the prefix is ONE encode of the clips of the speakers
        ``texts`` names, joined end to end in speaker order (each at 24 kHz first), and its
        transcript is theirs, each tagged ``[S{n}]`` unless it starts so. A speaker given as
        codes has no clip to join: an error naming it."""
        numbers = check_speaker_texts(texts, speakers, None, None)
        by_number = {speaker_number(k): v for k, v in speakers.items()}
        clips = []
        for n in sorted(numbers):
            v = by_number[n]
            clip = v.clip if isinstance(v, Voice) else load_clip(v) if v is not None else None
            if clip is None:
                raise InputError(
                    f"speaker_texts.S{n}: S{n}'s voice is given as codes; continuing the speakers' clips "
                    f"needs S{n}'s clip (audio), encoded with the others' in one piece"
                )
            clips.append(clip)
        joined = np.concatenate(clips)
        said = "".join(prefixed_text("", {n: numbers[n]}) for n in sorted(numbers))
        return Voice(codes=self._encode(joined), name="+".join(f"S{n}" for n in sorted(numbers)), clip=joined), said

    def join_prefix(self, prefix_text: str, text: str, normalize: bool) -> str:
        """The text to speak after a prefix whose transcript is ``prefix_text``: with the
        MOSS-TTSD text path and a tagged transcript, merged as its ``_build_prefixed_text``
        does (one speaker's consecutive turns joined), the dialogue normalised before and the
        whole after (its app's order); else the transcript, a space, the text."""
        if self.member.normalizer == "ttsd" and speaker_tags(prefix_text[:8]):
            merged = merge_speaker_turns(prefix_text + (self.normalize(text) if normalize else text))
            return self.normalize(merged) if normalize else merged
        joined = join_prefix_text(prefix_text, text)
        return self.normalize(joined) if normalize else joined

    def voice_for(self, voice: ReferenceLike, what: str) -> Voice | None:
        """``voice`` for this model: a clip encoded; codes of more levels cut to the model's
        n_vq (the codec is residual: its first n levels are what an n-level model reads);
        fewer levels, or codes that are no codes, an error naming ``what``."""
        if voice is None:
            return None
        v = voice if isinstance(voice, Voice) else self.encode_voice(voice)
        c = np.asarray(v.codes)
        n = self.ids.n_vq
        if c.ndim != 2 or c.shape[1] < n or c.shape[0] == 0:
            raise InputError(f"{what}: the voice's codes are of shape {c.shape}; this model needs (T, {n}), T >= 1")
        if not np.issubdtype(c.dtype, np.integer):
            raise InputError(f"{what}: the voice's codes must be integers, got {c.dtype}")
        if c.min() < 0 or c.max() >= self.ids.audio_vocab_size:
            raise InputError(f"{what}: the voice's codes must be in [0, {self.ids.audio_vocab_size - 1}]")
        return v if c.shape[1] == n else Voice(codes=np.ascontiguousarray(c[:, :n]), name=v.name)

    def _speakers(self, ordered: tuple[ReferenceLike, ...], speakers: SpeakersLike, text: str | None) -> dict[str, Voice]:
        """The dialogue's voices (``S1`` -> Voice; ``ordered``: by position), checked against
        the text's tags: every tag has a voice unless the template lists a speaker without one
        (MOSS-TTSD's; the prompt builder checks it, for every prompt); every voice a tag,
        unless this is one segment of a longer dialogue."""
        if not isinstance(speakers, SegmentSpeakers):
            check_speakers(text, ordered, voiceless=self.prompts.template.by_position)
        out: dict[str, Voice] = {}
        for i, v in enumerate(ordered):
            voice = self.voice_for(v, f"speakers.S{i + 1}")
            if voice is not None:
                out[f"S{i + 1}"] = voice
        return out

    def _references(self, speakers: dict[str, Voice]) -> tuple[np.ndarray | None, ...]:
        if not speakers:
            return ()
        last = max(int(k[1:]) for k in speakers)
        return tuple(speakers[f"S{i}"].codes if f"S{i}" in speakers else None for i in range(1, last + 1))

    # -- prompt -----------------------------------------------------------------------------
    FRAMES_PER_TOKEN = 4.0  # generous speech length per text token (about 3 in English)
    TEMPLATE_ROWS = 80  # prompt rows besides the text and the reference block
    MIN_PREFIX_ROWS = 16  # shorter shared prefixes are not worth a cache entry

    def _fits_one_generation(self, tokens: int, ref_rows: int) -> bool:
        """Whether prompt + expected speech fit one stream's context (else: speak it in segments).

        ``tokens``: the text's rows in its prompt; ``ref_rows``: its voices' (references and
        prefix). ``max_new_tokens`` is a cap the caller chose, not a reason to split.
        """
        speech = int(tokens * self.FRAMES_PER_TOKEN) + self.ids.n_vq
        return self.TEMPLATE_ROWS + tokens + ref_rows + speech <= self.n_ctx_seq

    def prepare(
        self,
        rid: int,
        text: str,
        reference: ReferenceLike,
        options: StreamOptions,
        sink: ChunkSink,
        stats: StreamStats,
        *,
        speakers: SpeakersLike | None = None,
        prefix: ReferenceLike = None,
        prefix_text: str | None = None,
        speaker_texts: Mapping[str, str] | None = None,
    ) -> PreparedRequest | LongText:
        """The request's prompt rows and embeddings; or, for text longer than one generation
        fits in the context, its segments (and the voices encoded once for all of them).

        ``speakers``: a dialogue's voices (``S1`` -> voice of the text's ``[S1]``), instead
        of one ``reference``. ``prefix``: audio the generation continues (its transcript
        ``prefix_text`` goes before the text); or ``speaker_texts``, the transcripts of the
        speakers' own clips, which are then the prefix (:meth:`speaker_prefix`). An empty text
        is valid with ``options.ambient_sound`` (a sound, no speech: the prompt's text is ``None``).
        """
        t0 = time.monotonic()
        if not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}")
        sampling = check(options, fixed_frames=options.fixed_frames, chunk_frames=options.chunk_frames) or check_sampling(
            self.cfg.sampling
        )
        ordered = VoiceRequest(
            reference=reference, speakers=speakers, prefix=prefix, prefix_text=prefix_text, speaker_texts=speaker_texts
        ).check()
        if speaker_texts and speakers:
            # each speaker's clip encoded once: its voice, and a piece of the joined prefix
            speakers = {k: self.voice_for(v, f"speakers.{k}") for k, v in speakers.items()}
            ordered = speaker_tuple(speakers)
            prefix, prefix_text = self.speaker_prefix(speakers, speaker_texts)
        if len(text) + len(prefix_text or "") > MAX_TEXT_CHARS:
            raise InputError(
                f"text is {len(text)} characters; the limit per request is {MAX_TEXT_CHARS}: split "
                "it into several requests, or send it to `streamtts serve` (its WebSocket and "
                "POST /v1/audio/speech cut text into segments and take more)"
            )
        normalize = self.cfg.normalize_text if options.normalize is None else options.normalize
        if prefix_text is not None:
            clean = self.join_prefix(prefix_text, text, normalize)
            text = join_prefix_text(prefix_text, text)  # as given, for the messages below
        else:
            clean = self.normalize(text) if normalize else text
        lexicons = lexicon_layers(options)
        # what the prompt says: the lexicon's readings (the word times keep ``text``'s words)
        spoken = apply_lexicons(clean, lexicons) if lexicons else clean
        sound_only = not clean.strip() and options.ambient_sound is not None
        if not sound_only:
            if not clean.strip():
                raise InputError(
                    "text is empty" + (" after normalisation" if text.strip() else "")
                    + " (an empty text is valid only with ambient_sound)"
                )
            if not speakable(clean):  # the server's segmenter drops such text too: one rule everywhere
                raise InputError(f"text {text.strip()[:40]!r} has nothing to say (no letters or digits)")
        language = language_for(self.member.language_form, options.language)
        voice = self.voice_for(reference, "reference")
        cast = self._speakers(ordered, speakers, clean) if speakers else {}
        refs = self._references(cast)
        start = self.voice_for(prefix, "prefix")
        ref = None if voice is None else voice.codes
        instruction = self.normalize_instruction(options.instruction) if normalize else options.instruction
        fields = {f: getattr(options, f) for f in PROMPT_FIELDS} | {"language": language, "instruction": instruction}
        spec = PromptSpec(
            text=None if sound_only else spoken,
            reference_codes=ref,
            references=refs,
            prefix_codes=None if start is None else start.codes,
            **fields,
        )
        built = self.prompts.build(spec, prefix=self.cfg.prefix_cache_mib > 0)
        voices = [c for c in (ref, *refs, None if start is None else start.codes) if c is not None]
        ref_rows = sum(c.shape[0] + self.ids.n_vq for c in voices)
        if not sound_only and not self._fits_one_generation(built.text_rows, ref_rows):
            segments = split_text(clean)  # as written: each segment's request applies the lexicons
            if len(segments) > 1:  # one segment that doesn't fit: PromptTooLongError below says so
                return LongText(segments, voice, cast or None, start, instruction, lexicons)
        prompt, n_prefix = built.rows, built.prefix_rows
        if n_prefix < self.MIN_PREFIX_ROWS:
            n_prefix = 0
        rows = prompt.shape[0]
        room = self.n_ctx_seq - rows + 1  # steps that fit after the prompt
        if room < self.ids.n_vq:
            voice_s = sum(c.shape[0] for c in voices) * FRAME_S
            ref_s = f", voices {voice_s:.1f} s" if voices else ""
            raise PromptTooLongError(
                f"prompt is {rows} rows (text {len(spoken)} chars{ref_s}); the first audio frame needs "
                f"{self.ids.n_vq} more steps, but the per-stream context n_ctx is {self.n_ctx_seq}: "
                "shorten the text or the voices, or raise n_ctx"
            )
        max_new = min(options.max_new_tokens or self.cfg.max_new_tokens, room)
        if options.fixed_frames is not None:  # benchmarks: fixed length unless cut explicitly
            max_new = min(options.max_new_tokens or room, room, options.fixed_frames + self.ids.n_vq)
        self.embedder.check_ids(prompt)
        embd = self.embedder.embed_rows(prompt)
        seed = options.seed if options.seed is not None else secrets.randbits(63)
        stats.prepare_s = time.monotonic() - t0
        return PreparedRequest(
            rid=rid,
            prompt=prompt,
            prompt_embd=embd,
            sampling=sampling,
            seed=int(seed) & ((1 << 64) - 1),
            max_new_tokens=int(max_new),
            fixed_frames=options.fixed_frames,
            sink=sink,
            prefix_rows=n_prefix,
            prefix_key=prefix_key(prompt, n_prefix) if n_prefix else b"",
            prefix_session=voice.session if voice is not None and n_prefix else 0,
            audio_prefix_rows=built.audio_prefix_rows,
            keep_rows=options.rows,
            chunk_frames=tuple(options.chunk_frames or ()),
            playback_buffer_s=(options.playback_buffer_ms or 0.0) / 1000.0,
            stats=stats,
        )
