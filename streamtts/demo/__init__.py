"""Synthetic models in the exact official layout (real ids and file contracts): the tiny demo model, and random quantized ones up to the real size."""
