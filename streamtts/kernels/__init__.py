"""The per-step kernels: each a NumPy specification and, optionally, its compiled twin, chosen once in :class:`Kernels`."""

from .registry import TABLE, Kernels, select_twins
from .spec import SpecDelayStep, SpecFramePush, SpecStepEmbed

__all__ = ["TABLE", "Kernels", "SpecDelayStep", "SpecFramePush", "SpecStepEmbed", "select_twins"]
