"""``streamtts voices`` and ``streamtts models``: what a request may name, here or on a server.

Without ``--server`` they read the config (the demo model's without ``--config``) and load no
model: the member and its codebooks, the config's ``voices:`` names. With ``--server URL``
they ask that server (``GET /v1/audio/voices``, ``GET /v1/models``), uploaded voices included.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from typing import Any

from ..errors import UsageError
from .serve import TOKEN_ENV


def add_parser(sub: Any) -> None:
    from .common import add_model_args

    add_voice_parser(sub)
    for name, text in (
        ("voices", "list the voices a request may name (--server: that server's, uploads too)"),
        ("models", "list the model served (--server: that server's)"),
    ):  # and `streamtts voice design` (below)
        p: argparse.ArgumentParser = sub.add_parser(name, help=text, description=__doc__)
        add_model_args(p)
        p.add_argument("--server", help="a server's base URL (default: this machine's config)")
        p.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"the server's --token (or ${TOKEN_ENV})")
        p.add_argument("--json", action="store_true", help="print the listing as JSON")
        p.set_defaults(handler=_voices if name == "voices" else _models, check=_check)


def _check(args: argparse.Namespace) -> None:
    from .common import check_config

    if not args.server:
        check_config(args)


def fetch_json(server: str, path: str, token: str | None, body: Any = None, timeout: float = 30) -> Any:
    """GET ``server`` + ``path`` (POST ``body`` as JSON when given); a refusal or an
    unreachable server is a UsageError naming why."""
    from ..client import http_base

    url = http_base(server) + path
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = exc.reason
        raise UsageError(f"{url}: HTTP {exc.code}: {why}") from exc
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"cannot reach {url}: {reason} (is `streamtts serve` running there?)") from exc


def local_voices(cfg: Any) -> list[dict[str, Any]]:
    """The voices a request to this config's engine may name: the config's ``voices:``
    table, as the server lists them (OpenAI's names without one)."""
    from ..server.voice_names import VoiceNames

    names = VoiceNames(cfg.voices)
    aliases = set(names.aliases())
    out = []
    for name in names.names:
        clip = names.clips.get(name)
        entry = {"id": name, "name": name, "kind": "name",
                 "description": f"a clip: {clip}" if clip else "the model's own voice"}  # fmt: skip
        if name in aliases:
            entry.update(alias_of="default", description="an alias of the model's own voice")
        out.append(entry)
    return out


def _voices(args: argparse.Namespace) -> int:
    if args.server:
        voices = fetch_json(args.server, "/v1/audio/voices", args.token)["voices"]
    else:
        from .common import load_config_or_demo

        voices = local_voices(load_config_or_demo(args.config))
    if args.json:
        print(json.dumps(voices, indent=1))
        return 0
    own = [v["id"] for v in voices if v.get("alias_of")]
    for v in voices:
        if v.get("alias_of"):
            continue  # said once, below
        seconds = f", {v['seconds']:.1f} s" if v.get("seconds") else ""
        label = v["name"] if v.get("kind") in ("uploaded", "designed") and v.get("name") else v["id"]
        ident = f" ({v['id']})" if label != v["id"] else ""
        print(f"{label}{ident}: {v.get('description') or v.get('kind', '')}{seconds}")
    if own:
        print(f"{', '.join(own)}: aliases of default, the model's own voice (the same audio)")
    return 0


def _models(args: argparse.Namespace) -> int:
    if args.server:
        models = fetch_json(args.server, "/v1/models", args.token)["data"]
    else:
        from ..config import find_model_config
        from ..engine.assemble import model_member
        from ..model.files import demo_marker
        from .common import load_config_or_demo

        cfg = load_config_or_demo(args.config)
        m = model_member(find_model_config(cfg))
        models = [{"id": "streamtts", "model_kind": m.kind, "title": m.title, "n_vq": m.n_vq,
                   "name": os.path.basename(cfg.backbone_gguf), "config": cfg.source,
                   "demo": bool(cfg.source and demo_marker(cfg.source))}]  # fmt: skip
    if args.json:
        print(json.dumps(models, indent=1))
        return 0
    for m in models:
        extra = " (the synthetic demo model: random weights)" if m.get("demo") else ""
        if m.get("loaded") is False:
            extra += " (not loaded: its first request loads it)"
        name = f"{m['id']} ({m['name']})" if m.get("name") and len(models) > 1 else m.get("name") or m["id"]
        print(f"{name}: {m.get('model_kind')}, {m.get('n_vq')} codebooks{extra}")
    return 0


def add_voice_parser(sub: Any) -> None:
    """``streamtts voice design DESCRIPTION``: a voice designed on a server (POST /v1/voices/design)."""
    from .say import default_server

    p: argparse.ArgumentParser = sub.add_parser("voice", help="voices on a server: design one from a description")
    cmds = p.add_subparsers(dest="voice_cmd", required=True, metavar="{design}", help="design: a voice from a description")
    d = cmds.add_parser(
        "design", help="design a voice from a description (the server's MOSS-VoiceGenerator) and store it",
        description="The server's MOSS-VoiceGenerator speaks a sample with DESCRIPTION as its instruction; "
        "the audio is stored as a voice that every model of that server can speak with.",
    )
    d.add_argument("description", help='the voice, described, e.g. "a calm, low voice"')
    d.add_argument("--save", metavar="NAME", default="", help="the name requests may use for it (--voice NAME)")
    d.add_argument("--text", help="what the sample says (default: a sentence of the server's)")
    d.add_argument("--model", help="which VoiceGenerator, when the server serves several")
    d.add_argument("--seed", type=int, help="sampling seed (the same seed and description: the same voice)")
    d.add_argument("--server", default=default_server(), help="the server's base URL")
    d.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"the server's --token (or ${TOKEN_ENV})")
    d.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    d.set_defaults(handler=_design, check=_check_design)


def _check_design(args: argparse.Namespace) -> None:
    if not args.description.strip():
        raise UsageError("DESCRIPTION is empty: describe the voice, e.g. \"a calm, low voice\"")


def _design(args: argparse.Namespace) -> int:
    body = {"description": args.description, "name": args.save, "text": args.text, "model": args.model, "seed": args.seed}
    got = fetch_json(args.server, "/v1/voices/design", args.token, {k: v for k, v in body.items() if v not in (None, "")}, timeout=600)
    if args.json:
        print(json.dumps(got, indent=1))
        return 0
    name = f" as {got['name']!r}" if got.get("name") else ""
    print(f"designed voice {got['voice_id']}{name} ({got['seconds']:.1f} s, by {got['model']}): "
          f"use it with --voice {got.get('name') or got['voice_id']}")  # fmt: skip
    return 0
