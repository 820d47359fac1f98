"""``synth`` / ``speak`` ``--voice NAME``: a voice by name, as a server's requests name them.

Where a name is looked for, before the model loads:

1. the config's ``voices:`` table (``streamtts voices`` lists it): a clip becomes the
   reference; a name of the model's own voice (``default``, and OpenAI's names without a
   table) means no reference;
2. the shared voice store, when ``$STREAMTTS_VOICE_STORE`` names one (``redis://...``): the
   voice an upload gave that name (or a voice id);
3. else one line saying where the name was looked for and what there is instead.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import UsageError
from .serve import VOICE_STORE_ENV

__all__ = ["resolve_voice_flag", "stored_voice"]


def resolve_voice_flag(args: argparse.Namespace) -> None:
    """``--voice``: sets ``args.reference`` to a configured clip, or ``args.stored_voice`` to
    the voice fetched from the shared store; a name found nowhere is a UsageError listing
    the voices."""
    from ..server.voice_names import VoiceNames

    args.voice_store = None
    name = args.voice
    if name is None:
        return
    if args.reference or args.speaker:
        raise UsageError("--voice and --reference/--speaker: give the voice one way")
    from .field_checks import config_of

    names = VoiceNames(config_of(args).voices)
    if name in names.own:
        return  # the model's own voice: no reference
    if name in names.clips:
        args.reference = names.clips[name]
        return
    store = os.environ.get(VOICE_STORE_ENV, "memory")
    if store != "memory":
        import asyncio

        args.voice_store = store
        args.stored_voice = asyncio.run(stored_voice(args))  # before the model loads
        return
    raise UsageError(
        f"--voice {name}: no voice of that name here; there are: {names.summary()}. "
        f"A voice uploaded to a server is spoken there: streamtts say --server URL --voice {name} "
        f"(streamtts voices --server URL lists them); or share a store: ${VOICE_STORE_ENV}=redis://HOST:6379/0"
    )


async def stored_voice(args: argparse.Namespace) -> Any:
    """The voice ``--voice`` names in the shared store (UsageError when it holds none)."""
    from ..server.voice_store import VoiceStoreSettings, redact_url
    from ..server.voices import is_voice_id, open_shared_voices

    shared = open_shared_voices(VoiceStoreSettings(url=args.voice_store).validate())
    if shared is None:  # pragma: no cover - resolve_voice_flag set a store URL
        raise UsageError(f"--voice {args.voice}: no voice store")
    try:
        vid = args.voice if is_voice_id(args.voice) else await shared.find_name(args.voice)
        voice = await shared.load(vid) if vid is not None else None
    finally:
        await shared.aclose()
    if voice is None:
        raise UsageError(
            f"--voice {args.voice}: the voice store {redact_url(args.voice_store)} holds no voice of that name "
            "(upload it to a server that uses the store: POST /v1/voices?name=NAME)"
        )
    return voice
