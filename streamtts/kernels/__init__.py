"""The per-step kernels: each a NumPy specification and, optionally, its compiled twin, chosen once in :class:`Kernels`."""

from .registry import TABLE, Kernels, select_twins

__all__ = ["TABLE", "Kernels", "select_twins"]
