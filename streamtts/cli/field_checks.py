"""What ``synth`` and ``speak`` say about a request's fields before the model loads.

Errors (exit 2, one line): a blank ``--language``; a field the prompt template does not
write; the text's speaker tags against the ``--speaker`` voices. Warnings: a field the member loaded does not use (its model card's
fields, core/family.py), named with the member and the fields it does read; a language
whose model form is unknown, with the names it may have meant. The member comes from the
config (its model's config.json); loading the model would take many seconds per mistake.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..errors import FieldError, InputError, UsageError

log = logging.getLogger("streamtts")

__all__ = ["check_fields", "check_speaker_tags", "config_of"]

# the flag that sets each field (the fields' own names: request/fields.py, core/family.py)
FLAGS = {
    "instruction": "--instruction", "tokens": "--tokens", "quality": "--quality",
    "sound_event": "--sound-event", "ambient_sound": "--ambient-sound", "language": "--language",
    "reference": "--reference", "speakers": "--speaker", "prefix": "--prefix",
}  # fmt: skip


def config_of(args: argparse.Namespace) -> Any:
    """The command's config (the demo model's without --config), loaded once."""
    cfg = getattr(args, "_config", None)
    if cfg is None:
        from ..config import load_config

        if args.config:
            cfg = load_config(args.config)
        else:
            from ..demo.model import ensure_demo_model

            cfg = load_config(ensure_demo_model())
        args._config = cfg
    return cfg


def check_fields(args: argparse.Namespace) -> None:
    """The field checks that need no text (see the module doc)."""
    from ..config import find_model_config
    from ..core.family import close_languages, known_language, unused_fields
    from ..engine.assemble import model_member
    from ..request.rules import check_language

    try:
        check_language(args.language)
    except FieldError as exc:
        raise UsageError(f"--language {args.language!r}: {exc}") from exc
    cfg = config_of(args)
    m = model_member(find_model_config(cfg))
    _check_template(args, cfg, m)
    given = {f: getattr(args, f, None) for f in FLAGS}
    given["speakers"] = args.speaker or None
    unused = unused_fields(m, given)
    if unused:
        reads = ", ".join(FLAGS.get(f, f) for f in m.fields if f != "text") or "nothing else"
        log.warning(
            "%s: %s (%s) does not read %s: its model card's fields are the text and %s",
            ", ".join(FLAGS[f] for f in unused), m.title, m.kind,
            "this field" if len(unused) == 1 else "these fields", reads,
        )  # fmt: skip
    if args.language and "language" in m.fields and not known_language(args.language):
        close = close_languages(args.language)
        hint = f"did you mean {' or '.join(close)}?" if close else "known: " + _known()
        log.warning("--language %s: not a language streamtts knows; sent as given (%s)", args.language, hint)


def _check_template(args: argparse.Namespace, cfg: Any, m: Any) -> None:
    """A field the prompt template does not write (it would be dropped): the error the
    engine gives after the load (core/prompt.py), given before it."""
    from ..core.prompt import template
    from ..request.rules import check_written

    tmpl = template(cfg.prompt_template or m.template)
    try:
        check_written(tmpl.name, tmpl.fields(), args)
    except FieldError as exc:
        raise UsageError(f"{FLAGS.get(exc.field, '--' + exc.field.replace('_', '-'))}: {exc}") from exc


def _known() -> str:
    from ..core.family import LANGUAGE_NAMES

    return ", ".join(f"{name} ({code})" for code, name in LANGUAGE_NAMES.items())


def check_speaker_tags(args: argparse.Namespace, text: str) -> None:
    """The text's [S1], [S2], ... tags and the --speaker voices match (one line if not)."""
    if not args.speaker:
        return
    from ..config import find_model_config
    from ..core.prompt import template
    from ..core.speakers import check_speakers
    from ..engine.assemble import model_member
    from ..request.voices import speaker_tuple, tagged_text

    cfg = config_of(args)
    # the template the engine will build with (engine/prepare.py): MOSS-TTSD's lets a tag go
    # without a voice (the model invents one)
    tmpl = template(cfg.prompt_template or model_member(find_model_config(cfg)).template)
    try:
        said = tagged_text(text, dict(getattr(args, "speaker_text", None) or ()), getattr(args, "prefix_text", None))
        check_speakers(said, speaker_tuple(dict(args.speaker)), voiceless=tmpl.by_position)
    except (InputError, FieldError) as exc:
        raise UsageError(f"--speaker: {exc}") from exc
