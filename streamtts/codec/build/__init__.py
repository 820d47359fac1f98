"""Offline tooling: the codec decoder's ONNX graphs and TensorRT engines, built from its checkpoint."""
