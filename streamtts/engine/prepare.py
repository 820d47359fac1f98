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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..audio.reference import encode_reference, load_reference
from ..codec import AudioEncoder
from ..config import EngineConfig
from ..constants import FRAME_S, MAX_TEXT_CHARS
from ..core.prompt import PromptBuilder, PromptSpec, TextTokenizer
from ..core.tokens import TokenIds
from ..errors import InputError, PromptTooLongError, ReferenceAudioError
from ..model.tables import Embedder
from ..request import PreparedRequest, ReferenceLike, StreamOptions, StreamStats, Voice
from ..text.normalize import normalize_text
from ..text.segmenter import speakable, split_text
from .prefix_cache import prefix_key

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class LongText:
    """Text too long for one generation: spoken as these segments, in this voice.

    The segments are cut from the text as it is to be spoken (normalised, when
    normalisation is on): their own requests must not normalise them again.
    """

    segments: list[str]
    voice: Voice | None


class Preparer:
    def __init__(
        self,
        cfg: EngineConfig,
        ids: TokenIds,
        tokenizer: TextTokenizer,
        embedder: Embedder,
        encoder_factory: Callable[[], AudioEncoder],
        n_ctx_seq: int,
    ) -> None:
        self.cfg = cfg
        self.ids = ids
        self.tokenizer = tokenizer
        self.prompts = PromptBuilder(tokenizer, ids)
        self.embedder = embedder
        self._encoder_factory = encoder_factory
        self._encoder: AudioEncoder | None = None
        self._encoder_lock = threading.Lock()
        self.n_ctx_seq = n_ctx_seq

    # -- reference voices -----------------------------------------------------------------
    def encoder(self) -> AudioEncoder:
        with self._encoder_lock:  # loaded on first use: most requests never need it
            if self._encoder is None:
                self._encoder = self._encoder_factory()
            return self._encoder

    def encode_voice(self, reference: str | Path | bytes | np.ndarray, sample_rate: int | None = None, name: str = "") -> Voice:
        wav = load_reference(reference, sample_rate)
        codes = encode_reference(self.encoder(), wav)
        if codes.ndim != 2 or codes.shape[1] != self.ids.n_vq or codes.shape[0] == 0:
            raise ReferenceAudioError(f"the encoder returned codes of shape {codes.shape}, expected (T, {self.ids.n_vq})")
        return Voice(codes=codes, name=name)

    def _reference_codes(self, reference: ReferenceLike) -> np.ndarray | None:
        if reference is None:
            return None
        if isinstance(reference, Voice):
            return reference.codes
        return self.encode_voice(reference).codes

    # -- prompt -----------------------------------------------------------------------------
    FRAMES_PER_TOKEN = 4.0  # generous speech length per text token (about 3 in English)
    TEMPLATE_ROWS = 80  # prompt rows besides the text and the reference block
    MIN_PREFIX_ROWS = 16  # shorter shared prefixes are not worth a cache entry

    def _fits_one_generation(self, tokens: int, ref: np.ndarray | None) -> bool:
        """Whether prompt + expected speech fit one stream's context (else: speak it in segments).

        ``tokens``: the text's rows in its prompt. ``max_new_tokens`` is a cap the caller
        chose, not a reason to split.
        """
        ref_rows = 0 if ref is None else ref.shape[0] + self.ids.n_vq
        speech = int(tokens * self.FRAMES_PER_TOKEN) + self.ids.n_vq
        return self.TEMPLATE_ROWS + tokens + ref_rows + speech <= self.n_ctx_seq

    def prepare(
        self, rid: int, text: str, reference: ReferenceLike, options: StreamOptions, sink: Any, stats: StreamStats
    ) -> PreparedRequest | LongText:
        """The request's prompt rows and embeddings; or, for text longer than one generation
        fits in the context, its segments (and the voice encoded once for all of them)."""
        t0 = time.monotonic()
        if not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}")
        if len(text) > MAX_TEXT_CHARS:
            raise InputError(
                f"text is {len(text)} characters; the limit per request is {MAX_TEXT_CHARS}: split "
                "it into several requests, or send it to `streamtts serve` (its WebSocket and "
                "POST /v1/audio/speech cut text into segments and take more)"
            )
        normalize = self.cfg.normalize_text if options.normalize is None else options.normalize
        clean = normalize_text(text) if normalize else text
        if not clean.strip():
            raise InputError("text is empty" + (" after normalisation" if text.strip() else ""))
        if not speakable(clean):  # the server's segmenter drops such text too: one rule everywhere
            raise InputError(f"text {text.strip()[:40]!r} has nothing to say (no letters or digits)")
        sampling = (options.sampling or self.cfg.sampling).validate()
        if options.tokens is not None and options.tokens < 1:
            raise InputError(f"tokens (duration in frames) must be >= 1, got {options.tokens}")
        if options.max_new_tokens is not None and options.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {options.max_new_tokens}")
        if options.fixed_frames is not None and options.fixed_frames < 1:
            raise InputError(f"fixed_frames must be >= 1, got {options.fixed_frames}")
        ref = self._reference_codes(reference)
        spec = PromptSpec(
            text=clean,
            reference_codes=ref,
            instruction=options.instruction,
            tokens=options.tokens,
            quality=options.quality,
            language=options.language,
        )
        built = self.prompts.build(spec, prefix=self.cfg.prefix_cache_mib > 0)
        if not self._fits_one_generation(built.text_rows, ref):
            segments = split_text(clean)
            if len(segments) > 1:  # one segment that doesn't fit: PromptTooLongError below says so
                voice = reference if isinstance(reference, Voice) else (None if ref is None else Voice(codes=ref))
                return LongText(segments, voice)
        prompt, n_prefix = built.rows, built.prefix_rows
        if n_prefix < self.MIN_PREFIX_ROWS:
            n_prefix = 0
        rows = prompt.shape[0]
        room = self.n_ctx_seq - rows + 1  # steps that fit after the prompt
        if room < self.ids.n_vq:
            ref_s = f", reference voice {ref.shape[0] * FRAME_S:.1f} s" if ref is not None else ""
            raise PromptTooLongError(
                f"prompt is {rows} rows (text {len(clean)} chars{ref_s}); the first audio frame needs "
                f"{self.ids.n_vq} more steps, but the per-stream context n_ctx is {self.n_ctx_seq}: "
                "shorten the text or reference, or raise n_ctx"
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
            stats=stats,
        )
