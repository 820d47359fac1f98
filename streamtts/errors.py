"""One exception tree for the whole package.

Every error a user can cause names what was wrong. Errors raised while
handling another keep the original as ``__cause__`` (``raise ... from exc``).
"""

from __future__ import annotations


class StreamTTSError(Exception):
    """Base class of every error streamtts raises on purpose."""


# -- configuration and model files ---------------------------------------------------


class ConfigError(StreamTTSError, ValueError):
    """A configuration value is missing, of the wrong type, or out of range."""


class ModelFileError(ConfigError):
    """A model file is missing or malformed.

    ``path`` is the offending file; ``expected`` says what should have been there.
    """

    def __init__(self, path: object, expected: str, problem: str = "") -> None:
        self.path = str(path)
        self.expected = expected
        self.problem = problem
        msg = f"{self.path}: expected {expected}"
        if problem:
            msg += f" ({problem})"
        super().__init__(msg)


class NativeLibraryError(StreamTTSError):
    """The llama.cpp bridge library is missing or could not be loaded."""


# -- runtime ------------------------------------------------------------------------


class BackboneError(StreamTTSError):
    """llama.cpp (through the bridge) returned an error code."""

    def __init__(self, op: str, code: int, message: str = "") -> None:
        self.op = op
        self.code = code
        self.detail = message
        text = f"{op} failed with code {code}"
        if message:
            text += f": {message}"
        super().__init__(text)


class CodecError(StreamTTSError):
    """The audio codec (encoder or decoder) failed or was given bad codes."""


class GenerationError(StreamTTSError):
    """Generation of one stream failed; the cause is chained."""


class EngineClosedError(StreamTTSError):
    """The engine was closed (or never started) when a request arrived."""


class OverloadedError(StreamTTSError):
    """All stream slots are busy and the waiting queue is full."""


class QueueTimeoutError(OverloadedError):
    """A request waited in the queue longer than its timeout."""


# -- bad user input -----------------------------------------------------------------


class InputError(StreamTTSError, ValueError):
    """A request's input is unusable (empty text, bad option, ...)."""


class PromptTooLongError(InputError):
    """The prompt (text plus reference voice) does not fit the context."""


class ReferenceAudioError(InputError):
    """A reference voice clip could not be read or is unusable."""
