"""Pure core: the delay state machine, prompt builder, sampling. NumPy only: no threads,
ctypes, ONNX Runtime or asyncio (tests/test_layers.py checks the imports)."""
