"""A server config file naming several models: ``serve --config server.yaml`` where the YAML
has a ``models:`` map (id -> engine config file), instead of one engine config::

    models:                     # the first is the default
      tts: weights/tts.yaml
      dialog: weights/ttsd.yaml
    on_demand: true             # optional: only the first loads at start
    idle_unload: 600            # optional: seconds before an unused model is unloaded

Relative paths resolve against this file's folder. The command line's ``--on-demand`` and
``--idle-unload`` win over the file's.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml

from ..errors import ConfigError

__all__ = ["ModelsFile", "read_models_file"]


class ModelsFile(msgspec.Struct, forbid_unknown_fields=True):
    models: dict[str, str]
    on_demand: bool = False
    idle_unload: float | None = None


def read_models_file(path: str | Path) -> ModelsFile | None:
    """The file's model set, or None when it is a plain engine config (no ``models:`` key)."""
    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the engine config's loader says what is wrong with it
    if not isinstance(data, dict) or "models" not in data:
        return None
    try:
        f = msgspec.convert(data, ModelsFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{p}: a server config (it has `models:`): {exc}") from exc
    if not f.models:
        raise ConfigError(f"{p}: `models:` is empty: name at least one model (id: engine config file)")
    base = p.resolve().parent
    f.models = {mid: str(base / cfg) for mid, cfg in f.models.items()}
    return f
