"""The model-files step (model/files.py) that ``import streamtts`` registers: the demo model
and the fused-heads GGUF written by the offline tooling (demo/, convert/), imported only when
a file is to be written, so ``import streamtts`` stays light."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import EngineConfig
    from .core.tokens import TokenIds
    from .model.fused import AudioDtype

__all__ = ["WrittenFiles"]


class WrittenFiles:
    """:class:`~streamtts.model.files.ModelFiles` that writes what is missing."""

    def demo_config(self) -> Path:
        from .demo.model import ensure_demo_model

        return Path(ensure_demo_model())

    def fused_gguf(self, cfg: EngineConfig, ids: TokenIds, dtype: AudioDtype) -> str:
        from .convert.fused_writer import ensure_fused
        from .engine.fuse_progress import FuseProgress

        with FuseProgress() as progress:
            return ensure_fused(cfg, ids, dtype, progress)
