"""The model-files step: files written before the runtime loads a model, by offline tooling.

The demo model (written on first use when no config is given) and the fused-heads GGUF
(written once on first load, next to the backbone) are written by ``convert/`` and ``demo/``,
which rank above the runtime: the engine calls the step through :class:`ModelFiles`, and
``import streamtts`` registers the one that writes them (``streamtts/files.py``). The
runtime reads what the step wrote (:func:`demo_marker`, model/fused.py) and imports no tooling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..core.tokens import TokenIds
    from .fused import AudioDtype

__all__ = ["MARKER", "ModelFiles", "demo_marker", "model_files", "register"]

# what the demo model's folder says it is (written by demo/model.py, read by the runtime)
MARKER = "streamtts-demo.json"


class ModelFiles(Protocol):
    """What the engine asks of the model-files step."""

    def demo_config(self) -> Path:
        """The demo model's config.yaml (written now on first use)."""
        ...

    def fused_gguf(self, cfg: EngineConfig, ids: TokenIds, dtype: AudioDtype) -> str:
        """The fused-heads GGUF for ``cfg`` (found, or written now with a progress display),
        or "" when it cannot be written."""
        ...


_step: ModelFiles | None = None


def register(step: ModelFiles) -> None:
    """Make ``step`` the one the engine calls (``import streamtts`` registers streamtts/files.py's)."""
    global _step
    _step = step


def model_files() -> ModelFiles:
    if _step is None:  # pragma: no cover - `import streamtts` registers it before anything runs
        raise ConfigError("no model-files step is registered (import streamtts first)")
    return _step


def demo_marker(config_path: str | Path) -> dict[str, Any] | None:
    """What the demo model next to ``config_path`` is (preset, seed, ...), or None when the
    config is not a demo model's."""
    try:
        marker = json.loads((Path(config_path).parent / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None
