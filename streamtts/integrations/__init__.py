"""Plugins for voice-agent frameworks, clients of ``streamtts serve`` (like ``streamtts.client``).

* :mod:`streamtts.integrations.pipecat`: ``StreamTTSService``, a Pipecat
  ``WebsocketTTSService`` (``pip install 'streamtts[pipecat]'``);
* :mod:`streamtts.integrations.livekit`: ``TTS``, a LiveKit Agents TTS plugin
  (``pip install 'streamtts[livekit]'``).

Each maps the framework's audio contexts / streams to contexts of one WebSocket session
(docs/protocol.md, Contexts): an interruption or ``aclose()`` cancels one context, whose
generation stops before the engine's next step, and the socket stays open for the next turn.
"""

from __future__ import annotations


def missing(extra: str, package: str, exc: ImportError) -> ModuleNotFoundError:
    """The error for a framework that is not installed: which extra brings it."""
    err = ModuleNotFoundError(
        f"streamtts.integrations.{extra} needs {package}: pip install 'streamtts[{extra}]' "
        f"({exc})"
    )
    err.name = exc.name
    return err
