"""The per-step kernels: each a NumPy specification and, optionally, its compiled twin."""
