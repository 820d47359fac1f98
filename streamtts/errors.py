"""One exception tree for the whole package.

Every error a user can cause names what was wrong. Errors raised while
handling another keep the original as ``__cause__`` (``raise ... from exc``).

    StreamTTSError
    ├── ConfigError (ValueError)         a config value missing, of the wrong type or out of range
    │   └── ModelFileError               a model file missing or malformed (.path, .expected)
    ├── DownloadError                    weights could not be fetched
    ├── NativeLibraryError               the llama.cpp bridge is missing or did not load
    ├── BackboneError                    llama.cpp returned an error code (.op, .code)
    ├── CodecError                       the audio codec failed or was given bad codes
    ├── GenerationError                  one stream's generation failed (cause chained)
    │   └── NonFiniteLogitsError         a row had nothing finite to sample (.rows)
    ├── EngineClosedError                the engine is closed or not started
    ├── ModelLoadError                   a served model could not be loaded on demand (.model_id)
    ├── OverloadedError                  every slot busy and the queue full
    │   └── QueueTimeoutError            waited in the queue past its timeout
    ├── InputError (ValueError)          a request's input is unusable
    │   ├── FieldError                   a request field broke a rule (.field: as the request spells it)
    │   ├── PromptTooLongError           text + reference do not fit the context
    │   ├── ReferenceAudioError          a reference clip could not be read or used
    │   └── UsageError                   a command-line argument is unusable (missing file or folder,
    │                                    unknown extension, taken port): the message says what to change
    ├── PlaybackError                    no sound device, PortAudio missing, device failed
    ├── ServerError                      a server refused or ended a client's session (.code)
    └── VoiceStoreUnavailableError       the shared voice store (Redis) cannot be reached
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _message(head: str, detail: str, form: str) -> str:
    """An error's message: ``head``, then ``detail`` set in ``form`` when there is one."""
    return head + form.format(detail) if detail else head


class StreamTTSError(Exception):
    """Base class of every error streamtts raises on purpose."""


# -- configuration and model files ---------------------------------------------------


class ConfigError(StreamTTSError, ValueError):
    """A configuration value is missing, of the wrong type, or out of range."""


class SamplingError(ConfigError):
    """A sampling value out of range; ``field`` names it (so a CLI can name its flag and an
    HTTP error its ``param``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ModelFileError(ConfigError):
    """A model file is missing or malformed.

    ``path`` is the offending file; ``expected`` says what should have been there.
    """

    def __init__(self, path: object, expected: str, problem: str = "") -> None:
        self.path = str(path)
        self.expected = expected
        self.problem = problem
        super().__init__(_message(f"{self.path}: expected {expected}", problem, " ({})"))


class DownloadError(StreamTTSError):
    """The weights could not be fetched (network, hub, missing huggingface_hub)."""


class NativeLibraryError(StreamTTSError):
    """The llama.cpp bridge library is missing or could not be loaded."""


class DeviceMemoryError(ConfigError):
    """The backbone does not fit in the memory of the device its layers were to go to."""


# -- runtime ------------------------------------------------------------------------


class BackboneError(StreamTTSError):
    """llama.cpp (through the bridge) returned an error code."""

    def __init__(self, op: str, code: int, message: str = "") -> None:
        self.op = op
        self.code = code
        self.detail = message
        super().__init__(_message(f"{op} failed with code {code}", message, ": {}"))


class CodecError(StreamTTSError):
    """The audio codec (encoder or decoder) failed or was given bad codes."""


class GenerationError(StreamTTSError):
    """Generation of one stream failed; the cause is chained."""


class NonFiniteLogitsError(GenerationError):
    """A row had no finite candidate (NaN / +inf logits, or every token masked).

    ``rows`` are the offending rows of the call, as positions in its selection
    (``DelayStates.step`` re-raises with stream slot numbers).
    """

    def __init__(self, rows: Sequence[int] | Any, what: str = "rows") -> None:
        self.rows = tuple(int(r) for r in rows)
        super().__init__(
            f"non-finite logits (NaN or inf: the backbone's arithmetic overflowed, e.g. float16 for a "
            f"model whose activations exceed it) or nothing left to sample in {what} {list(self.rows)}"
        )


class EngineClosedError(StreamTTSError):
    """The engine was closed (or never started) when a request arrived."""


class ModelLoadError(StreamTTSError):
    """A server's model could not be loaded for a request (the cause chained); the request
    fails, the server and its other models stay up."""

    def __init__(self, model_id: str, cause: BaseException) -> None:
        super().__init__(f"model {model_id!r} could not be loaded: {cause}")
        self.model_id = model_id


class OverloadedError(StreamTTSError):
    """All stream slots are busy and the waiting queue is full, or (admission by capacity)
    a slot is not expected to free before the request's first-audio deadline."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # when to try again, from the measured finish rate


class QueueTimeoutError(OverloadedError):
    """A request waited in the queue longer than its timeout."""


# -- bad user input -----------------------------------------------------------------


class InputError(StreamTTSError, ValueError):
    """A request's input is unusable (empty text, bad option, ...)."""


class FieldError(InputError):
    """A request field broke one of its rules (streamtts/request/rules.py); ``field`` names it
    as the request spells it (``tokens``, ``sampling.text_top_p``, ``speakers``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PromptTooLongError(InputError):
    """The prompt (text plus reference voice) does not fit the context."""


class ReferenceAudioError(InputError):
    """A reference voice clip could not be read or is unusable."""


class UsageError(InputError):
    """A command-line argument is unusable: a missing file or folder, an unknown output
    extension, a port in use. Raised before anything expensive runs; the message names the
    argument and the next step."""


# -- applications -------------------------------------------------------------------


class PlaybackError(StreamTTSError):
    """Audio could not be played: no device, PortAudio missing, the device failed, ...

    Errors from opening the device are raised before the chunk iterator is touched, so a caller
    can catch this and fall back to writing a file. ``reason`` is what went wrong; the message
    adds ``hint`` (what to do instead), which a caller that already does it leaves out.
    """

    def __init__(self, reason: str, hint: str = "") -> None:
        self.reason = reason
        self.hint = hint
        super().__init__(_message(reason, hint, "; {}"))


class ServerError(StreamTTSError):
    """The server refused or ended the session with an error."""

    def __init__(self, code: str, message: str, close_code: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.close_code = close_code


class VoiceStoreUnavailableError(StreamTTSError):
    """The shared voice store (Redis) could not be reached or answered with an error.

    The server answers uploads and lookups of voices it does not hold locally with
    ``voice_store_unavailable`` (HTTP 503) until the store is back; synthesis without a stored
    voice is unaffected.
    """
