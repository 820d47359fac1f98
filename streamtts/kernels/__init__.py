"""The per-step kernels: each a NumPy specification and, optionally, its compiled twin, chosen once in :class:`Kernels`."""

from ..config import select_twins
from .registry import TABLE, Kernels
from .spec import SpecDelayStep, SpecFramePush, SpecStepEmbed

__all__ = ["TABLE", "Kernels", "SpecDelayStep", "SpecFramePush", "SpecStepEmbed", "select_twins"]
