"""Word times in the sans-I/O session: `alignment` before its audio, per context, characters
on request, and a cancel's `done` saying how far the client was sent audio."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from streamtts.request import WordTime
from streamtts.server.session import SendAudio, SendText, Session, SessionSettings, Synthesize


def session(sent: dict[str | None, float]) -> Session:
    return Session(SessionSettings(), sent_audio=lambda cid: sent.get(cid, 0.0))


def send(s: Session, obj: dict[str, Any]) -> list[Any]:
    s.receive_text(json.dumps(obj))
    return s.actions()


def texts(actions: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(a.data) for a in actions if isinstance(a, SendText)]


PCM = np.zeros(1920, np.float32)
WORDS = [WordTime("Hello", 0.0, 0.3, 0, 5), WordTime("there,", 0.35, 0.7, 6, 12), WordTime("friend.", 0.8, 1.2, 13, 20)]


def test_alignment_goes_before_its_audio_and_only_when_asked() -> None:
    s = session({})
    send(s, {"type": "start", "timestamps": "words"})
    acts = send(s, {"type": "text", "text": "Hello there, friend.", "flush": True})
    seg = next(a for a in acts if isinstance(a, Synthesize))
    s.audio(PCM, 1, None, WORDS[:2], seg.index)
    out = s.actions()
    assert isinstance(out[0], SendText) and isinstance(out[-1], SendAudio)
    msg = json.loads(out[0].data)
    assert msg == {"type": "alignment", "words": [{"word": "Hello", "start": 0.0, "end": 0.3},
                   {"word": "there,", "start": 0.35, "end": 0.7}], "estimated": True}  # fmt: skip
    quiet = session({})
    send(quiet, {"type": "start"})
    send(quiet, {"type": "text", "text": "Hello there.", "flush": True})
    quiet.audio(PCM, 1, None, WORDS[:1], 0)
    assert not any(isinstance(a, SendText) for a in quiet.actions())  # not asked: no alignment


def test_chars_spell_the_segments_text() -> None:
    s = session({})
    send(s, {"type": "start", "timestamps": "chars"})
    send(s, {"type": "text", "text": "Hello there, friend.", "flush": True})
    s.audio(PCM, 1, None, WORDS[:1], 0)
    s.audio(PCM, 1, None, WORDS[1:], 0)
    msgs = [m for m in texts(s.actions()) if m["type"] == "alignment"]
    chars = [c for m in msgs for c in m["characters"]]
    assert "".join(chars) == "Hello there, friend."
    starts = [t for m in msgs for t in m["character_start_times_seconds"]]
    assert starts == sorted(starts)


def test_cancel_done_reports_the_audio_and_words_sent() -> None:
    sent: dict[str | None, float] = {None: 0.75, "b": 0.2}
    s = session(sent)
    send(s, {"type": "start", "timestamps": "words", "format": "pcm_s16le_16000"})
    send(s, {"type": "text", "text": "Hello there, friend.", "flush": True})
    send(s, {"type": "text", "text": "Other text.", "flush": True, "context_id": "b"})
    s.audio(PCM, 1, None, WORDS, 0)
    s.audio(PCM, 1, "b", [WordTime("Other", 0.0, 0.3, 0, 5)], 0)
    s.actions()
    out = texts(send(s, {"type": "cancel", "context_id": "b"}))
    assert out[-1]["sent"] == {"audio_s": 0.2, "samples": 3200, "words": 0, "text": ""}
    out = texts(send(s, {"type": "cancel"}))
    done = out[-1]
    assert done["type"] == "done" and "context_id" not in done
    assert done["sent"] == {"audio_s": 0.75, "samples": 12000, "words": 2, "text": "Hello there,"}


def test_a_bad_mode_is_refused_naming_the_choices() -> None:
    s = session({})
    out = texts(send(s, {"type": "start", "timestamps": "phonemes"}))
    assert out[0]["code"] == "invalid_option" and "none, words, chars" in out[0]["message"]
