"""The model: the llama.cpp bridge (ctypes), the backbone, the npy tables, the fused-heads GGUF,
and fetching the weights."""
