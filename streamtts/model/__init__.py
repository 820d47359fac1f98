"""Runtime: the llama.cpp bridge (ctypes), the backbone, the npy tables, the fused-heads file format."""
