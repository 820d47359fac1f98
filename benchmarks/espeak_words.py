"""eSpeak NG speaking a sentence, with its own word boundaries (the reference for the word
timing benchmark and test). ``libespeak-ng`` through ctypes, synchronous mode: the synth
callback hands over the samples and the events; each WORD event carries its character
position in the text and its sample position in the audio."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["EspeakWord", "available", "speak"]

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_CHARS_UTF8 = 1


class _Event(ctypes.Structure):
    # espeak_EVENT of speak_lib.h
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # characters from the start of the text, 1-based
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms
        ("sample", ctypes.c_int),  # samples from the start of the output
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_void_p),
    ]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass(frozen=True, slots=True)
class EspeakWord:
    char: int  # 0-based position of the word's first character in the text
    length: int
    start: float  # seconds


class _Espeak:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.sample_rate = int(lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0))
        if self.sample_rate <= 0:
            raise RuntimeError("espeak_Initialize failed (is espeak-ng-data installed?)")
        self._pcm: list[npt.NDArray[np.int16]] = []
        self._events: list[tuple[int, int, int]] = []
        self._cb = _CALLBACK(self._on_synth)  # kept alive as long as the library may call it
        lib.espeak_SetSynthCallback(self._cb)
        self.lock = threading.Lock()
        self._voice = ""

    def _on_synth(self, wav: ctypes._Pointer[ctypes.c_short], n: int, events: ctypes._Pointer[_Event]) -> int:
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            e = events[i]
            if e.type == _EVENT_WORD:
                self._events.append((e.text_position - 1, e.length, e.sample))
            i += 1
        if n > 0 and wav:
            self._pcm.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    def speak(self, text: str, voice: str) -> tuple[npt.NDArray[np.float32], list[EspeakWord]]:
        with self.lock:
            if voice != self._voice:
                if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                    raise ValueError(f"espeak-ng has no voice {voice!r}")
                self._voice = voice
                self._synth(text)  # the first utterance after a voice change comes out different
            return self._synth(text)

    def _synth(self, text: str) -> tuple[npt.NDArray[np.float32], list[EspeakWord]]:
        self._pcm, self._events = [], []
        data = text.encode("utf-8")
        self.lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
        self.lib.espeak_Synchronize()
        pcm = np.concatenate(self._pcm).astype(np.float32) / 32768.0
        words = [EspeakWord(c, n, s / self.sample_rate) for c, n, s in self._events if n > 0]
        return pcm, words


_ENGINE: _Espeak | None = None


def _engine() -> _Espeak | None:
    global _ENGINE
    if _ENGINE is None:
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            return None
        _ENGINE = _Espeak(lib)
    return _ENGINE


def available() -> bool:
    """libespeak-ng can be loaded (Debian: apt-get install espeak-ng)."""
    return _engine() is not None


def speak(text: str, voice: str = "en") -> tuple[npt.NDArray[np.float32], int, list[EspeakWord]]:
    """(samples float32, sample rate, espeak's words) for ``text`` in ``voice`` (en, cmn, ...)."""
    eng = _engine()
    if eng is None:
        raise RuntimeError("libespeak-ng is not installed (apt-get install espeak-ng)")
    pcm, words = eng.speak(text, voice)
    return pcm, eng.sample_rate, words
